package testhost

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// A booted host is a real systemd as PID 1 whose writes stay in its layer:
// a file written in /etc and /tmp inside is not on the machine, the
// machine's /tmp is untouched (no tmpfiles), /proc/sys is read-only, its
// units are only the minimal set, and after Stop nothing of it is left.
func TestBoot(t *testing.T) {
	if err := Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	testenv.LookPath(t, "nsenter", "util-linux")
	marker, err := os.CreateTemp("", "testhost-marker-*")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	defer os.Remove(marker.Name())
	dir := t.TempDir()
	shared := t.TempDir()
	os.WriteFile(filepath.Join(shared, "in"), []byte("from the machine\n"), 0o644)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	h, err := Start(ctx, dir, Options{Hostname: "boot-test", Shares: []Share{{Host: shared, Guest: "/srv/shared", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	t.Logf("booted in %s", time.Since(t0).Round(time.Millisecond))

	run := func(args ...string) (string, error) {
		out, err := h.Command(ctx, args[0], args[1:]...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run("sh", "-c", "echo inside > /etc/testhost-probe && echo inside > /tmp/probe && cat /etc/testhost-probe /srv/shared/in && hostname"); err != nil || out != "inside\nfrom the machine\nboot-test" {
		t.Fatalf("inside: %q, %v", out, err)
	}
	for _, p := range []string{"/etc/testhost-probe", "/tmp/probe"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s written inside the host is on the machine: %v", p, err)
		}
	}
	if b, err := os.ReadFile(h.Path("/etc/testhost-probe")); err != nil || string(b) != "inside\n" {
		t.Errorf("through Path: %q, %v", b, err)
	}
	if out, err := run("sh", "-c", "echo 1 > /proc/sys/kernel/sysrq"); err == nil {
		t.Errorf("/proc/sys/kernel is writable inside: %s", out)
	}
	if out, err := run("sh", "-c", "echo x > /srv/shared/out"); err == nil {
		t.Errorf("a read-only share is writable: %s", out)
	}
	if out, err := run("systemctl", "list-units", "--all", "--no-legend", "--plain", "systemd-udev*", "systemd-tmpfiles*", "getty*"); err != nil || out != "" {
		t.Errorf("units of the machine's set are loaded: %q, %v", out, err)
	}
	if out, err := run("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && cat /proc/sys/net/ipv4/ip_forward"); err != nil || out != "1" {
		t.Errorf("/proc/sys/net of the host's own network namespace: %q, %v", out, err)
	}
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker.Name()); err != nil {
		t.Errorf("the machine's /tmp lost %s: %v", marker.Name(), err)
	}
	if _, err := os.Stat(h.cgroup); !os.IsNotExist(err) {
		t.Errorf("cgroup %s left behind: %v", h.cgroup, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "root")); len(entries) > 0 {
		t.Errorf("the overlay's mount point is not empty from the machine: %d entries", len(entries))
	}
}
