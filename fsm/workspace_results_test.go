package fsm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// workspace.node_result for a start

func TestWorkspaceStartResult(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.create("c1", smallWS)
	got := h.answer(w.WorkspaceID, OutcomeOK, "")
	if got.State != api.WorkspaceAvailable || got.Pending != nil || got.Failure != nil || got.Version != 2 ||
		got.NodeID != "node-a" || got.InstanceID != w.InstanceID || !got.Layer.Held {
		t.Errorf("after ok: %+v", got)
	}
	checkIndex(t, h.f)
}

// A result that carries the node's report (level 10) leaves the state a
// result entry and then a report entry would: the same Workspace, the
// same node record, report version and time. A report of another node or
// session is refused with the result, and a report the FSM refuses leaves
// the result applied and says why.
func TestWorkspaceResultWithReport(t *testing.T) {
	started := func() (*harness, WorkspaceResultArgs, ReportArgs) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		h.advance(time.Second)
		rep := ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: api.Report{
			Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
			Allocated: api.Resources{CPU: 1000, MemoryBytes: gib}, Instances: 1,
			InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "RUNNING"}},
		}}
		return h, h.resultArgs(w.WorkspaceID, OutcomeOK, ""), rep
	}
	apart, res, rep := started()
	apart.ok(OpWorkspaceResult, res)
	apart.ok(OpNodeReport, rep)

	together, res, rep := started()
	res.Report = &rep
	got := decode[ResultReport](t, together.ok(OpWorkspaceResult, res))
	if got.ReportError != nil || got.Report == nil || got.Report.ReportVersion != apart.node("node-a").Report.ReportVersion {
		t.Fatalf("outcome %+v, report %+v: want the report stored as version %d", got, got.Report, apart.node("node-a").Report.ReportVersion)
	}
	if a, b := apart.dump(), together.dump(); a != b {
		t.Fatalf("a result with its report:\n%s\nthe two as entries of their own:\n%s", b, a)
	}

	for _, other := range []ReportArgs{
		{NodeID: "node-b", SessionID: sessOf("node-b")},
		{NodeID: "node-a", SessionID: "s-old"},
	} {
		h, res, rep := started()
		rep.NodeID, rep.SessionID = other.NodeID, other.SessionID
		res.Report = &rep
		if err := h.fail(api.CodeInvalidArgument, OpWorkspaceResult, res); !strings.Contains(err.Message, "carries a report of node "+other.NodeID+" (session "+other.SessionID+")") {
			t.Fatalf("a result with the report of %+v: %v", other, err)
		}
	}

	h, res, rep := started()
	before := h.node("node-a").Report.ReportVersion
	rep.Report.Pools = append(rep.Report.Pools, rep.Report.Pools...)
	res.Report = &rep
	got = decode[ResultReport](t, h.ok(OpWorkspaceResult, res))
	if got.ReportError == nil || !strings.Contains(got.ReportError.Message, "lists storage pool") || got.Report != nil {
		t.Fatalf("a result with a report listing a pool twice: %+v", got)
	}
	if w := h.ws(res.WorkspaceID); w.State != api.WorkspaceAvailable || h.node("node-a").Report.ReportVersion != before {
		t.Fatalf("after a refused report: workspace %s, report version %d (was %d): want the result applied and the report not", w.State, h.node("node-a").Report.ReportVersion, before)
	}
}

