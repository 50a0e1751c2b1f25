package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// endsProblem checks the ends index against the Workspace records.
func endsProblem(tx *bolt.Tx) error {
	want := map[string]bool{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err == nil && w.EndsAt != nil {
			want[string(endKey(*w.EndsAt, w.WorkspaceID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	got := map[string]bool{}
	tx.Bucket(bucketWorkspaceEnds).ForEach(func(k, _ []byte) error { got[string(k)] = true; return nil })
	if len(got) != len(want) {
		return fmt.Errorf("ends index has %d entries, the records %d ends", len(got), len(want))
	}
	for k := range want {
		if !got[k] {
			return fmt.Errorf("ends index lacks %x", k)
		}
	}
	return nil
}

// withTimeout is a create of smallWS that ends d after each start.
func withTimeout(d time.Duration, action string) WorkspaceCreateArgs {
	a := smallWS
	a.TimeoutSeconds, a.OnTimeout = int64(d/time.Second), action
	return a
}

func (h *harness) due(now time.Time) []DueEnd {
	h.t.Helper()
	var out []DueEnd
	if err := h.f.View(func(tx *bolt.Tx) (err error) { out, err = DueEnds(tx, now, 100); return }); err != nil {
		h.t.Fatal(err)
	}
	return out
}

func endOf(t *testing.T, w *api.Workspace) time.Time {
	t.Helper()
	if w == nil || w.EndsAt == nil {
		t.Fatalf("workspace has no end: %+v", w)
	}
	return *w.EndsAt
}

// The end is the time of the latest start or resume entry plus the
// timeout: a create arms it, a node's answer or a stop leaves it, the
// next start and a resume arm it again. Without a timeout there is none.
func TestLifetimeArmedAtStartAndResume(t *testing.T) {
	h := resumeHarness(t)
	plain := h.running("plain", smallWS)
	if plain.EndsAt != nil || plain.TimeoutSeconds != 0 || plain.OnTimeout != "" || plain.AutoResume {
		t.Fatalf("a Workspace without a timeout has an end: %+v", plain)
	}
	auto := smallWS
	auto.AutoResume = true
	if w := h.create("auto", auto); !w.AutoResume || w.EndsAt != nil {
		t.Fatalf("create with auto-resume: %+v", w)
	}
	w := h.create("c1", withTimeout(10*time.Minute, ""))
	created := h.now
	if got := endOf(t, &w); !got.Equal(created.Add(10*time.Minute)) || w.OnTimeout != api.TimeoutDelete || w.TimeoutSeconds != 600 {
		t.Fatalf("created: ends %s action %q timeout %d, want %s, delete, 600", got, w.OnTimeout, w.TimeoutSeconds, created.Add(10*time.Minute))
	}
	if got := endOf(t, h.answer(w.WorkspaceID, OutcomeOK, "")); !got.Equal(created.Add(10 * time.Minute)) {
		t.Fatalf("the node's answer moved the end to %s", got)
	}
	h.advance(time.Minute)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if got := endOf(t, h.answer(w.WorkspaceID, OutcomeOK, "")); !got.Equal(created.Add(10 * time.Minute)) {
		t.Fatalf("a stop moved the end to %s", got)
	}
	h.advance(time.Hour)
	started := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if got := endOf(t, &started); !got.Equal(h.now.Add(10 * time.Minute)) {
		t.Fatalf("start at %s: ends %s, want 10m later", h.now, got)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.pauseAnswer(w.WorkspaceID)
	h.advance(time.Hour)
	resumed := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if got := endOf(t, &resumed); resumed.Snapshot == nil || !got.Equal(h.now.Add(10*time.Minute)) {
		t.Fatalf("resume at %s: ends %s, want 10m later", h.now, got)
	}
	// A start of an AVAILABLE Workspace starts nothing: the end stays.
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Minute)
	again := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if !endOf(t, &again).Equal(endOf(t, &resumed)) {
		t.Fatalf("a start of an AVAILABLE Workspace moved its end")
	}
	checkIndex(t, h.f)
}

// set-timeout ends the Workspace the given time after its entry, shorter
// or longer than before, keeps the action unless given one, and 0 clears
// the end and the timeout; bad arguments change nothing.
func TestSetTimeout(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", withTimeout(time.Hour, api.TimeoutStop))
	set := func(d time.Duration, action string) api.Workspace {
		t.Helper()
		h.advance(time.Minute)
		return decode[api.Workspace](t, h.ok(OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: int64(d / time.Second), OnTimeout: action}))
	}
	if got := set(5*time.Minute, ""); !endOf(t, &got).Equal(h.now.Add(5*time.Minute)) || got.OnTimeout != api.TimeoutStop || got.TimeoutSeconds != 300 {
		t.Fatalf("shortened: %+v ends %v", got, got.EndsAt)
	}
	if got := set(2*time.Hour, api.TimeoutPause); !endOf(t, &got).Equal(h.now.Add(2*time.Hour)) || got.OnTimeout != api.TimeoutPause {
		t.Fatalf("extended: %+v ends %v", got, got.EndsAt)
	}
	if got := set(0, ""); got.EndsAt != nil || got.TimeoutSeconds != 0 || got.OnTimeout != "" {
		t.Fatalf("cleared: %+v", got)
	}
	if d := h.due(h.now.Add(1000 * time.Hour)); len(d) != 0 {
		t.Fatalf("a cleared end is still due: %+v", d)
	}
	// A Workspace without one gets the default action.
	if got := set(time.Minute, ""); got.OnTimeout != api.TimeoutDelete {
		t.Fatalf("set-timeout of a Workspace without an action: %q", got.OnTimeout)
	}
	for _, c := range []struct {
		args WorkspaceSetTimeoutArgs
		code api.Code
		msg  string
	}{
		{WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: -1}, api.CodeInvalidArgument, "negative"},
		{WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 1 << 40}, api.CodeInvalidArgument, "longer than"},
		{WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, OnTimeout: api.TimeoutStop}, api.CodeInvalidArgument, "without a timeout"},
		{WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 60, OnTimeout: "explode"}, api.CodeInvalidArgument, `on_timeout "explode" is not an action`},
		{WorkspaceSetTimeoutArgs{WorkspaceID: "ws-nope", TimeoutSeconds: 60}, api.CodeNotFound, "ws-nope"},
	} {
		if err := h.fail(c.code, OpWorkspaceSetTimeout, c.args); !strings.Contains(err.Message, c.msg) {
			t.Errorf("set-timeout %+v: %v, want %q", c.args, err, c.msg)
		}
	}
	v := h.ws(w.WorkspaceID).Version - 1
	h.fail(api.CodeVersionMismatch, OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 60}, withVersion(v))
	checkIndex(t, h.f)
}

