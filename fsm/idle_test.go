package fsm

import (
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// withIdle is a create of smallWS with an idle timeout.
func withIdle(d time.Duration) WorkspaceCreateArgs {
	a := smallWS
	a.IdleTimeoutSeconds = int64(d / time.Second)
	return a
}

// reportIdle has node-a report its Instances idle for the seconds given
// (0: in use), as of the harness's time.
func (h *harness) reportIdle(idle map[string]int64) {
	h.t.Helper()
	h.advance(time.Second)
	rep := poolReport("nfs", gib, nfsPool)
	rep.Resume = canResume
	for inst, s := range idle {
		rep.InstanceStates = append(rep.InstanceStates, api.InstanceState{InstanceID: inst, State: "RUNNING", IdleSeconds: s})
	}
	h.report("node-a", sessOf("node-a"), rep)
}

func (h *harness) idleDue(now time.Time) []IdleCandidate {
	h.t.Helper()
	var out []IdleCandidate
	if err := h.f.View(func(tx *bolt.Tx) (err error) { out, err = IdleDue(tx, now, 100); return }); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// A Workspace whose node reports it idle at least its idle timeout is
// paused once, and counted; the op is refused while it is in use, not
// idle long enough by the entry's time, on a stale report, for an
// Instance that is no longer its, and for a Workspace without the
// timeout. The leader's reading (IdleDue) lists only the due ones.
func TestIdlePause(t *testing.T) {
	h := resumeHarness(t)
	w := h.running("c1", withIdle(10*time.Minute))
	if w.IdleTimeoutSeconds != 600 {
		t.Fatalf("created with an idle timeout of 10m: %d s", w.IdleTimeoutSeconds)
	}
	plain := h.running("c2", smallWS)
	args := WorkspaceIdlePauseArgs{WorkspaceID: w.WorkspaceID, InstanceID: w.InstanceID}
	refused := func(msg string, a WorkspaceIdlePauseArgs) {
		t.Helper()
		if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceIdlePause, a); !strings.Contains(err.Message, msg) {
			t.Fatalf("refusal %q, want it to say %q", err.Message, msg)
		}
	}

	h.reportIdle(map[string]int64{w.InstanceID: 0, plain.InstanceID: 3600})
	refused("reports instance "+w.InstanceID+" in use", args)
	refused("has no idle timeout", WorkspaceIdlePauseArgs{WorkspaceID: plain.WorkspaceID, InstanceID: plain.InstanceID})
	if due := h.idleDue(h.now); len(due) != 0 {
		t.Fatalf("due while in use: %+v", due)
	}

	// Idle 9 minutes at the report: 59 s later it is not yet due, at 60 s it is.
	h.reportIdle(map[string]int64{w.InstanceID: 540})
	reported := h.now
	h.advance(59 * time.Second)
	refused("less than its idle timeout", args)
	if due := h.idleDue(h.now); len(due) != 0 {
		t.Fatalf("due 1 s early: %+v", due)
	}
	if v := viewWS(t, h, w.WorkspaceID).Idle; v == nil || v.Seconds != 540 || !v.ReportedAt.Equal(reported) {
		t.Fatalf("get shows idle %+v, want 540 s as of %s", v, reported)
	}
	refused("no longer runs instance", WorkspaceIdlePauseArgs{WorkspaceID: w.WorkspaceID, InstanceID: "inst-old"})
	h.advance(time.Second)
	due := h.idleDue(h.now)
	if len(due) != 1 || due[0].WorkspaceID != w.WorkspaceID || due[0].InstanceID != w.InstanceID || !due[0].IdleSince.Equal(reported.Add(-540*time.Second)) {
		t.Fatalf("due: %+v, want %s idle since %s", due, w.WorkspaceID, reported.Add(-540*time.Second))
	}
	r := decode[IdlePaused](t, h.ok(OpWorkspaceIdlePause, args))
	if r.Workspace.State != api.WorkspacePausing || r.Workspace.Pending == nil || r.Workspace.Pending.Kind != api.WSCmdPause || r.IdleSeconds != 600 {
		t.Fatalf("idle pause: %+v idle %d s", r.Workspace, r.IdleSeconds)
	}
	refused("PAUSING", args)
	if due := h.idleDue(h.now); len(due) != 0 {
		t.Fatalf("due while PAUSING: %+v", due)
	}
	if p := h.pauseAnswer(w.WorkspaceID); p.State != api.WorkspacePaused {
		t.Fatalf("after the node's answer: %s", p.State)
	}
	var figs []NamespaceFigures
	if err := h.f.View(func(tx *bolt.Tx) (err error) { figs, err = NamespaceMetrics(tx); return }); err != nil {
		t.Fatal(err)
	}
	if got := figs[0].Counters.Timeouts[idleCounter]; got != 1 {
		t.Fatalf("idle pauses counted: %d, want 1", got)
	}
	h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, withIdle(-time.Second), withCommand("c3"))

	// A report older than a node's refresh allows is not trusted: the
	// node stopped reporting, and a connection may have begun since.
	w3 := h.running("c4", withIdle(time.Minute))
	h.reportIdle(map[string]int64{w3.InstanceID: 3600})
	h.advance(idleReportFresh + time.Second)
	refused("waits for a fresh report", WorkspaceIdlePauseArgs{WorkspaceID: w3.WorkspaceID, InstanceID: w3.InstanceID})
	if due := h.idleDue(h.now); len(due) != 0 {
		t.Fatalf("due on a stale report: %+v", due)
	}
	checkIndex(t, h.f)
}

