package netpol

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Helpers for tests in real network namespaces. A namespace is made by a
// thread that unshares and is then thrown away; the test keeps it alive by
// an fd, so closing the fd at cleanup (also after a failure) removes it
// with everything in it.

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("netpol: this test makes network namespaces and nftables tables: run it as root")
	}
}

// testNetns returns an fd of a new, empty network namespace.
func testNetns(t testing.TB) int {
	t.Helper()
	requireRoot(t)
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result)
	go func() {
		// The thread is never unlocked: it ends up in the new namespace and
		// Go discards it when this goroutine returns.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{-1, fmt.Errorf("unshare: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("new network namespace: %v", r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}

// inNetns runs f on a thread that has joined the namespace. Sockets f
// opens stay in that namespace wherever they are used afterwards.
func inNetns(nsFD int, f func() error) error {
	ch := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			ch <- fmt.Errorf("setns: %w", err)
			return
		}
		ch <- f()
	}()
	return <-ch
}

// nsRun runs a command (nft, ip) inside the namespace and returns its
// output; the test fails if it fails.
func nsRun(t testing.TB, nsFD int, args ...string) string {
	t.Helper()
	out, err := nsRunErr(nsFD, args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func nsRunErr(nsFD int, args ...string) (string, error) {
	if _, err := exec.LookPath(args[0]); err != nil {
		return "", fmt.Errorf("%s not installed (Debian packages nftables, iproute2): %w", args[0], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns := fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), nsFD)
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{ns, "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %v", what, timeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
