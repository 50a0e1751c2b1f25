package units

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cgroup2Mount finds the host's cgroup2 mount: /sys/fs/cgroup on a unified
// host, /sys/fs/cgroup/unified on a hybrid one.
func Cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("units: find the cgroup2 mount: %w", err)
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				found = append(found, fields[4])
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("units: find the cgroup2 mount: %w", err)
	}
	for _, p := range found {
		if p == "/sys/fs/cgroup" {
			return p, nil
		}
	}
	if len(found) == 0 {
		return "", errors.New("units: no cgroup2 filesystem is mounted on this host: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified)")
	}
	return found[0], nil
}

// Cgroup2Path is the cgroup2 path in the content of a /proc/<pid>/cgroup
// file (its "0::" line), relative to the cgroup2 mount of the reader's
// cgroup namespace; "" when the process is in no cgroup2 hierarchy.
func Cgroup2Path(procCgroup string) string {
	for _, line := range strings.Split(strings.TrimSpace(procCgroup), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return rel
		}
	}
	return ""
}

// Process is one process of a unit.
type Process struct {
	HostPID int
	// PID is the PID in the manager's PID namespace (what MainPID refers to);
	// 0 if the process is not visible there.
	PID int
}

// CgroupPath is the host path of a unit's cgroup.
func (m *Manager) CgroupPath(u Unit) string {
	return filepath.Join(m.target.CgroupRoot, filepath.FromSlash(u.ControlGroup))
}

// Processes lists the processes in the unit's cgroup (and any sub-cgroup) as
// seen from the host. A cgroup that no longer exists has no processes.
func (m *Manager) Processes(u Unit) ([]Process, error) {
	if u.ControlGroup == "" {
		return nil, nil
	}
	pids, err := CgroupPIDs(m.CgroupPath(u))
	if err != nil {
		return nil, fmt.Errorf("units: processes of unit %s: %w", u.Name, err)
	}
	out := make([]Process, 0, len(pids))
	for _, pid := range pids {
		p := Process{HostPID: pid}
		if ns, err := readNSpid(pid); err == nil && len(ns) > m.pidLevel {
			p.PID = ns[m.pidLevel]
		}
		out = append(out, p)
	}
	return out, nil
}

// MainHostPID maps the unit's MainPID to a host PID through its cgroup.
func (m *Manager) MainHostPID(u Unit) (int, error) {
	if u.MainPID == 0 {
		return 0, fmt.Errorf("units: unit %s has no main process (state %s)", u.Name, u.ActiveState)
	}
	ps, err := m.Processes(u)
	if err != nil {
		return 0, err
	}
	for _, p := range ps {
		if p.PID == int(u.MainPID) {
			return p.HostPID, nil
		}
	}
	return 0, fmt.Errorf("units: main PID %d of unit %s is not in its cgroup %s (it exited?)", u.MainPID, u.Name, m.CgroupPath(u))
}

// CgroupPIDs lists the host PIDs in the cgroup directory dir and all its
// descendants. A cgroup that is gone (or goes while we read) has none.
func CgroupPIDs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walk: no processes there
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errNoDevice) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

// readNSpid returns the NSpid line of /proc/<pid>/status: the PID in each
// PID namespace from ours (index 0) down to the process's own.
func readNSpid(pid int) ([]int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		var out []int
		for _, f := range strings.Fields(rest) {
			n, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("parse NSpid of %d: %w", pid, err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	return nil, fmt.Errorf("no NSpid in /proc/%d/status", pid)
}

// procStart is the start time (clock ticks since boot) of a process, used to
// tell a process from a later one that reuses its PID. 0 if it is gone.
func procStart(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	// fields after "pid (comm)": state is field 3, starttime field 22.
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// RemoveCgroup removes a cgroup directory and its children, deepest first
// (cgroup directories go with rmdir only); an absent one is fine.
func RemoveCgroup(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for k := len(dirs) - 1; k >= 0; k-- {
		if err := unix.Rmdir(dirs[k]); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("rmdir %s: %w", dirs[k], err)
		}
	}
	return nil
}

// StartInCgroup starts cmd straight in the cgroup directory dir (clone3
// with CLONE_INTO_CGROUP): with CLONE_NEWCGROUP in its clone flags, that
// cgroup is the root of its cgroup namespace. cmd.SysProcAttr must be set.
func StartInCgroup(cmd *exec.Cmd, dir string) error {
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	defer unix.Close(fd)
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	return cmd.Start()
}
