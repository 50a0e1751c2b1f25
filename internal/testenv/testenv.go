// Package testenv decides what a test does when this host lacks something
// the test needs (root, QEMU, a private systemd, a Debian tool): it skips,
// saying why on stderr so a skipped run is visible without -v, or, when
// KIBOTOS_REQUIRE_ALL=1 (as .ci/run sets it), it fails, so CI can never pass
// without the VM suite. Skips that are not environment gaps (-short) stay
// plain t.Skip and must not come through here.
//
// It also has the one way a test waits for something to happen: WaitFor.
// Its timeouts are multiplied by KIBOTOS_TIME_SCALE (a positive number,
// default 1; 2 doubles every timeout) for machines slower than the ones
// the timeouts were chosen on: a loaded laptop, nested virtualization,
// more packages under -race. A scale only lets a test wait longer: what
// never happens still fails the test, later. .ci/run leaves it at 1: the
// timeouts were chosen on the CI machine, and some of them are what the
// test asserts (a killed VMM shows FAILED within 5 s).
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/internal/hostprobe"
)

// RequireAllEnv names the switch: "1" turns every missing prerequisite
// into a failure.
const RequireAllEnv = "KIBOTOS_REQUIRE_ALL"

// RequireAll reports whether missing prerequisites fail the test.
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }

// Skipf stops the test because this host lacks a prerequisite the message
// names: t.Skip normally, t.Fatal under KIBOTOS_REQUIRE_ALL=1.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if RequireAll() {
		fmt.Fprintf(os.Stderr, "%s: FAIL: %s (%s=1: a missing prerequisite is a failure)\n", t.Name(), why, RequireAllEnv)
		t.Fatalf("%s (%s=1: a missing prerequisite is a failure)", why, RequireAllEnv)
		return
	}
	fmt.Fprintf(os.Stderr, "%s: skipped: %s\n", t.Name(), why)
	t.Skip(why)
}

// RequireRoot stops the test through Skipf unless it runs as root; why
// says what the test does that needs root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skipf(t, "needs root %s", why)
	}
}

// LookPath returns the path of tool, or stops the test through Skipf
// naming the Debian package that installs it.
func LookPath(t testing.TB, tool, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		Skipf(t, "missing %s (Debian package %s)", tool, debianPackage)
	}
	return p
}

// ProcState is the state letter of /proc/PID/stat ("D": uninterruptible
// sleep), or "" once the process is gone.
func ProcState(pid int) string { return ProcStatField(pid, 3) }

// ProcStatField is field n (1-based, as proc(5) numbers them: 3 is the
// state, 19 the nice value) of /proc/PID/stat, or "" once the process is
// gone.
func ProcStatField(pid, n int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || n < 3 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if n-3 >= len(f) {
		return ""
	}
	return f[n-3]
}

// Ports reserves n consecutive free ports of 127.0.0.1 for the rest of
// t (hostprobe.ReservePorts) and returns the first.
func Ports(t testing.TB, n int) int {
	t.Helper()
	first, release, err := hostprobe.ReservePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return first
}

// LoopbackAddr is 127.0.0.1 with a port reserved for the rest of t, free
// for TCP and UDP: for a listener the code under test opens later, or an
// address nothing listens on.
func LoopbackAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(Ports(t, 1))
}

// DefaultSIGHUP makes the processes this test binary starts begin with
// SIGHUP at its default action, as they would under a login or a guest's
// PID 1, even when the binary itself was started with it ignored (under
// nohup): a process passes an ignored signal on to every child, and a
// shell that ignores SIGHUP cannot be hung up. Call it from TestMain of a
// package whose tests check what a hangup ends.
func DefaultSIGHUP() {
	// A handled signal is reset to its default on exec; an ignored one
	// stays ignored. The channel is never read: the signal is dropped.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
}
