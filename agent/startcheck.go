package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/vmm/units"
)

// CheckServiceCgroup is the node's start-up check under systemd, before it
// takes the data directory's lock. First its own MainPID: the service's
// main process must be this one, so that systemd's view (restart on
// failure, stop, the MainPID a takeover or an operator reads) is this
// member and not a wrapper around it or a process started inside the
// service's cgroup by other means. Then the cgroup: it must hold only this
// process. A leftover process of an earlier node — one systemd failed to
// kill, or one started by hand — could still be writing the same state, so
// start-up stops and names it instead of guessing. cgroupRoot is the
// cgroup2 mount, procSelfCgroup the content of /proc/self/cgroup, mainPID
// asks systemd for a unit's MainPID (0: none).
func CheckServiceCgroup(cgroupRoot, procSelfCgroup string, self int, mainPID func(unit string) (int, error)) error {
	rel := units.Cgroup2Path(procSelfCgroup)
	if rel == "" || rel == "/" || !strings.HasSuffix(rel, ".service") {
		return nil // not in a service of its own (a shell, a test, kibotos dev)
	}
	unit := filepath.Base(rel)
	main, err := mainPID(unit)
	if err != nil {
		return fmt.Errorf("start-up check: read the MainPID of %s from systemd: %w; start the member with systemctl start %s on a running systemd", unit, err, unit)
	}
	if main != self {
		return fmt.Errorf("start-up check: %s has MainPID %d%s, not this process %d: run kibotos serve as the service's main process (ExecStart=/usr/bin/kibotos serve ..., no wrapper that stays) and start it with systemctl start %s",
			unit, main, describe(main), self, unit)
	}
	path := filepath.Join(cgroupRoot, rel, "cgroup.procs")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("start-up check: read %s: %w", path, err)
	}
	var others []string
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid == self {
			continue
		}
		others = append(others, fmt.Sprintf("%d%s", pid, describe(pid)))
	}
	if len(others) > 0 {
		return fmt.Errorf("start-up check: service cgroup %s still holds other processes: %s; stop them (systemctl stop %s kills the whole cgroup) and start again",
			rel, strings.Join(others, ", "), filepath.Base(rel))
	}
	return nil
}

// describe is " (<command line>)" of a process, or "" when it has none to read.
func describe(pid int) string {
	if pid <= 0 {
		return ""
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(cmd) == 0 {
		return ""
	}
	return " (" + strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")) + ")"
}