func TestWorkspaceRefused(t *testing.T) {
	t.Run("placed on the other node", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		first := w.InstanceID
		got := h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceCreating || got.NodeID != "node-b" || got.Instances != 2 || got.InstanceID == first ||
			got.InstanceID != instanceIDFor(w.WorkspaceID, 2) || got.Failure != nil {
			t.Errorf("after refusal: %+v", got)
		}
		if *got.Layer != (api.LayerRight{NodeID: "node-b", PoolID: api.PrivatePoolID("node-b"), Held: true}) {
			t.Errorf("layer %+v", got.Layer)
		}
		if p := got.Pending; p == nil || p.Kind != api.WSCmdStart || p.NodeID != "node-b" || !reflect.DeepEqual(p.Refused, []string{"node-a"}) ||
			p.InstanceID != got.InstanceID || p.CommandID != fmt.Sprintf("%s/%d", w.WorkspaceID, got.Version) {
			t.Errorf("pending %+v", p)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("node-a still holds %+v", hd)
		}
		// A late answer of node-a to its old command changes nothing.
		old := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeOK}
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, old)); decode[map[string]bool](t, r)["applied"] {
			t.Error("old answer applied")
		}
		// The right command id from the wrong node.
		wrong := h.resultArgs(w.WorkspaceID, OutcomeOK, "")
		wrong.NodeID, wrong.SessionID = "node-a", sessOf("node-a")
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, wrong)); decode[map[string]bool](t, r)["applied"] {
			t.Error("answer of the wrong node applied")
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceAvailable || got.NodeID != "node-b" {
			t.Errorf("after ok: %+v", got)
		}
		checkIndex(t, h.f)
	})
	t.Run("refused by two nodes, placed on the third", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		h.schedNode("node-c", 1, 2000, 4*gib) // least free room: last choice
		w := h.create("c1", smallWS)
		h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		got := h.answer(w.WorkspaceID, OutcomeRefused, "memory tight")
		if got.State != api.WorkspaceCreating || got.NodeID != "node-c" || got.Instances != 3 ||
			!reflect.DeepEqual(got.Pending.Refused, []string{"node-a", "node-b"}) ||
			*got.Layer != (api.LayerRight{NodeID: "node-c", PoolID: api.PrivatePoolID("node-c"), Held: true}) {
			t.Errorf("after two refusals: %+v pending %+v layer %+v", got, got.Pending, got.Layer)
		}
		got = h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart || got.Layer != nil || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
			t.Errorf("refused everywhere: %+v", got)
		}
		checkIndex(t, h.f)
	})
	t.Run("no other node", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		got := h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart ||
			!strings.Contains(got.Failure.Message, "node-a refused it (drained)") || !got.Failure.At.Equal(h.now) {
			t.Errorf("after refusal: %+v failure %+v", got, got.Failure)
		}
		if got.Layer != nil || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
			t.Errorf("refused create keeps %+v", got)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("holds %+v", hd)
		}
		// Started again it is placed anew, on any node.
		h.advance(time.Second)
		got2 := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
		if got2.State != api.WorkspaceStarting || got2.NodeID != "node-a" || got2.Failure != nil || got2.Instances != 2 {
			t.Errorf("start after refusal: %+v", got2)
		}
		checkIndex(t, h.f)
	})
	t.Run("start of a stopped Workspace refused: its layer pins it", func(t *testing.T) {
		h := newHarness(t)
		got := h.answer(startStoppedOnTwoNodes(h), OutcomeRefused, "memory tight")
		if got.State != api.WorkspaceFailed || got.Failure.Reason != api.FailureStart ||
			*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) || got.NodeID != "" || got.Pending != nil {
			t.Errorf("after refusal: %+v layer %+v", got, got.Layer)
		}
		checkIndex(t, h.f)
	})
}

// startStoppedOnTwoNodes starts a stopped Workspace on two nodes, its
// layer in node-a's private pool; it returns the Workspace.
func startStoppedOnTwoNodes(h *harness) string {
	twoNodes(h)
	w := h.stopped("c1", smallWS)
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	return w.WorkspaceID
}

// refuse answers the pending start with the node's refusal; exhausts is
// WorkspaceResultArgs.RefusalExhausts, which a leader sets from
// LevelRefusalExhausted on.
func (h *harness) refuse(id, why string, exhausts bool) *api.Workspace {
	h.t.Helper()
	h.advance(time.Second)
	a := h.resultArgs(id, OutcomeRefused, why)
	a.RefusalExhausts = exhausts
	if r := h.ok(OpWorkspaceResult, a); !decode[map[string]bool](h.t, r)["applied"] {
		h.t.Fatalf("refusal of %s not applied", id)
	}
	return h.ws(id)
}