// The action op is refused with its entry's time before the end (a
// leader whose clock runs ahead proposed it), and for an end that a
// set-timeout moved since the leader read it; at the end it applies once.
func TestTimedOutNeverEarly(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", withTimeout(10*time.Minute, api.TimeoutStop))
	end := endOf(t, h.ws(w.WorkspaceID))
	if d := h.due(end.Add(-time.Nanosecond)); len(d) != 0 {
		t.Fatalf("due before the end: %+v", d)
	}
	if d := h.due(end); len(d) != 1 || d[0].WorkspaceID != w.WorkspaceID || !d[0].EndsAt.Equal(end) || d[0].OnTimeout != api.TimeoutStop || d[0].Waits {
		t.Fatalf("due at the end: %+v", d)
	}
	early := WorkspaceTimedOutArgs{WorkspaceID: w.WorkspaceID, EndsAt: end}
	if err := h.expect(api.CodeFailedPrecondition, makeEntry(end.Add(-time.Millisecond), OpWorkspaceTimedOut, early)).Error; !strings.Contains(err.Message, "never fires early") {
		t.Fatalf("early: %v", err)
	}
	h.now = end.Add(-time.Minute)
	moved := decode[api.Workspace](t, h.ok(OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 120}))
	h.now = end.Add(time.Second)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceTimedOut, early); !strings.Contains(err.Message, "no longer ends at") {
		t.Fatalf("stale end: %v", err)
	}
	h.now = endOf(t, &moved)
	r := decode[TimedOut](t, h.ok(OpWorkspaceTimedOut, WorkspaceTimedOutArgs{WorkspaceID: w.WorkspaceID, EndsAt: h.now}))
	if r.Did != planStop || r.Workspace.State != api.WorkspaceStopping || r.Workspace.EndsAt != nil || r.Workspace.Pending == nil || r.Workspace.Pending.Kind != api.WSCmdStop {
		t.Fatalf("at the end: did %q %+v", r.Did, r.Workspace)
	}
	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpWorkspaceTimedOut, WorkspaceTimedOutArgs{WorkspaceID: w.WorkspaceID, EndsAt: endOf(t, &moved)})
	checkIndex(t, h.f)
}

// fire applies the timeout of Workspace id at its end and returns what it did.
func (h *harness) fire(id string) TimedOut {
	h.t.Helper()
	end := *h.ws(id).EndsAt
	if h.now.Before(end) {
		h.now = end
	}
	return decode[TimedOut](h.t, h.ok(OpWorkspaceTimedOut, WorkspaceTimedOutArgs{WorkspaceID: id, EndsAt: end}))
}

