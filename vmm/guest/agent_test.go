package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// run executes argv and returns stdout, stderr and the exit.
func run(t *testing.T, c *guestproto.Client, stdin []byte, argv ...string) (string, string, guestproto.ExecExit) {
	t.Helper()
	return runRequest(t, c, guestproto.ExecRequest{Argv: argv, Stdin: stdin != nil}, stdin)
}

// runRequest is run for a request with more than argv and stdin.
func runRequest(t *testing.T, c *guestproto.Client, req guestproto.ExecRequest, stdin []byte) (string, string, guestproto.ExecExit) {
	t.Helper()
	p, err := c.Exec(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, outDone := collect(p.Stdout)
	errb, errDone := collect(p.Stderr)
	if stdin != nil {
		if _, err := p.Stdin.Write(stdin); err != nil {
			t.Fatal(err)
		}
		p.Stdin.Close()
	}
	wait(t, outDone, "stdout EOF")
	wait(t, errDone, "stderr EOF")
	exit, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), exit
}

func TestGuestInfo(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true, AgentVersion: "v-test"})
	c := h.dial()
	info := c.Info()
	if info.Protocol != guestproto.ProtocolVersion || info.BootID != "test-boot" || info.AgentVersion != "v-test" || !info.Has(guestproto.CapPTY) {
		t.Fatalf("handshake info %+v", info)
	}
	got, err := c.GuestInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got.BootID != "test-boot" || got.MaxProtocol != guestproto.ProtocolVersion {
		t.Fatalf("GuestInfo %+v", got)
	}
}

func TestExec(t *testing.T) {
	for _, reapAll := range []bool{true, false} {
		name := "pid-reaper"
		if reapAll {
			name = "orphan-reaper"
		}
		t.Run(name, func(t *testing.T) {
			h := startAgent(t, Options{ReapOrphans: reapAll})
			c := h.dial()

			out, _, exit := run(t, c, nil, "uname", "-a")
			if exit.ExitCode != 0 || !strings.HasPrefix(out, "Linux ") {
				t.Fatalf("uname -a: %q, exit %+v", out, exit)
			}

			out, errs, exit := run(t, c, []byte("hello\nworld\n"), "sh", "-c", "cat; echo oops >&2; exit 3")
			if out != "hello\nworld\n" || errs != "oops\n" || exit.ExitCode != 3 {
				t.Fatalf("stdout %q stderr %q exit %+v", out, errs, exit)
			}

			_, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"no-such-command-kibotos"}})
			var ge *guestproto.Error
			if !errors.As(err, &ge) || ge.Code != guestproto.CodeNotFound || !strings.HasPrefix(ge.Message, "no-such-command-kibotos: command not found in PATH ") {
				t.Fatalf("missing command: %v", err)
			}
			// A missing working directory is named, not the program.
			_, err = c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"true"}, Dir: "/no-such-dir-kibotos"})
			if !errors.As(err, &ge) || ge.Code != guestproto.CodeFailed || ge.Message != "working directory /no-such-dir-kibotos: no such directory" {
				t.Fatalf("missing working directory: %v", err)
			}
		})
	}
}

func TestExecBinary(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	data := make([]byte, 1<<20)
	rand.Read(data)
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		p.Stdin.Write(data)
		p.Stdin.Close()
	}()
	sum := sha256.New()
	n, err := io.Copy(sum, p.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len(data)) || !bytes.Equal(sum.Sum(nil), sha256Sum(data)) {
		t.Fatalf("cat returned %d bytes with a different checksum", n)
	}
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
}

func sha256Sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func TestExecSignal(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if exit.ExitCode != -1 || exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("exit %+v, want killed by SIGTERM", exit)
	}
}