// A node that refuses a start (memory tight, draining by its own, fresher
// account) has ctrl place the Workspace on another node; where none can
// take it, the Workspace has no room anywhere: FAILED with reason
// RESOURCE_EXHAUSTED, which the CLI ends with resource_exhausted (exit
// 15) like a create ctrl could place nowhere, not START_FAILED (13).
// Entries without RefusalExhausts (written below the level) apply as
// before.
func TestWorkspaceRefusalExhausts(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the Workspace whose start is pending.
		setup    func(h *harness) string
		refusals []string // the successive nodes' reasons
		exhausts bool
		// wantNode: placed there (CREATING/STARTING); "" with wantReason:
		// FAILED for that reason.
		wantNode, wantReason string
		wantMsg              []string
	}{
		{name: "create, no other node", setup: func(h *harness) string {
			oneNode(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg: []string{"node node-a refused to start it (host memory is tight) and no other node can take it: no admitted node is ready with room",
				"1 refused this placement", "kibo workspace start " + WorkspaceIDFor("c1") + " places it again"}},
		{name: "create, the other node drained", setup: func(h *harness) string {
			twoNodes(h)
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-b"})
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"node node-a is draining"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg:    []string{"node node-a refused to start it (node node-a is draining)", "1 drained", "1 refused this placement"}},
		{name: "create, another node fits", setup: func(h *harness) string {
			twoNodes(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true, wantNode: "node-b"},
		{name: "create, refused by both nodes", setup: func(h *harness) string {
			twoNodes(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"node node-a is draining", "host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg:    []string{"nodes node-a, node-b refused to start it (node-b: host memory is tight) and no other node can take it", "2 refused this placement"}},
		{name: "start of a stopped Workspace, its layer in the refusing node's pool", setup: startStoppedOnTwoNodes, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg: []string{"node node-a refused to start it (host memory is tight)",
				"standalone pool " + api.PrivatePoolID("node-a") + " of node node-a, the only node that can start it, which refused it"}},
		{name: "a fork only its source's node can restore", setup: func(h *harness) string {
			oneNode(h)
			h.resumer("node-a", canResume)
			h.poolCapacity("nfs", 100*gib)
			src := h.pausedWS("c1", smallWS)
			return h.create("f1", fork(src.WorkspaceID)).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted, wantMsg: []string{"node node-a refused to start it (host memory is tight)"}},
		{name: "an entry from below the level: START_FAILED", setup: func(h *harness) string {
			oneNode(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"},
			wantReason: api.FailureStart, wantMsg: []string{"node node-a refused it (host memory is tight) and no other node can take it"}},
		{name: "a stopped one from below the level: START_FAILED", setup: startStoppedOnTwoNodes, refusals: []string{"host memory is tight"},
			wantReason: api.FailureStart, wantMsg: []string{"which cannot now: refused this placement"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			id := tc.setup(h)
			var got *api.Workspace
			for _, why := range tc.refusals {
				got = h.refuse(id, why, tc.exhausts)
			}
			if tc.wantNode != "" {
				if got.NodeID != tc.wantNode || got.Failure != nil || got.Pending == nil || got.Pending.NodeID != tc.wantNode ||
					got.State != api.WorkspaceCreating {
					t.Fatalf("after the refusal: %+v pending %+v, want CREATING on %s", got, got.Pending, tc.wantNode)
				}
				checkIndex(t, h.f)
				return
			}
			if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != tc.wantReason || !got.Failure.At.Equal(h.now) {
				t.Fatalf("refused everywhere: %+v failure %+v, want FAILED %s", got, got.Failure, tc.wantReason)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(got.Failure.Message, m) {
					t.Errorf("failure message %q lacks %q", got.Failure.Message, m)
				}
			}
			if strings.ContainsAny(got.Failure.Message, "\r\n") {
				t.Errorf("failure message is not one line: %q", got.Failure.Message)
			}
			if got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || got.Layer != nil && got.Layer.Held {
				t.Errorf("refused everywhere, it keeps %+v layer %+v", got, got.Layer)
			}
			for _, n := range []string{"node-a", "node-b"} {
				if hd := h.holds(n); hd.Instances != 0 || hd.Layers != 0 || hd.Allocated != (api.Resources{}) {
					t.Errorf("%s still holds %+v", n, hd)
				}
			}
			checkIndex(t, h.f)
		})
	}
}

func TestWorkspaceStartFailed(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.create("c1", smallWS)
	got := h.answer(w.WorkspaceID, OutcomeFailed, "kernel panic")
	if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart || got.Failure.Message != "kernel panic" ||
		got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
		t.Errorf("after failed start: %+v", got)
	}
	if *got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
		t.Errorf("layer %+v, want kept and not held", got.Layer)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("holds %+v", hd)
	}
	// The layer pins the next start to node-a.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 3000}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID, NodeID: "node-b"})
	got = ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
	if got.State != api.WorkspaceStarting || got.NodeID != "node-a" || got.Failure != nil || got.InstanceID != instanceIDFor(w.WorkspaceID, 2) {
		t.Errorf("start after failure: %+v", got)
	}
	checkIndex(t, h.f)
}

func ptr[T any](v T) *T { return &v }

// Answers that are not the one ctrl waits for change nothing.
func TestWorkspaceResultIgnored(t *testing.T) {
	setup := func(h *harness) string {
		twoNodes(h)
		return h.create("c1", smallWS).WorkspaceID
	}
	notApplied := func(t *testing.T, h *harness, r Result) {
		if decode[map[string]bool](t, r)["applied"] {
			t.Errorf("applied: %s", r.Value)
		}
	}
	var id string
	args := func(mod func(a *WorkspaceResultArgs)) func(h *harness) Entry {
		return func(h *harness) Entry {
			a := h.resultArgs(id, OutcomeOK, "")
			mod(&a)
			return h.entry(OpWorkspaceResult, a)
		}
	}
	runCases(t, []opCase{
		{name: "old command id", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.CommandID = id + "/0" }), unchanged: true, check: notApplied},
		{name: "other workspace", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.WorkspaceID = "ws-nope" }), unchanged: true, check: notApplied},
		{name: "answered already", setup: func(h *harness) { id = setup(h); h.answer(id, OutcomeOK, "") },
			entry: func(h *harness) Entry {
				return h.entry(OpWorkspaceResult, WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: id, CommandID: id + "/1", Outcome: OutcomeFailed})
			}, unchanged: true, check: notApplied},
		// A node-originated write through a session that is not the live
		// one is refused like a report (and changes nothing).
		{name: "stale session", setup: func(h *harness) { id = setup(h); h.open("node-a", "s-new", 2) },
			entry: args(func(a *WorkspaceResultArgs) {}), code: api.CodeFailedPrecondition},
		{name: "closed session", setup: func(h *harness) { id = setup(h); h.closeSession("node-a", sessOf("node-a")) },
			entry: args(func(a *WorkspaceResultArgs) {}), code: api.CodeFailedPrecondition},
		{name: "unknown node", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.NodeID = "node-x" }), code: api.CodeNotFound},
		{name: "live session after a reconnect", setup: func(h *harness) { id = setup(h); h.open("node-a", "s-new", 2) },
			entry: args(func(a *WorkspaceResultArgs) { a.SessionID = "s-new" }), check: func(t *testing.T, h *harness, r Result) {
				if !decode[map[string]bool](t, r)["applied"] || h.ws(id).State != api.WorkspaceAvailable {
					t.Errorf("answer through the new session: %s %+v", r.Value, h.ws(id))
				}
			}},
	})
}
