package runtime

import (
	"errors"
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