func TestExecPTY(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{
		Argv:  []string{"sh", "-c", `read line; echo "got $line"; tty; stty size; while read line; do stty size; done`},
		PTY:   &guestproto.WinSize{Rows: 24, Cols: 80},
		Stdin: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Stderr != nil {
		t.Fatal("a PTY process has no separate stderr")
	}
	out, outDone := collect(p.Stdout)
	io.WriteString(p.Stdin, "hi\n")
	testenv.WaitFor(t, 20*time.Second, "tty output", func() (bool, string) {
		s := out.String()
		return strings.Contains(s, "got hi") && strings.Contains(s, "/dev/pts/") && strings.Contains(s, "24 80"), fmt.Sprintf("%q", s)
	})
	if err := p.Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	// The resize travels on the control stream, the lines on stdin: ask
	// again until the new size shows.
	testenv.WaitFor(t, 20*time.Second, "new window size", func() (bool, string) {
		io.WriteString(p.Stdin, "\n")
		s := out.String()
		return strings.Contains(s, "50 132"), fmt.Sprintf("%q", s)
	})
	io.WriteString(p.Stdin, "\x04") // EOF for read: the loop ends
	wait(t, outDone, "terminal EOF")
	if exit, err := p.Wait(); err != nil || exit.ExitCode != 0 {
		t.Fatalf("exit %+v, %v; output %q", exit, err, out.String())
	}
}

func TestFiles(t *testing.T) {
	h := startAgent(t, Options{})
	c := h.dial()
	ctx := ctxT(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "data.bin")
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	fi, err := c.WriteFile(ctx, path, 0o640, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(data)) || fi.Mode.Perm() != 0o640 {
		t.Fatalf("write result %+v", fi)
	}
	var back bytes.Buffer
	if _, err := c.ReadFile(ctx, path, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Bytes(), data) {
		t.Fatal("read back differs")
	}
	st, err := c.Stat(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size != int64(len(data)) || st.Mode != 0o640 || st.UID != os.Getuid() {
		t.Fatalf("stat %+v", st)
	}
	if fi, err := c.WriteFile(ctx, path, 0o600, strings.NewReader("short")); err != nil || fi.Size != 5 {
		t.Fatalf("overwrite: %+v %v", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}

	var ge *guestproto.Error
	if _, err := c.Stat(ctx, filepath.Join(dir, "missing")); !errors.As(err, &ge) || ge.Code != guestproto.CodeNotFound {
		t.Fatalf("stat missing: %v", err)
	}
	if _, err := c.ReadFile(ctx, filepath.Join(dir, "missing"), io.Discard); !errors.As(err, &ge) || ge.Code != guestproto.CodeNotFound {
		t.Fatalf("read missing: %v", err)
	}
	if _, err := c.WriteFile(ctx, "relative/path", 0o644, bytes.NewReader(data)); !errors.As(err, &ge) || ge.Code != guestproto.CodeInvalid {
		t.Fatalf("relative write: %v", err)
	}
	if _, err := c.WriteFile(ctx, filepath.Join(dir, "no", "dir"), 0o644, bytes.NewReader(data)); !errors.As(err, &ge) {
		t.Fatalf("write into a missing directory: %v", err)
	}
	// The session still works after the failed calls.
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStop(t *testing.T) {
	var powerOffs atomic.Int32
	h := startAgent(t, Options{ReapOrphans: true, PowerOff: func() error {
		powerOffs.Add(1)
		return nil
	}})
	c := h.dial()
	ctx := ctxT(t)
	polite, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", `trap "" TERM; echo ready; while :; do sleep 1; done`}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := collect(stubborn.Stdout)
	testenv.WaitFor(t, 20*time.Second, "the TERM trap", func() (bool, string) {
		s := out.String()
		return strings.Contains(s, "ready"), fmt.Sprintf("%q", s)
	})

	res, err := c.Stop(ctx, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Terminated != 1 || res.Killed != 1 {
		t.Fatalf("stop result %+v, want 1 terminated and 1 killed", res)
	}
	if exit, err := polite.Wait(); err != nil || exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("sleep exit %+v, %v", exit, err)
	}
	if exit, err := stubborn.Wait(); err != nil || exit.Signal != int(syscall.SIGKILL) {
		t.Fatalf("stubborn exit %+v, %v", exit, err)
	}
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("Serve after stop: %v", err)
		}
		h.done <- nil // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after Stop")
	}
	if powerOffs.Load() != 1 {
		t.Fatalf("poweroff called %d times", powerOffs.Load())
	}
}

// A background child that keeps stdout open must not hold the exit report
// back for longer than outputDelay.
func TestExecBackgroundChildHoldsOutput(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sh", "-c", "sleep 30 & echo $!"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := collect(p.Stdout)
	exit, err := p.Wait()
	if err != nil || exit.ExitCode != 0 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	var pid int
	if _, err := fmt.Sscan(out.String(), &pid); err != nil || pid <= 0 {
		t.Fatalf("background pid in %q: %v", out.String(), err)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

func TestOpenPort(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := openPort(ctx, dir, "kibotos.agent"); !errors.Is(err, context.Canceled) {
		t.Fatalf("missing port: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "kibotos.agent"), nil, 0o600)
	f, err := openPort(context.Background(), dir, "kibotos.agent")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := loadModules(filepath.Join(dir, "modules.list"), nil); err != nil {
		t.Fatalf("no module list: %v", err)
	}
}

func TestConfigureDNS(t *testing.T) {
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	h := startAgent(t, Options{ResolvConf: resolv})
	c := h.dial()
	if err := c.Configure(ctxT(t), guestproto.ConfigureRequest{DNS: []string{"10.0.0.1", "fd00::1"}}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(resolv)
	if string(b) != "nameserver 10.0.0.1\nnameserver fd00::1\n" {
		t.Fatalf("resolv.conf %q", b)
	}
	err := c.Configure(ctxT(t), guestproto.ConfigureRequest{Interfaces: []guestproto.Interface{{MAC: "02:00:00:00:00:01"}}})
	var ge *guestproto.Error
	if !errors.As(err, &ge) || ge.Code != guestproto.CodeInvalid {
		t.Fatalf("interface without a name: %v", err)
	}
}

// A Workspace root's /etc/resolv.conf is a bind mount of the agent's: it
// shows DNS servers configured before the mount and after it, and a
// symlink in its place is replaced rather than followed from the agent's
// root.
func TestConfigureBindMountsResolvConf(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "bind mounts need root")
	}
	dir := t.TempDir()
	resolv := filepath.Join(dir, "agent", "resolv.conf")
	os.MkdirAll(filepath.Dir(resolv), 0o755)
	root := filepath.Join(dir, "rootfs")
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	decoy := filepath.Join(dir, "decoy")
	os.WriteFile(decoy, []byte("decoy\n"), 0o644)
	target := filepath.Join(root, "etc", "resolv.conf")
	if err := os.Symlink(decoy, target); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(root, "run", "new", "resolv.conf")
	t.Cleanup(func() {
		for _, p := range []string{target, missing, decoy} {
			for unix.Unmount(p, unix.MNT_DETACH) == nil {
			}
		}
	})
	h := startAgent(t, Options{ResolvConf: resolv})
	c := h.dial()
	if !c.Info().Has(guestproto.CapBindMount) {
		t.Fatalf("capabilities %v lack %s", c.Info().Capabilities, guestproto.CapBindMount)
	}
	ctx := ctxT(t)
	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{"10.0.0.1"}}); err != nil {
		t.Fatal(err)
	}
	bind := []guestproto.Mount{{Source: resolv, Target: target, Options: []string{"bind"}}, {Source: resolv, Target: missing, Options: []string{"bind"}}}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: bind}); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
	for _, p := range []string{target, missing} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("%s after the bind mount: %v", p, err)
		} else if !fi.Mode().IsRegular() || read(p) != "nameserver 10.0.0.1\n" {
			t.Errorf("%s after the bind mount: mode %v, %q; want a regular file showing the agent's resolv.conf", p, fi.Mode(), read(p))
		}
	}
	if got := read(decoy); got != "decoy\n" {
		t.Errorf("the symlink's target %s reads %q: the mount followed it", decoy, got)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{DNS: []string{"10.0.0.2", "10.0.0.3"}}); err != nil {
		t.Fatal(err)
	}
	if got := read(target); got != "nameserver 10.0.0.2\nnameserver 10.0.0.3\n" {
		t.Errorf("bind-mounted resolv.conf after new DNS servers: %q; want them", got)
	}
	err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: resolv, Target: target, Options: []string{"bind", "ro"}}}})
	var ge *guestproto.Error
	if !errors.As(err, &ge) || ge.Code != guestproto.CodeInvalid {
		t.Errorf("bind mount with another option: %v; want invalid", err)
	}
}

