package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A kept exec outlives its caller and its session: it is listed with its
// meta, a caller of a new session attaches to it by pid and feeds its
// stdin, two callers attached at once both get its output, the end of a
// stdin stream only detaches, CloseStdin closes it, and every caller
// still attached gets the exit; then it is gone.
func TestKeptExecOutlivesItsCaller(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	first := h.dialOn(h.plugData())
	ctx := ctxT(t)
	p, err := first.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", `while read l; do echo "got $l"; done; echo bye; exit 3`},
		Stdin: true, Keep: true, Meta: json.RawMessage(`{"tag":"reader"}`)})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := collect(p.Stdout)
	p.Stdin.Write([]byte("a\n"))
	testenv.WaitFor(t, 10*time.Second, "the first caller's line", func() (bool, string) { return out.String() == "got a\n", out.String() })
	p.Stdin.Close() // detaches its input only
	p.Close()
	first.Close() // the session ends, as at a pause
	c := h.dialOn(h.plugData())
	list, err := c.ListExecs(ctx)
	if err != nil || len(list) != 1 || list[0].PID != p.PID || string(list[0].Meta) != `{"tag":"reader"}` || list[0].PTY {
		t.Fatalf("kept execs after their caller left: %+v, %v", list, err)
	}
	a, err := c.ConnectExec(ctx, p.PID, true, false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.ConnectExec(ctx, p.PID, false, false)
	if err != nil {
		t.Fatal(err)
	}
	outA, doneA := collect(a.Stdout)
	outB, doneB := collect(b.Stdout)
	lines := func(want string) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, "both callers' lines", func() (bool, string) {
			return outA.String() == want && outB.String() == want, outA.String() + " | " + outB.String()
		})
	}
	a.Stdin.Write([]byte("b\n"))
	lines("got b\n")
	b.Input([]byte("c\n")) // a control frame: in order with a signal or a close
	lines("got b\ngot c\n")
	if err := a.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*guestproto.Process{a, b} {
		exit, err := q.Wait()
		if err != nil || exit.ExitCode != 3 {
			t.Fatalf("exit seen by an attached caller: %+v, %v", exit, err)
		}
	}
	wait(t, doneA, "the first attached output's end")
	wait(t, doneB, "the second attached output's end")
	if outA.String() != "got b\ngot c\nbye\n" || outB.String() != "got b\ngot c\nbye\n" {
		t.Fatalf("outputs %q and %q, want got b then bye", outA.String(), outB.String())
	}
	if list, err := c.ListExecs(ctx); err != nil || len(list) != 0 {
		t.Fatalf("kept execs after the end: %+v, %v", list, err)
	}
	_, err = c.ConnectExec(ctx, p.PID, false, false)
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeNotFound || !strings.Contains(ge.Message, fmt.Sprintf("no kept process %d", p.PID)) {
		t.Fatalf("connect to an ended exec: %v", err)
	}
}

// Nobody reading a kept exec's output does not stall it, and a signal
// from a caller that attached later ends it.
func TestKeptExecWithoutReaders(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c := h.dialOn(h.plugData())
	ctx := ctxT(t)
	mark := filepath.Join(t.TempDir(), "done")
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", `seq 1 200000; seq 1 1000 >&2; echo > "$1"; exec sleep 600`, "sh", mark}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	testenv.WaitFor(t, 20*time.Second, "the unread command to write on", func() (bool, string) {
		_, err := os.Stat(mark)
		return err == nil, fmt.Sprint(err)
	})
	q, err := c.ConnectExec(ctx, p.PID, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Signal(15); err != nil {
		t.Fatal(err)
	}
	if exit, err := q.Wait(); err != nil || exit.Signal != 15 {
		t.Fatalf("exit after SIGTERM: %+v, %v", exit, err)
	}

	_, err = c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}, Keep: true, Meta: json.RawMessage(`{"a":` + strings.Repeat(" ", guestproto.MaxExecMeta) + `1}`)})
	if err == nil || !strings.Contains(err.Error(), "meta of") {
		t.Fatalf("a meta over the bound: %v", err)
	}
}

// Kept execs are bounded: one past the bound is refused, saying so,
// until one of them ends. An exec that is not kept takes no place.
func TestKeptExecsBounded(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true, MaxKeptExecs: 2})
	c := h.dialOn(h.plugData())
	ctx := ctxT(t)
	var kept []*guestproto.Process
	for range 2 {
		p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "600"}, Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Signal(9)
		kept = append(kept, p)
	}
	_, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}, Keep: true})
	if ge := guestErr(err); ge == nil || !strings.Contains(ge.Message, "the guest keeps 2 processes already") {
		t.Fatalf("a third kept exec of 2: %v", err)
	}
	if _, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("an exec not kept beside 2 kept ones: %v", err)
	}
	if err := kept[0].Signal(9); err != nil {
		t.Fatal(err)
	}
	if _, err := kept[0].Wait(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a place after one ended", func() (bool, string) {
		p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}, Keep: true})
		if err == nil {
			p.Wait()
		}
		return err == nil, fmt.Sprint(err)
	})
}
