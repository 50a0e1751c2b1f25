package guest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// alive says whether pid runs (a zombie has ended).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name's closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && len(b) > i+2 && b[i+2] != 'Z'
}

// pids reads the process ids a command printed, one a line.
func pids(t *testing.T, out string, n int) []int {
	t.Helper()
	var got []int
	for _, f := range strings.Fields(out) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 {
			got = append(got, pid)
		}
	}
	if len(got) != n {
		t.Fatalf("want %d process ids in %q", n, out)
	}
	return got
}

// killPrinted ends, when the test ends, the processes whose ids out holds
// by then and that still run argv0: the test's own background jobs, also
// when it fails before it read them.
func killPrinted(t *testing.T, out *testenv.Buffer, argv0 string) {
	t.Cleanup(func() {
		for _, f := range strings.Fields(out.String()) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err != nil || pid <= 0 {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if strings.HasPrefix(string(cmd), argv0+"\x00") {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// What an exec's end does to the processes it left in the background is
// what ssh does: an exec without a terminal leaves them running (their
// output goes nowhere once the exec's streams closed); with a terminal,
// the kernel hangs up its foreground process group when the exec's
// process ends, which ends the background jobs of a non-interactive
// shell unless they ignore SIGHUP from the start (a nohup or setsid
// started in the same breath may lose that race, as under ssh -t).
func TestExecLeavesBackgroundProcesses(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	var (
		p   *guestproto.Process
		err error
	)

	out, _, exit := run(t, c, nil, "sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!; nohup sleep 61 >/dev/null 2>&1 & echo $!")
	printed := &testenv.Buffer{}
	printed.Write([]byte(out))
	killPrinted(t, printed, "sleep")
	if exit.ExitCode != 0 {
		t.Fatalf("exit %+v", exit)
	}
	for _, pid := range pids(t, out, 2) {
		if !alive(pid) {
			t.Errorf("background process %d of an exec without a terminal ended with the exec", pid)
		}
	}

	p, err = c.Exec(ctxT(t), guestproto.ExecRequest{
		Argv: []string{"sh", "-c", `sleep 300 & echo $!; trap "" HUP; sleep 301 & echo $!`},
		PTY:  &guestproto.WinSize{Rows: 24, Cols: 80},
	})
	if err != nil {
		t.Fatal(err)
	}
	tty, outDone := collect(p.Stdout)
	killPrinted(t, tty, "sleep")
	// The job that ignores SIGHUP keeps the terminal open: the exec still
	// ends once its own process did and the output had its moment.
	exited := make(chan error, 1)
	go func() {
		exit, err := p.Wait()
		if err == nil && exit.ExitCode != 0 {
			err = fmt.Errorf("exit %+v", exit)
		}
		exited <- err
	}()
	select {
	case err = <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("timed out waiting for the exec's exit while its background job holds the terminal")
	}
	if err != nil {
		t.Fatal(err)
	}
	<-outDone
	got := pids(t, tty.String(), 2)
	testenv.WaitFor(t, 20*time.Second, "the terminal's hangup to end the plain background job", func() (bool, string) {
		return !alive(got[0]), fmt.Sprintf("process %d alive", got[0])
	})
	if !alive(got[1]) {
		t.Errorf("background process %d, which ignores SIGHUP, ended with its terminal", got[1])
	}
}

// A client that goes away leaves its process no reader: it gets SIGPIPE
// at its next write (no terminal) or its terminal's hangup, as under ssh,
// instead of blocking on output nobody reads.
func TestExecClientGoneEndsWriter(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dial()
	for _, tc := range []struct {
		name string
		pty  *guestproto.WinSize
	}{{"pipes", nil}, {"terminal", &guestproto.WinSize{Rows: 24, Cols: 80}}} {
		p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"yes"}, PTY: tc.pty})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if alive(p.PID) {
				syscall.Kill(p.PID, syscall.SIGKILL)
			}
		})
		io.ReadFull(p.Stdout, make([]byte, 4096)) // it runs and writes
		p.Close()
		testenv.WaitFor(t, 20*time.Second, tc.name+": yes to end once its client went away", func() (bool, string) {
			return !alive(p.PID), fmt.Sprintf("process %d alive", p.PID)
		})
	}
}
