package fsm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// workspace.stop and workspace.start

func TestWorkspaceStopStart(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.running("c1", smallWS)
	id := w.WorkspaceID
	h.advance(time.Second)
	h.fail(api.CodeVersionMismatch, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version-1))
	h.fail(api.CodeVersionMismatch, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version+1))
	got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version))))
	if got.State != api.WorkspaceStopping || got.Pending == nil || got.Pending.Kind != api.WSCmdStop || got.Pending.NodeID != "node-a" ||
		got.Pending.InstanceID != w.InstanceID || got.NodeID != "node-a" || got.Version != w.Version+1 {
		t.Errorf("stopping: %+v pending %+v", got, got.Pending)
	}
	// Stop again while STOPPING: nothing to do.
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
	got = h.answer(id, OutcomeOK, "")
	if got.State != api.WorkspaceStopped || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || got.StopUnconfirmed ||
		*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
		t.Errorf("stopped: %+v layer %+v", got, got.Layer)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("holds after stop %+v", hd)
	}
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}))
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true}))

	// node-b has more room now, but the layer is on node-a.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 2000}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.advance(time.Second)
	h.fail(api.CodeVersionMismatch, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}, withVersion(got.Version-1))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-b"})
	h.fail(api.CodeNotFound, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: "ws-nope"})
	started := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}, withVersion(got.Version))))
	if started.State != api.WorkspaceStarting || started.NodeID != "node-a" || started.InstanceID == w.InstanceID ||
		started.InstanceID != instanceIDFor(id, 2) || started.Instances != 2 || !started.Layer.Held || started.Layer.NodeID != "node-a" ||
		started.Pending.Kind != api.WSCmdStart {
		t.Errorf("started: %+v", started)
	}
	got = h.answer(id, OutcomeOK, "")
	if got.State != api.WorkspaceAvailable || got.InstanceID != started.InstanceID {
		t.Errorf("available again: %+v", got)
	}
	// Start of an AVAILABLE Workspace where it runs: nothing to do.
	h.expectUnchanged(h.entry(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}))
	h.expectUnchanged(h.entry(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-a"}))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-b"})
	checkIndex(t, h.f)
}

func TestWorkspaceStopForce(t *testing.T) {
	t.Run("available", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		id := h.running("c1", smallWS).WorkspaceID
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})))
		if got.State != api.WorkspaceStopping || got.Pending.Kind != api.WSCmdStopForce {
			t.Errorf("stopping: %+v", got)
		}
		got = h.answer(id, OutcomeOK, "")
		if got.State != api.WorkspaceStopped || !got.StopUnconfirmed || got.InstanceID != "" || got.Layer.Held {
			t.Errorf("force-stopped: %+v", got)
		}
		h.advance(time.Second)
		h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
		if got := h.ws(id); got.StopUnconfirmed {
			t.Error("start kept stop_unconfirmed")
		}
	})
	t.Run("stop --force overtakes a normal stop", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		id := h.running("c1", smallWS).WorkspaceID
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
		normal := h.resultArgs(id, OutcomeOK, "")
		h.advance(time.Second)
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, normal)); decode[map[string]bool](t, r)["applied"] {
			t.Error("answer to the superseded stop applied")
		}
		if got := h.answer(id, OutcomeOK, ""); got.State != api.WorkspaceStopped || !got.StopUnconfirmed {
			t.Errorf("%+v", got)
		}
	})
	t.Run("creating", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		h.advance(time.Second)
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID, Force: true})
		// The node's late answer to the start is ignored.
		late := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeOK}
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, late)); decode[map[string]bool](t, r)["applied"] {
			t.Error("late start answer applied")
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceStopped || !got.StopUnconfirmed {
			t.Errorf("%+v", got)
		}
	})
}

