package egress

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// CheckUnprivileged refuses a process that runs as root or holds any
// capability: the egress process carries guests' traffic with caller
// credentials, and the node made every socket that needs privileges, so
// privileges could only be abused. The production unit runs it as
// kibotos-egress with an empty capability set.
func CheckUnprivileged() error {
	if os.Geteuid() == 0 || os.Getuid() == 0 {
		return fmt.Errorf("egress: running as root: run it as the kibotos-egress user (tests pass --allow-root)")
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return fmt.Errorf("egress: read own capabilities: %w", err)
	}
	defer f.Close()
	return checkCaps(io.LimitReader(f, 64<<10))
}

// checkCaps fails when a capability set in a /proc/PID/status is not empty.
func checkCaps(r io.Reader) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch k {
		case "CapEff", "CapPrm", "CapAmb":
			if strings.Trim(strings.TrimSpace(v), "0") != "" {
				return fmt.Errorf("egress: the process holds capabilities (%s %s): run it without any (CapabilityBoundingSet= empty, NoNewPrivileges=yes)", k, strings.TrimSpace(v))
			}
		}
	}
	return sc.Err()
}