// As PID 1 (here: a subreaper) the agent reaps re-parented orphans with the
// same loop that reports exec exits, without losing either.
func TestOrphansReaped(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		testenv.Skipf(t, "cannot become a subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	out, _, exit := run(t, c, nil, "sh", "-c", "sleep 0.1 >/dev/null 2>&1 & echo $!; exit 4")
	if exit.ExitCode != 4 {
		t.Fatalf("exit %+v", exit)
	}
	pid := strings.TrimSpace(out)
	testenv.WaitFor(t, 20*time.Second, "the orphan to be reaped", func() (bool, string) {
		return strings.Contains(h.logs.String(), `msg="reaped orphan" pid=`+pid+" "), ""
	})
}

// Processes that exited must not hold Stop up, even when the node never
// called Process.Close after Wait (nor read their output).
func TestStopAfterWaitWithoutClose(t *testing.T) {
	for _, reapAll := range []bool{true, false} {
		t.Run(fmt.Sprintf("reap-orphans=%v", reapAll), func(t *testing.T) {
			h := startAgent(t, Options{ReapOrphans: reapAll})
			c := h.dial()
			ctx := ctxT(t)
			for _, req := range []guestproto.ExecRequest{
				{Argv: []string{"true"}},
				{Argv: []string{"sh", "-c", "echo out; echo err >&2"}, Stdin: true},
				{Argv: []string{"sh", "-c", "echo tty"}, PTY: &guestproto.WinSize{Rows: 24, Cols: 80}},
			} {
				p, err := c.Exec(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := p.Wait(); err != nil {
					t.Fatal(err)
				}
			}
			running, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "100"}})
			if err != nil {
				t.Fatal(err)
			}
			const grace = 3 * time.Second
			start := time.Now()
			res, err := c.Stop(ctx, grace)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if res.Terminated != 1 || res.Killed != 0 {
				t.Fatalf("stop result %+v, want the one running process terminated", res)
			}
			if took >= grace {
				t.Fatalf("Stop took %v, the grace period is %v", took, grace)
			}
			if exit, err := running.Wait(); err != nil || exit.Signal != int(syscall.SIGTERM) {
				t.Fatalf("sleep exit %+v, %v", exit, err)
			}
		})
	}
}

// Closing a Process returns at once and leaves the guest process running:
// the node abandons it, it is not ended.
func TestExecCloseAbandonsTheProcess(t *testing.T) {
	h := startAgent(t, Options{})
	c := h.dial()
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	wait(t, closed, "Process.Close of a running process")
	if _, err := p.Wait(); err == nil {
		t.Fatal("Wait after Close reported an exit; want the process abandoned")
	}
	if err := unix.Kill(p.PID, 0); err != nil {
		t.Fatalf("guest process %d after Close: %v; want it still running", p.PID, err)
	}
}
