package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CheckServiceCgroup is the node's start-up check under systemd: the
// member's service cgroup must hold only this process (and its threads'
// process). A leftover process of an earlier node — one systemd failed to
// kill, or one started by hand — could still be writing the same state, so
// start-up stops and names it instead of guessing. cgroupRoot is the
// cgroup2 mount, procSelfCgroup the content of /proc/self/cgroup.
func CheckServiceCgroup(cgroupRoot, procSelfCgroup string, self int) error {
	rel := ""
	for _, line := range strings.Split(strings.TrimSpace(procSelfCgroup), "\n") {
		if strings.HasPrefix(line, "0::") {
			rel = strings.TrimPrefix(line, "0::")
		}
	}
	if rel == "" || rel == "/" || !strings.HasSuffix(rel, ".service") {
		return nil // not in a service of its own (a shell, a test, kibotos dev)
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
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		others = append(others, fmt.Sprintf("%d (%s)", pid, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
	}
	if len(others) > 0 {
		return fmt.Errorf("start-up check: service cgroup %s still holds other processes: %s; stop them (systemctl stop %s kills the whole cgroup) and start again",
			rel, strings.Join(others, ", "), filepath.Base(rel))
	}
	return nil
}