// A FAILED Workspace whose Instance still holds resources: only stop --force
// ends it, and start says so.
func TestWorkspaceFailedWithInstance(t *testing.T) {
	for _, how := range []string{"stop failed", "no longer running"} {
		t.Run(how, func(t *testing.T) {
			h := newHarness(t)
			twoNodes(h)
			w := h.running("c1", smallWS)
			id := w.WorkspaceID
			var got *api.Workspace
			if how == "stop failed" {
				h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
				got = h.answer(id, OutcomeFailed, "guest did not shut down")
				if got.Failure == nil || got.Failure.Reason != api.FailureStop {
					t.Fatalf("%+v", got)
				}
			} else {
				h.advance(time.Second)
				h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
					InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: "killed by the OOM killer"}}})
				got = h.ws(id)
				if got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning || got.Failure.Message != "killed by the OOM killer" {
					t.Fatalf("%+v", got)
				}
			}
			if got.State != api.WorkspaceFailed || got.InstanceID != w.InstanceID || got.NodeID != "node-a" || !got.Layer.Held || got.Pending != nil {
				t.Errorf("failed: %+v", got)
			}
			if hd := h.holds("node-a"); hd.Instances != 1 || hd.Layers != 1 {
				t.Errorf("holds %+v", hd)
			}
			h.advance(time.Second)
			if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}); !strings.Contains(err.Message, "stop --force "+id) {
				t.Errorf("start error does not tell to stop --force: %s", err.Message)
			}
			if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}); !strings.Contains(err.Message, "stop --force") {
				t.Errorf("stop error does not tell to use --force: %s", err.Message)
			}
			h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
			got = h.answer(id, OutcomeOK, "")
			if got.State != api.WorkspaceStopped || got.Failure != nil || !got.StopUnconfirmed || got.InstanceID != "" {
				t.Errorf("after stop --force: %+v", got)
			}
			checkIndex(t, h.f)
		})
	}
}

// stop --force of a FAILED Workspace whose node no longer has the Instance
// (not taken over after a restart): ctrl releases what it held, the
// Workspace stays FAILED with its error and starts directly.
func TestWorkspaceStopForceInstanceGone(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.running("c1", smallWS)
	id := w.WorkspaceID
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
	h.answer(id, OutcomeFailed, "prepare guest stop: deadline_exceeded: the guest agent did not answer")
	h.advance(time.Second)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
	h.advance(time.Second)
	res := h.resultArgs(id, OutcomeOK, "")
	res.NotOnNode = true
	h.ok(OpWorkspaceResult, res)
	got := h.ws(id)
	if got.State != api.WorkspaceFailed || got.Failure == nil || !strings.HasPrefix(got.Failure.Message, "prepare guest stop:") ||
		got.InstanceID != "" || got.NodeID != "" || got.Layer.Held || !got.StopUnconfirmed || got.Pending != nil {
		t.Fatalf("after stop --force with the Instance gone from its node: %+v", got)
	}
	if hd := h.holds("node-a"); hd.Instances != 0 || hd.Layers != 0 {
		t.Errorf("holds after the release: %+v", hd)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
	if got := h.ws(id); got.State != api.WorkspaceStarting {
		t.Errorf("start of the released FAILED Workspace: %+v", got)
	}
	checkIndex(t, h.f)
}

// A VMM that host OOM killed: with OOMStops (every voter at
// LevelTroubleshooting) ctrl stops the Workspace itself (STOPPING with a
// stop --force for the node, then STOPPED and startable); an entry
// without it fails the Workspace as before the level, and so does any
// other unexpected exit.
func TestWorkspaceOOMKilledStops(t *testing.T) {
	for _, c := range []struct {
		name            string
		oomKilled, rule bool
	}{{"oom with the rule", true, true}, {"oom below the level", true, false}, {"other exit", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			twoNodes(h)
			w := h.running("c1", smallWS)
			h.advance(time.Second)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), OOMStops: c.rule,
				Report: api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
					InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: "node reports the Instance as no longer running: host OOM killed the VMM", OOMKilled: c.oomKilled}}}})
			got := h.ws(w.WorkspaceID)
			if !(c.oomKilled && c.rule) {
				if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning {
					t.Fatalf("%+v; want FAILED no longer running", got)
				}
				return
			}
			if got.State != api.WorkspaceStopping || got.Pending == nil || got.Pending.Kind != api.WSCmdStopForce || got.Pending.InstanceID != w.InstanceID ||
				got.Failure != nil || got.LastError == nil || !strings.Contains(got.LastError.Message, "host OOM killed the VMM") {
				t.Fatalf("after the OOM kill: %+v; want STOPPING by ctrl's own stop --force, the reason as last error", got)
			}
			got = h.answer(w.WorkspaceID, OutcomeOK, "")
			if got.State != api.WorkspaceStopped || got.InstanceID != "" || got.Layer.Held || !got.StopUnconfirmed || got.LastError == nil {
				t.Fatalf("after the node ended the Instance: %+v; want STOPPED, the reason kept", got)
			}
			h.advance(time.Second)
			h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
			checkIndex(t, h.f)
		})
	}
}

