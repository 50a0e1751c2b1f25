package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// DefaultMachineLogsMaxBytes is Config.MachineLogsMaxBytes's default.
const DefaultMachineLogsMaxBytes = 1 << 30

// machineLogDir is one Instance's kept log tails.
type machineLogDir struct {
	path   string
	bytes  int64
	newest time.Time
}

// pruneMachineLogs keeps machine-logs/ within max bytes: whole Instance
// directories go, the one whose newest file is oldest first. keep (the
// Instance whose logs were just copied) is never removed. It returns how
// many directories and bytes went.
func pruneMachineLogs(root string, max int64, keep string) (removed int, freed int64, err error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, nil
		}
		return 0, 0, err
	}
	var dirs []machineLogDir
	var total int64
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := machineLogDir{path: filepath.Join(root, e.Name())}
		files, err := os.ReadDir(d.path)
		if err != nil {
			continue
		}
		for _, f := range files {
			fi, err := f.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			d.bytes += fi.Size()
			if fi.ModTime().After(d.newest) {
				d.newest = fi.ModTime()
			}
		}
		total += d.bytes
		dirs = append(dirs, d)
	}
	// Oldest first; ties by name, so the order does not depend on the
	// directory listing.
	slices.SortFunc(dirs, func(a, b machineLogDir) int {
		if c := a.newest.Compare(b.newest); c != 0 {
			return c
		}
		return strings.Compare(a.path, b.path)
	})
	var errs []error
	for _, d := range dirs {
		if total <= max {
			break
		}
		if filepath.Base(d.path) == keep {
			continue
		}
		if err := os.RemoveAll(d.path); err != nil {
			errs = append(errs, err)
			continue
		}
		total -= d.bytes
		freed += d.bytes
		removed++
	}
	return removed, freed, errors.Join(errs...)
}

// keepMachineLogsWithinQuota prunes after keep's logs were copied (or at
// open, keep ""), and logs what went.
func (rt *Runtime) keepMachineLogsWithinQuota(keep string) {
	removed, freed, err := pruneMachineLogs(rt.logsDir, rt.cfg.MachineLogsMaxBytes, keep)
	if removed > 0 {
		rt.log.Info("machine logs pruned", "removed_instances", removed, "freed_bytes", freed, "max_bytes", rt.cfg.MachineLogsMaxBytes)
	}
	if err != nil {
		rt.log.Warn("machine logs not all pruned", "err", err)
	}
}

// ErrNoMachineLog: the node neither holds the Instance nor keeps its log
// tails (it never ran here, or the quota pruned them).
var ErrNoMachineLog = errors.New("no machine log on this node")

// MachineLog is what the node has of one Instance's logs.
type MachineLog struct {
	// Live: read from the Instance the node holds; else from the tails
	// kept in machine-logs/ when it was removed.
	Live bool
	// Running: the Instance is starting or running (its console may
	// grow).
	Running      bool
	Console, VMM LogTail
	// Cursor is where the live console read ended (zero for kept tails):
	// a read from it returns only what the guest wrote after.
	Cursor ConsoleCursor
}

// LogTail is the end of one log.
type LogTail struct {
	Data []byte
	// Truncated: the log holds more than Data before it (or, read from a
	// cursor, more was written since than was returned).
	Truncated bool
}

// ReadMachineLog returns the last max bytes of an Instance's console and
// VMM logs: the live files while the node holds the Instance, else the
// tails it kept. From a cursor of an earlier read, the console part is
// only what came after it. id names a directory, so it must be an
// Instance id (idRE: no separators, no dots).
func (rt *Runtime) ReadMachineLog(id string, from ConsoleCursor, max int64) (MachineLog, error) {
	if !idRE.MatchString(id) {
		return MachineLog{}, fmt.Errorf("runtime: machine log of %q: not an Instance id", id)
	}
	if max < 1 {
		return MachineLog{}, fmt.Errorf("runtime: machine log of instance %s: read %d bytes: want at least 1", id, max)
	}
	rt.mu.Lock()
	in := rt.instances[id]
	rt.mu.Unlock()
	var running bool
	if in != nil {
		in.mu.Lock()
		running = in.state == StateStarting || in.state == StateRunning
		in.mu.Unlock()
		l, err := readMachineLog(in.paths.Console, in.paths.VMMLog, from, max)
		l.Live, l.Running = true, running
		if !errors.Is(err, ErrNoMachineLog) {
			return l, err
		}
		// Not written yet, or removed meanwhile (its tails are kept by now).
	}
	dir := filepath.Join(rt.logsDir, id)
	l, err := readMachineLog(filepath.Join(dir, "console.log"), filepath.Join(dir, "vmm.log"), ConsoleCursor{}, max)
	if errors.Is(err, ErrNoMachineLog) && in != nil {
		return MachineLog{Live: true, Running: running}, nil
	}
	l.Cursor = ConsoleCursor{} // a copy: nothing is appended to it
	return l, err
}

// readMachineLog reads both logs; ErrNoMachineLog when neither exists.
func readMachineLog(console, vmm string, from ConsoleCursor, max int64) (MachineLog, error) {
	var l MachineLog
	var err error
	l.Console.Data, l.Console.Truncated, l.Cursor, err = readConsoleSince(console, from, max)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return l, fmt.Errorf("runtime: %w", err)
	}
	// One byte more than asked tells whether there is more.
	b, err := readTail(vmm, max+1)
	if errors.Is(err, fs.ErrNotExist) {
		if missing {
			return l, ErrNoMachineLog
		}
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("runtime: %w", err)
	}
	if int64(len(b)) > max {
		b, l.VMM.Truncated = b[int64(len(b))-max:], true
	}
	l.VMM.Data = b
	return l, nil
}
