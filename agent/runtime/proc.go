package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// procStartTime is field 22 of /proc/<pid>/stat: the start time in clock
// ticks since boot, which tells a process from a later one reusing its PID.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no comm field", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// procEnded reports whether the process that started at start as host PID
// pid has ended: gone, its PID reused, or a zombie not reaped yet (whose
// /proc entry still answers but whose executable link is gone).
func procEnded(pid int, start uint64) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if i < 0 || len(f) < 20 {
		return false
	}
	if st, err := strconv.ParseUint(f[19], 10, 64); err == nil && st != start {
		return true
	}
	return f[0] == "Z" || f[0] == "X"
}

// procExe is the executable of pid: its path and dev:ino. The link is
// read between two looks at its dev:ino, and the path it names must be
// that file (unless the file was deleted since the exec): a process that
// execs meanwhile (the log wrapper becoming the VMM) would otherwise
// pair one binary's path with the other's dev:ino. An exec happens once
// per launch, so the retries only ever cover a process that keeps
// exec'ing.
func procExe(pid int) (path string, dev, ino uint64, err error) {
	link := "/proc/" + strconv.Itoa(pid) + "/exe"
	for range 100 {
		var before, after syscall.Stat_t
		if err := syscall.Stat(link, &before); err != nil {
			return "", 0, 0, err
		}
		if path, err = os.Readlink(link); err != nil {
			return "", 0, 0, err
		}
		if err := syscall.Stat(link, &after); err != nil {
			return "", 0, 0, err
		}
		same := before.Dev == after.Dev && before.Ino == after.Ino
		if same && strings.HasSuffix(path, deletedSuffix) {
			return path, after.Dev, after.Ino, nil
		}
		if d, i, err := fileID(path); same && err == nil && d == after.Dev && i == after.Ino {
			return path, after.Dev, after.Ino, nil
		}
	}
	return "", 0, 0, fmt.Errorf("%s: the process keeps executing other binaries", link)
}

// deletedSuffix ends /proc/<pid>/exe of a process whose executable has
// been unlinked since it was exec'd.
const deletedSuffix = " (deleted)"

// fileID is the dev:ino of a file.
func fileID(path string) (dev, ino uint64, err error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, 0, err
	}
	return st.Dev, st.Ino, nil
}

// procUID is the real uid of pid (the Uid: line of /proc/<pid>/status).
func procUID(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no Uid line", pid)
}

// procCommand is the command line of pid, for messages; "" when it has
// none to read (gone, or a kernel thread).
func procCommand(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}
