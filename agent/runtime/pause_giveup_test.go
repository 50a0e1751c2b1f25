package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// TestPauseGivenUp: a pause whose context ends while QEMU writes the
// state (the node stopping) leaves no snapshot and the guest running on.
// The pause is most often given up on while waiting for QEMU's answer,
// which leaves the QMP connection unusable: the undo must not depend on
// it (under CPU load it failed that way every time).
func TestPauseGivenUp(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	var giveUp func()
	cfg := runtime.BeforeSave(h.config(), func(int) {
		if giveUp != nil {
			go giveUp()
		}
	})
	rt, err := runtime.Open(testCtx(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	ctx := testCtx(t, 4*time.Minute)
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: "g-1", Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true}); err != nil {
		t.Fatal(err)
	}
	if r, err := run(ctx, rt, "g-1", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &"}}, nil); err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("start a counter: %+v, %v", r, err)
	}
	dir := filepath.Join(h.scratch, "pool", "snapshots", "ws-g")
	pctx, cancelPause := context.WithCancel(ctx)
	writing := func() bool {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			if st, err := os.Stat(filepath.Join(dir, e.Name())); err == nil && st.Size() > 1<<20 {
				return true
			}
		}
		return false
	}
	giveUp = func() {
		defer cancelPause()
		for deadline := time.Now().Add(30 * time.Second); !writing(); {
			if time.Now().After(deadline) {
				t.Error("QEMU wrote no MiB of the state in 30 s")
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	_, err = rt.Pause(pctx, "g-1", dir)
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "start the guest's vCPUs again") {
		t.Fatalf("pause given up on: %v; want it cancelled, and the guest's vCPUs started again", err)
	}
	giveUp = nil
	if names := dirEntries(t, dir); len(names) != 0 {
		t.Errorf("a pause given up on left %v", names)
	}
	// The guest session may be reconnecting: asked until it answers.
	var last string // the last exec that did not answer, for a failure
	defer func() {
		if t.Failed() {
			st, err := rt.Status("g-1")
			t.Logf("last exec that did not answer: %s; instance: %+v, %v", last, st, err)
		}
	}()
	count := func() int {
		r, err := run(ctx, rt, "g-1", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat /tmp/count"}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			last = fmt.Sprintf("%s: %+v, %v", time.Now().Format("15:04:05.000"), r, err)
			return -1
		}
		n, _ := strconv.Atoi(strings.TrimSpace(r.stdout))
		return n
	}
	before := -1
	testenv.WaitFor(t, 20*time.Second, "the guest's counter", func() (bool, string) {
		before = count()
		return before > 0, fmt.Sprintf("count %d", before)
	})
	testenv.WaitFor(t, 20*time.Second, "the guest's counter to count on", func() (bool, string) {
		n := count()
		return n > before, fmt.Sprintf("count %d, %d before", n, before)
	})
	if st, err := rt.Status("g-1"); err != nil || st.State != runtime.StateRunning {
		t.Errorf("after a pause given up on: %+v, %v; want it running", st, err)
	}
	rt.Delete(ctx, "g-1")
}