// What each action does by state: delete deletes whatever the state and
// keeps the Volumes; stop and pause wait while a command they cannot
// overtake is in flight, clear the end where there is nothing to do and
// otherwise stop (force for a FAILED Instance) or pause.
func TestTimedOutActions(t *testing.T) {
	t.Run("delete keeps the volumes", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		h.createVolume("v1", dataVol)
		a := mountWS("data")
		a.TimeoutSeconds = 60
		w := h.running("c1", a)
		fresh := w.Volumes[1].Name
		r := h.fire(w.WorkspaceID)
		if r.Did != planDelete || r.Workspace.State != api.WorkspaceDeleting || r.Workspace.EndsAt != nil {
			t.Fatalf("delete: did %q %+v", r.Did, r.Workspace)
		}
		if d := h.due(h.now.Add(time.Hour)); len(d) != 0 {
			t.Fatalf("a deleting Workspace is still due: %+v", d)
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got != nil {
			t.Fatalf("after the node's answer: %+v", got)
		}
		for _, v := range []string{"data", fresh} {
			if got := h.vol(v); got.State != api.VolumeAvailable || got.WorkspaceID != "" || got.Held {
				t.Errorf("volume %s after the timed-out delete: %+v", v, got)
			}
		}
		checkIndex(t, h.f)
	})
	t.Run("delete of a Workspace that runs nothing", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", withTimeout(time.Minute, ""))
		h.answer(w.WorkspaceID, OutcomeFailed, "no kernel")
		// Its layer's files go with its node.
		if r := h.fire(w.WorkspaceID); r.Did != planDelete || r.Workspace.State != api.WorkspaceDeleting || r.Workspace.Pending == nil {
			t.Fatalf("delete of a FAILED Workspace: did %q %+v", r.Did, r.Workspace)
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got != nil {
			t.Fatalf("after the node removed the files: %+v", got)
		}
		checkIndex(t, h.f)
	})
	t.Run("stop", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", withTimeout(time.Minute, api.TimeoutStop))
		h.now = endOf(t, &w)
		if d := h.due(h.now); len(d) != 1 || !d[0].Waits {
			t.Fatalf("a CREATING Workspace's stop does not wait: %+v", d)
		}
		h.fail(api.CodeFailedPrecondition, OpWorkspaceTimedOut, WorkspaceTimedOutArgs{WorkspaceID: w.WorkspaceID, EndsAt: h.now})
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if r := h.fire(w.WorkspaceID); r.Did != planStop || r.Workspace.State != api.WorkspaceStopping {
			t.Fatalf("stop once AVAILABLE: did %q %+v", r.Did, r.Workspace)
		}
		// Already STOPPED by hand: only the end goes.
		s := h.stopped("c2", withTimeout(time.Minute, api.TimeoutStop))
		if r := h.fire(s.WorkspaceID); r.Did != planClear || r.Workspace.State != api.WorkspaceStopped || r.Workspace.EndsAt != nil {
			t.Fatalf("stop of a STOPPED Workspace: did %q %+v", r.Did, r.Workspace)
		}
		checkIndex(t, h.f)
	})
	t.Run("pause", func(t *testing.T) {
		h := resumeHarness(t)
		w := h.running("c1", withTimeout(time.Minute, api.TimeoutPause))
		r := h.fire(w.WorkspaceID)
		if r.Did != planPause || r.Workspace.State != api.WorkspacePausing || r.Workspace.EndsAt != nil {
			t.Fatalf("pause: did %q %+v", r.Did, r.Workspace)
		}
		h.pauseAnswer(w.WorkspaceID)
		// Resumed, then paused by hand before the end: nothing to do.
		h.advance(time.Second)
		h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.answer(w.WorkspaceID, OutcomeOK, "")
		h.advance(time.Second)
		h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if d := h.due(h.ws(w.WorkspaceID).EndsAt.Add(time.Second)); len(d) != 1 || !d[0].Waits {
			t.Fatalf("a PAUSING Workspace's pause does not wait: %+v", d)
		}
		h.pauseAnswer(w.WorkspaceID)
		if r := h.fire(w.WorkspaceID); r.Did != planClear || r.Workspace.State != api.WorkspacePaused || r.Workspace.Snapshot == nil {
			t.Fatalf("pause of a PAUSED Workspace: did %q %+v", r.Did, r.Workspace)
		}
		checkIndex(t, h.f)
	})
}

