package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckServiceCgroup(t *testing.T) {
	root := t.TempDir()
	svc := filepath.Join(root, "system.slice", "kibotos.service")
	os.MkdirAll(svc, 0o755)
	write := func(pids string) { os.WriteFile(filepath.Join(svc, "cgroup.procs"), []byte(pids), 0o644) }
	self := "0::/system.slice/kibotos.service\n"

	var asked []string
	mainPID := func(pid int, err error) func(string) (int, error) {
		return func(unit string) (int, error) {
			asked = append(asked, unit)
			return pid, err
		}
	}
	me := mainPID(4242, nil)

	write("4242\n")
	if err := CheckServiceCgroup(root, self, 4242, me); err != nil {
		t.Fatalf("only this process: %v", err)
	}
	if len(asked) != 1 || asked[0] != "kibotos.service" {
		t.Fatalf("MainPID asked of %v, want kibotos.service", asked)
	}
	write("4242\n77\n")
	err := CheckServiceCgroup(root, self, 4242, me)
	if err == nil || !strings.Contains(err.Error(), "77") || !strings.Contains(err.Error(), "kibotos.service") {
		t.Fatalf("leftover process: %v, want an error naming pid 77 and the service", err)
	}

	// The service's main process is another one (a wrapper that stays, or
	// a member started inside the service's cgroup by other means): the
	// check stops before looking at the cgroup, naming both PIDs.
	write("4242\n")
	err = CheckServiceCgroup(root, self, 4242, mainPID(4100, nil))
	if err == nil || !strings.Contains(err.Error(), "kibotos.service has MainPID 4100") || !strings.Contains(err.Error(), "not this process 4242") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("MainPID of another process: %v", err)
	}
	// No main process at all (MainPID 0), and systemd not answering.
	if err := CheckServiceCgroup(root, self, 4242, mainPID(0, nil)); err == nil || !strings.Contains(err.Error(), "MainPID 0,") {
		t.Fatalf("MainPID 0: %v", err)
	}
	if err := CheckServiceCgroup(root, self, 4242, mainPID(0, errors.New("connection refused"))); err == nil || !strings.Contains(err.Error(), "read the MainPID of kibotos.service from systemd: connection refused") {
		t.Fatalf("systemd not answering: %v", err)
	}

	// Outside a service (a shell, tests, kibotos dev) there is nothing to
	// check, and systemd is not asked.
	asked = nil
	if err := CheckServiceCgroup(root, "0::/user.slice/session-1.scope\n", 4242, me); err != nil || len(asked) > 0 {
		t.Fatalf("outside a service: %v (asked %v)", err, asked)
	}
}