func TestWorkspaceInstanceFailedReport(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	a := h.running("c1", smallWS)               // node-a
	b := h.running("c2", smallWS)               // node-b
	c := h.create("c3", smallWS)                // node-a, CREATING
	d := h.running("c4", wsArgs(1000, 128<<20)) // node-b
	if a.NodeID != "node-a" || b.NodeID != "node-b" || c.NodeID != "node-a" || d.NodeID != "node-b" {
		t.Fatalf("fixture placement %s %s %s %s", a.NodeID, b.NodeID, c.NodeID, d.NodeID)
	}
	h.advance(time.Second)
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
		InstanceStates: []api.InstanceState{
			{InstanceID: a.InstanceID, State: "FAILED"},
			{InstanceID: b.InstanceID, State: "FAILED"}, // not node-a's: ignored
			{InstanceID: c.InstanceID, State: "FAILED"}, // not AVAILABLE: the start's answer decides
			{InstanceID: d.InstanceID, State: "RUNNING"},
			{InstanceID: "inst-unknown", State: "FAILED"},
		}})
	got := h.ws(a.WorkspaceID)
	if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning ||
		got.Failure.Message == "" || !got.Failure.At.Equal(h.now) || got.Version != a.Version+1 {
		t.Errorf("a: %+v", got)
	}
	for _, w := range []api.Workspace{b, c, d} {
		if got := h.ws(w.WorkspaceID); !reflect.DeepEqual(*got, w) {
			t.Errorf("%s changed: %+v", w.WorkspaceID, got)
		}
	}
	// An old Instance reported FAILED after a new start is ignored.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: b.WorkspaceID})
	h.answer(b.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: b.WorkspaceID})
	nb := h.answer(b.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	h.report("node-b", sessOf("node-b"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
		InstanceStates: []api.InstanceState{{InstanceID: b.InstanceID, State: "FAILED"}}})
	if got := h.ws(b.WorkspaceID); got.State != api.WorkspaceAvailable || got.Version != nb.Version {
		t.Errorf("old instance failed the new one: %+v", got)
	}
	checkIndex(t, h.f)
}

// ---------------------------------------------------------------------------
// workspace.delete

func TestWorkspaceDelete(t *testing.T) {
	t.Run("available", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.running("c1", smallWS)
		id := w.WorkspaceID
		h.advance(time.Second)
		h.fail(api.CodeVersionMismatch, OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version+1))
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version))))
		if got.State != api.WorkspaceDeleting || got.Pending == nil || got.Pending.Kind != api.WSCmdDelete || got.Pending.NodeID != "node-a" || got.Pending.InstanceID != w.InstanceID {
			t.Errorf("deleting: %+v", got)
		}
		h.expectUnchanged(h.entry(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}))
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
		if got := h.answer(id, OutcomeOK, ""); got != nil {
			t.Errorf("still stored: %+v", got)
		}
		if err := h.wsErr(id); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("holds %+v", hd)
		}
		h.fail(api.CodeNotFound, OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id})
		checkIndex(t, h.f)
	})
	t.Run("stopped: the layer's node deletes it", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.stopped("c1", smallWS)
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
		if got.State != api.WorkspaceDeleting || got.Pending == nil || got.Pending.NodeID != "node-a" || got.Pending.InstanceID != "" || got.NodeID != "" {
			t.Errorf("deleting: %+v pending %+v", got, got.Pending)
		}
		if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{w.WorkspaceID}) {
			t.Errorf("pending on node-a %v", p)
		}
		checkIndex(t, h.f)
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		if p := h.pendingOn("node-a"); len(p) != 0 {
			t.Errorf("pending on node-a %v", p)
		}
		checkIndex(t, h.f)
	})
	t.Run("a label named pending is no pending command", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		args := smallWS
		args.Labels = map[string]string{"pending": `"pending":{"node_id":"node-a"}`}
		w := h.stopped("c1", args)
		if p := h.pendingOn("node-a"); len(p) != 0 {
			t.Errorf("pending on node-a %v; the Workspace is stopped, no command waits", p)
		}
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{w.WorkspaceID}) {
			t.Errorf("pending on node-a %v after the delete", p)
		}
	})
	t.Run("never placed: gone at once", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		h.answer(w.WorkspaceID, OutcomeRefused, "drained") // FAILED, no layer
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
		if got.DeletedAt == nil || !got.DeletedAt.Equal(h.now) {
			t.Errorf("result %+v", got)
		}
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		checkIndex(t, h.f)
	})
	t.Run("delete failed", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.running("c1", smallWS)
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		got := h.answer(w.WorkspaceID, OutcomeFailed, "device busy")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Pending != nil {
			t.Errorf("%+v", got)
		}
		// Deleting again sends the delete again.
		h.advance(time.Second)
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		checkIndex(t, h.f)
	})
}