// The index lists the ends soonest first and only those due; a state
// restored from a snapshot holds the same index, and one whose index an
// older build did not keep gets it built anew.
func TestEndsIndexOrderAndRestore(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	var ids []string
	for i, d := range []time.Duration{30 * time.Minute, 10 * time.Minute, 20 * time.Minute} {
		ids = append(ids, h.create(fmt.Sprintf("c%d", i), withTimeout(d, "")).WorkspaceID)
	}
	got := h.due(h.now.Add(25 * time.Minute))
	if len(got) != 2 || got[0].WorkspaceID != ids[1] || got[1].WorkspaceID != ids[2] {
		t.Fatalf("due in 25 minutes: %+v, want %s then %s", got, ids[1], ids[2])
	}
	if mustDump(t, restored(t, h.f)) != mustDump(t, h.f) {
		t.Fatal("a restored state differs from the one it was taken of")
	}
	// An older build changed an end without the index and moved the clock.
	if err := h.f.db.Update(func(tx *bolt.Tx) error {
		w, err := getWorkspace(tx, ids[0])
		if err != nil {
			return err
		}
		end := t0
		w.EndsAt = &end
		if err := putJSON(tx, bucketWorkspaces, wsKey(w.WorkspaceID), w); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keyClock, []byte(t0.Add(100*time.Hour).Format(time.RFC3339Nano)))
	}); err != nil {
		t.Fatal(err)
	}
	g := restored(t, h.f)
	if err := g.View(endsProblem); err != nil {
		t.Fatal(err)
	}
	var first []DueEnd
	g.View(func(tx *bolt.Tx) (err error) { first, err = DueEnds(tx, t0, 10); return })
	if len(first) != 1 || first[0].WorkspaceID != ids[0] {
		t.Fatalf("due after the rebuild: %+v", first)
	}
}

// Two replicas applying the same lifetime history reach byte-identical
// states, index included.
func TestLifetimesDeterministic(t *testing.T) {
	history := func(t *testing.T) string {
		h := resumeHarness(t)
		a := h.running("a", withTimeout(time.Minute, api.TimeoutPause))
		b := h.running("b", withTimeout(time.Hour, api.TimeoutStop))
		h.fire(a.WorkspaceID)
		h.pauseAnswer(a.WorkspaceID)
		h.advance(time.Second)
		h.ok(OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: b.WorkspaceID, TimeoutSeconds: 30})
		h.fire(b.WorkspaceID)
		h.answer(b.WorkspaceID, OutcomeOK, "")
		checkIndex(t, h.f)
		return mustDump(t, h.f)
	}
	if a, b := history(t), history(t); a != b {
		t.Fatal("two replicas of the same history differ")
	}
}

// endKey orders by time before id, whatever the ids.
func TestEndKeyOrder(t *testing.T) {
	early, late := endKey(t0, "ws-zzz"), endKey(t0.Add(time.Nanosecond), "ws-aaa")
	if bytes.Compare(early, late) >= 0 || binary.BigEndian.Uint64(early[:8]) != uint64(t0.UnixNano()) || !slices.Equal(early[8:], []byte("ws-zzz")) {
		t.Fatalf("end keys %x, %x", early, late)
	}
}

// drawTimeout gives a drawn create a timeout now and then, from the
// lifetime source so the rest of the log stays what it was.
func (g *logGen) drawTimeout(a *WorkspaceCreateArgs) {
	if g.lifes.Intn(100) < 40 {
		a.TimeoutSeconds = int64(1 + g.lifes.Intn(600))
		a.OnTimeout = []string{"", api.TimeoutDelete, api.TimeoutStop, api.TimeoutPause, "explode"}[g.lifes.Intn(5)]
	}
}

// drawLifetime draws the timeout of a Workspace whose end passed (as the
// leader's service proposes it, now and then with an end that is not
// its) or a set-timeout, now and then out of bounds.
func (g *logGen) drawLifetime() Entry {
	ws := g.workspaces()
	id := WorkspaceIDFor("ws-cmd-none")
	var ends *time.Time
	if len(ws) > 0 {
		w := ws[g.lifes.Intn(len(ws))]
		id, ends = w.WorkspaceID, w.EndsAt
		for _, c := range ws {
			if c.EndsAt != nil && !c.EndsAt.After(g.now) && g.lifes.Intn(100) < 70 {
				id, ends = c.WorkspaceID, c.EndsAt
				break
			}
		}
	}
	if ends != nil && g.lifes.Intn(100) < 70 {
		end := *ends
		if g.lifes.Intn(100) < 10 {
			end = end.Add(-time.Second)
		}
		e := makeEntry(g.now, OpWorkspaceTimedOut, WorkspaceTimedOutArgs{WorkspaceID: id, EndsAt: end})
		e.Actor = "ctrl"
		return e
	}
	a := WorkspaceSetTimeoutArgs{WorkspaceID: id, TimeoutSeconds: int64(g.lifes.Intn(900))}
	switch g.lifes.Intn(10) {
	case 0:
		a.TimeoutSeconds = -5
	case 1:
		a.OnTimeout = api.TimeoutPause
	case 2:
		a.OnTimeout = api.TimeoutStop
	}
	e := makeEntry(g.now, OpWorkspaceSetTimeout, a)
	e.Actor = "op"
	return e
}