func viewWS(t *testing.T, h *harness, id string) *api.Workspace {
	t.Helper()
	var w *api.Workspace
	if err := h.f.View(func(tx *bolt.Tx) (err error) { w, err = ViewWorkspace(tx, id); return }); err != nil {
		t.Fatal(err)
	}
	return w
}

// drawIdleTimeout gives a drawn create an idle timeout now and then, from
// the idle source so the rest of the log stays what it was.
func (g *logGen) drawIdleTimeout(a *WorkspaceCreateArgs) {
	if g.idles.Intn(100) < 50 {
		a.IdleTimeoutSeconds = int64(g.idles.Intn(900)) - 5 // now and then negative: refused
	}
}

// drawIdle draws what the node and the leader's service do for an idle
// pause: the node's report (its stored one, with a Workspace's Instance
// idle for a drawn time, now and then in use) and, usually, the idle
// pause the leader proposes, now and then for an Instance that is not
// the Workspace's.
func (g *logGen) drawIdle() []Entry {
	// Mostly the AVAILABLE ones with an idle timeout: the others are
	// refused, which a few draws show.
	var cands []api.Workspace
	due := g.idles.Intn(100) < 80
	for _, w := range g.workspaces() {
		if w.InstanceID != "" && w.NodeID != "" && (!due || w.IdleTimeoutSeconds > 0 && w.State == api.WorkspaceAvailable) {
			cands = append(cands, w)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	w := cands[g.idles.Intn(len(cands))]
	var out []Entry
	var n api.Node
	g.ref.View(func(tx *bolt.Tx) error { _, err := getJSON(tx, bucketNodes, []byte(w.NodeID), &n); return err })
	if n.Report != nil && n.Session != nil && g.idles.Intn(100) < 70 {
		rep := *n.Report
		rep.ReportVersion, rep.ReportedAt = 0, time.Time{}
		idle := w.IdleTimeoutSeconds + int64(g.idles.Intn(60)) - 10 // now and then short of it
		if g.idles.Intn(100) < 15 {
			idle = 0
		}
		rep.InstanceStates = slices.DeleteFunc(slices.Clone(rep.InstanceStates), func(st api.InstanceState) bool { return st.InstanceID == w.InstanceID })
		rep.InstanceStates = append(rep.InstanceStates, api.InstanceState{InstanceID: w.InstanceID, State: "RUNNING", IdleSeconds: idle})
		e := makeEntry(g.now, OpNodeReport, ReportArgs{NodeID: w.NodeID, SessionID: n.Session.SessionID, Report: rep})
		e.Actor = w.NodeID
		out = append(out, e)
	}
	if g.idles.Intn(100) < 15 {
		// set-timeout of the idle timeout, alone or with the timeout,
		// now and then out of bounds.
		idle := int64(g.idles.Intn(900)) - 5
		a := WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, KeepTimeout: g.idles.Intn(2) == 0, IdleTimeoutSeconds: &idle}
		if !a.KeepTimeout {
			a.TimeoutSeconds = int64(g.idles.Intn(900))
		}
		e := makeEntry(g.now, OpWorkspaceSetTimeout, a)
		e.Actor = "op"
		return append(out, e)
	}
	inst := w.InstanceID
	if g.idles.Intn(100) < 10 {
		inst = instanceIDFor(w.WorkspaceID, w.Instances+1)
	}
	e := makeEntry(g.now, OpWorkspaceIdlePause, WorkspaceIdlePauseArgs{WorkspaceID: w.WorkspaceID, InstanceID: inst})
	e.Actor = "ctrl"
	return append(out, e)
}

// set-timeout changes the idle timeout alone (the timeout and its end
// stay) or with the timeout; 0 removes it; bad arguments change nothing.
func TestSetIdleTimeout(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	a := withTimeout(time.Hour, api.TimeoutStop)
	a.IdleTimeoutSeconds = 600
	w := h.running("c1", a)
	secs := func(s int64) *int64 { return &s }
	set := func(args WorkspaceSetTimeoutArgs) api.Workspace {
		t.Helper()
		h.advance(time.Minute)
		args.WorkspaceID = w.WorkspaceID
		return decode[api.Workspace](t, h.ok(OpWorkspaceSetTimeout, args))
	}
	got := set(WorkspaceSetTimeoutArgs{KeepTimeout: true, IdleTimeoutSeconds: secs(120)})
	if got.IdleTimeoutSeconds != 120 || got.TimeoutSeconds != 3600 || got.OnTimeout != api.TimeoutStop || !endOf(t, &got).Equal(endOf(t, &w)) {
		t.Fatalf("idle only: %+v ends %v, want idle 120 s and the end kept", got, got.EndsAt)
	}
	got = set(WorkspaceSetTimeoutArgs{TimeoutSeconds: 300, IdleTimeoutSeconds: secs(0)})
	if got.IdleTimeoutSeconds != 0 || got.TimeoutSeconds != 300 || !endOf(t, &got).Equal(h.now.Add(5*time.Minute)) {
		t.Fatalf("timeout 5m, idle 0: %+v ends %v", got, got.EndsAt)
	}
	got = set(WorkspaceSetTimeoutArgs{TimeoutSeconds: 600})
	if got.IdleTimeoutSeconds != 0 || got.TimeoutSeconds != 600 {
		t.Fatalf("timeout alone: %+v", got)
	}
	for _, c := range []struct {
		args WorkspaceSetTimeoutArgs
		msg  string
	}{
		{WorkspaceSetTimeoutArgs{KeepTimeout: true}, "give one or the other"},
		{WorkspaceSetTimeoutArgs{KeepTimeout: true, TimeoutSeconds: 60, IdleTimeoutSeconds: secs(60)}, "leave keep_timeout out"},
		{WorkspaceSetTimeoutArgs{KeepTimeout: true, IdleTimeoutSeconds: secs(-1)}, "negative"},
	} {
		c.args.WorkspaceID = w.WorkspaceID
		if err := h.fail(api.CodeInvalidArgument, OpWorkspaceSetTimeout, c.args); !strings.Contains(err.Message, c.msg) {
			t.Errorf("refusal %q, want it to say %q", err.Message, c.msg)
		}
	}
	checkIndex(t, h.f)
}
