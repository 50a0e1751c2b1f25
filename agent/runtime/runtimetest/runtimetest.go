// Package runtimetest gives tests what booting real VMs needs: a check
// that this host can (root, QEMU, dpkg, a private systemd), a Platform
// built once per test binary from the Debian cloud kernel and a static
// kibotos, and a private systemd with a unit manager, removed by
// t.Cleanup also when the test fails.
package runtimetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// RequireVMHost skips, saying why on stderr, when this host cannot boot a
// Platform in a private systemd (fails under KIBOTOS_REQUIRE_ALL=1, see
// internal/testenv). Slowness is never a reason to skip.
func RequireVMHost(t testing.TB) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for tool, pkg := range map[string]string{qemu.DefaultBinary: "qemu-system-x86", "dpkg": "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (Debian package "+pkg+")")
		}
	}
	if err := privsd.Available(); err != nil {
		missing = append(missing, "a private systemd: "+err.Error())
	}
	if len(missing) > 0 {
		testenv.Skipf(t, "missing %s", strings.Join(missing, ", "))
	}
}

// fixture is the Platform shared by every test of one test binary.
var fixture struct {
	once sync.Once
	dir  string
	inst *platform.Installation
	err  error
}

// Platform builds (once per test binary) a static kibotos and a Platform
// with it as the guest agent. The kernel .deb is cached between runs in
// $TMPDIR/kibotos-test-platform. Call Cleanup from TestMain.
func Platform(t testing.TB) *platform.Installation {
	t.Helper()
	fixture.once.Do(func() {
		t0 := time.Now()
		fixture.dir, fixture.err = os.MkdirTemp("", "kbr-platform-")
		if fixture.err != nil {
			return
		}
		bin := filepath.Join(fixture.dir, "kibotos")
		cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/kibotos/kibotos")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fixture.err = fmt.Errorf("go build kibotos: %v\n%s", err, out)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		fixture.inst, fixture.err = platform.Build(ctx, platform.Options{
			StorageRoot: filepath.Join(fixture.dir, "storage"),
			CacheDir:    filepath.Join(os.TempDir(), "kibotos-test-platform"),
			AgentBinary: bin,
		})
		if fixture.err == nil {
			fmt.Fprintf(os.Stderr, "platform fixture %s (kernel %s) built in %v\n", fixture.inst.ID, fixture.inst.KernelVersion, time.Since(t0).Round(time.Millisecond))
		}
	})
	if fixture.err != nil {
		t.Fatal(fixture.err)
	}
	return fixture.inst
}

// PlatformID is the id of the Platform fixture once Platform built it,
// else "": the runtime's OwnInstallation in tests.
func PlatformID() string {
	if fixture.inst == nil {
		return ""
	}
	return fixture.inst.ID
}

// Cleanup removes the Platform fixture; call it from TestMain after m.Run.
func Cleanup() {
	if fixture.dir != "" {
		os.RemoveAll(fixture.dir)
	}
}

// Systemd starts a private systemd in dir and connects a unit manager to
// it; both are stopped by t.Cleanup, which also kills whatever a failed
// test left running in it.
func Systemd(t testing.TB, dir string) (*privsd.Instance, *units.Manager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sd, err := privsd.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sd.Stop(); err != nil {
			t.Errorf("stop private systemd: %v", err)
		}
	})
	m, err := units.Connect(ctx, sd.Target())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return sd, m
}