// Expected versions of start, stop and delete: a mismatch changes nothing.
func TestWorkspaceVersionMismatch(t *testing.T) {
	var w api.Workspace
	avail := func(h *harness) { twoNodes(h); w = h.running("c1", smallWS) }   // version 2
	stopped := func(h *harness) { twoNodes(h); w = h.stopped("c1", smallWS) } // version 4
	var cases []opCase
	for _, c := range []struct {
		op    string
		setup func(h *harness)
		v     uint64
	}{{OpWorkspaceStart, stopped, 4}, {OpWorkspaceStop, avail, 2}, {OpWorkspaceDelete, avail, 2}, {OpWorkspaceDelete, stopped, 4}} {
		for _, bad := range []uint64{0, c.v - 1, c.v + 1} {
			cases = append(cases, opCase{name: fmt.Sprintf("%s at %d expecting %d", c.op, c.v, bad), setup: c.setup,
				entry: func(h *harness) Entry {
					return h.entry(c.op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, withVersion(bad))
				}, code: api.CodeVersionMismatch})
		}
		cases = append(cases, opCase{name: fmt.Sprintf("%s at %d expecting it", c.op, c.v), setup: c.setup,
			entry: func(h *harness) Entry {
				return h.entry(c.op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, withVersion(c.v))
			}, check: func(t *testing.T, h *harness, r Result) {
				if got := decode[api.Workspace](t, r); got.Version != c.v+1 {
					t.Errorf("version %d, want %d", got.Version, c.v+1)
				}
			}})
	}
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// node.drain with Workspaces

func TestWorkspaceDrain(t *testing.T) {
	status := func(h *harness) string { h.t.Helper(); return h.node("node-a").Status }
	t.Run("stop", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.running("c1", smallWS)
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		// The node reports nothing yet: ctrl's own records keep it DRAINING.
		if s := status(h); s != api.NodeDraining {
			t.Fatalf("with a running Workspace: %s", s)
		}
		h.fail(api.CodeFailedPrecondition, OpNodeRetire, NodeArgs{NodeID: "node-a"})
		h.advance(time.Second)
		h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, smallWS, withCommand("c2"))
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("stopping: %s", s)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if s := status(h); s != api.NodeDrained {
			t.Errorf("stopped: %s", s)
		}
		// Its layer is still there, but no use right is held: start waits
		// for cancel-drain.
		h.advance(time.Second)
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"})
		h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("starting: %s", s)
		}
	})
	t.Run("delete", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		if s := status(h); s != api.NodeDraining {
			t.Fatalf("with a CREATING Workspace: %s", s)
		}
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("deleting: %s", s)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if s := status(h); s != api.NodeDrained {
			t.Errorf("deleted: %s", s)
		}
		// ListNodes derives the same.
		var l *api.NodeList
		h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListNodes(tx, 0, ""); return })
		for _, n := range l.Nodes {
			if n.NodeID == "node-a" && n.Status != api.NodeDrained {
				t.Errorf("listed %s", n.Status)
			}
		}
		h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"})
	})
}

// ---------------------------------------------------------------------------
// node.isolate with Workspaces

