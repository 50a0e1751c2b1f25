package agent

import (
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

	write("4242\n")
	if err := CheckServiceCgroup(root, self, 4242); err != nil {
		t.Fatalf("only this process: %v", err)
	}
	write("4242\n77\n")
	err := CheckServiceCgroup(root, self, 4242)
	if err == nil || !strings.Contains(err.Error(), "77") || !strings.Contains(err.Error(), "kibotos.service") {
		t.Fatalf("leftover process: %v, want an error naming pid 77 and the service", err)
	}
	// Outside a service (a shell, tests, kibotos dev) there is nothing to check.
	if err := CheckServiceCgroup(root, "0::/user.slice/session-1.scope\n", 4242); err != nil {
		t.Fatalf("outside a service: %v", err)
	}
}