func TestWorkspaceIsolate(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	pinA := smallWS
	pinA.NodeID = "node-a"
	avail := h.running("c1", pinA)   // AVAILABLE on node-a
	creating := h.create("c2", pinA) // CREATING on node-a
	stopped := h.stopped("c3", pinA) // STOPPED, layer on node-a
	delStopped := h.stopped("c4", pinA)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: delStopped.WorkspaceID}) // DELETING, pending on node-a
	delRunning := h.running("c5", pinA)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: delRunning.WorkspaceID}) // DELETING, running on node-a
	stopping := h.running("c6", pinA)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopping.WorkspaceID}) // STOPPING on node-a
	pinB := smallWS
	pinB.NodeID = "node-b"
	other := h.running("c7", pinB)
	otherBefore := *h.ws(other.WorkspaceID)
	stoppedBefore := *h.ws(stopped.WorkspaceID)

	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	h.closeSession("node-a", sessOf("node-a"))
	h.advance(time.Second)
	r := h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	res := decode[api.IsolateResult](t, r)
	// Layers held: avail, creating, delRunning, stopping. Failed: avail,
	// creating, stopping. Commands: creating, delStopped, delRunning, stopping.
	if want := (api.IsolateResult{NodeID: "node-a", RetainedLayersReleased: 4, WorkspacesFailed: 3, CommandsFailed: 4}); res != want {
		t.Errorf("result %+v, want %+v", res, want)
	}
	for _, w := range []api.Workspace{avail, creating, stopping} {
		got := h.ws(w.WorkspaceID)
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureUnavailable || !got.Failure.At.Equal(h.now) ||
			got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || !got.StopUnconfirmed ||
			*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
			t.Errorf("%s after isolate: %+v layer %+v", w.WorkspaceID, got, got.Layer)
		}
	}
	// Their files are in node-a's private pool: the deletes wait for a
	// member of it (no record dropped, no file left behind).
	for _, w := range []api.Workspace{delStopped, delRunning} {
		if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceDeleting || got.Pending != nil || got.NodeID != "" || got.DeleteWaitsForPool != "node-a:default" {
			t.Errorf("DELETING %s after isolate: %+v", w.WorkspaceID, got)
		}
	}
	if got := h.ws(other.WorkspaceID); !reflect.DeepEqual(*got, otherBefore) {
		t.Errorf("node-b's Workspace changed: %+v", got)
	}
	if got := h.ws(stopped.WorkspaceID); !reflect.DeepEqual(*got, stoppedBefore) {
		t.Errorf("stopped Workspace changed: %+v", got)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("node-a holds %+v", hd)
	}
	if p := h.pendingOn("node-a"); len(p) != 0 {
		t.Errorf("pending on node-a %v", p)
	}
	if ids := h.listIDs(WorkspaceFilter{NodeID: "node-a"}); len(ids) != 0 {
		t.Errorf("listed on node-a %v", ids)
	}
	checkIndex(t, h.f)

	// The layer is in node-a's private pool: start waits for node-a.
	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: avail.WorkspaceID})
	// A FAILED Workspace without an Instance stops at once.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopping.WorkspaceID})
	if got := h.ws(stopping.WorkspaceID); got.State != api.WorkspaceStopped || got.Failure != nil || got.Pending != nil {
		t.Errorf("stop after isolate: %+v", got)
	}
	// node-a comes back with a new incarnation: its first report hands it
	// the waiting deletes.
	h.schedNode("node-a", 2, 4000, 8*gib)
	for _, w := range []api.Workspace{delStopped, delRunning} {
		if got := h.ws(w.WorkspaceID); got.Pending == nil || got.Pending.Kind != api.WSCmdDelete || got.Pending.NodeID != "node-a" || got.DeleteWaitsForPool != "" {
			t.Errorf("DELETING %s after node-a came back: %+v pending %+v", w.WorkspaceID, got, got.Pending)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("%s after node-a removed its files: %v", w.WorkspaceID, err)
		}
	}
	h.advance(time.Second)
	got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: avail.WorkspaceID})))
	if got.State != api.WorkspaceStarting || got.NodeID != "node-a" || got.StopUnconfirmed || got.Failure != nil || got.InstanceID == avail.InstanceID {
		t.Errorf("start after return: %+v", got)
	}
	checkIndex(t, h.f)
}
