package fsm

import (
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

var testCompat = api.SnapshotCompat{InstallationID: "sha256-a", QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", MemoryMiB: 1024, VCPUs: 1, Devices: []string{"layer", "net"}}

// resumer reports a VMM that can restore testCompat snapshots.
func (h *harness) resumer(node string, r *api.ResumeInfo) {
	h.t.Helper()
	rep := poolReport("nfs", gib, nfsPool)
	rep.Resume = r
	h.report(node, sessOf(node), rep)
}

var canResume = &api.ResumeInfo{QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}}

// resumeHarness: node-a alone, whose VMM restores testCompat snapshots,
// and the shared pool nfs of 100 GiB.
func resumeHarness(t *testing.T) *harness {
	h := newHarness(t)
	oneNode(h)
	h.resumer("node-a", canResume)
	h.poolCapacity("nfs", 100*gib)
	return h
}

// pauseAnswer answers the pending pause with a snapshot of 300 MiB.
func (h *harness) pauseAnswer(id string) *api.Workspace {
	h.t.Helper()
	h.advance(time.Second)
	a := h.resultArgs(id, OutcomeOK, "")
	a.Snapshot = &api.SnapshotReport{SizeBytes: 300 << 20, Compat: testCompat}
	h.ok(OpWorkspaceResult, a)
	return h.ws(id)
}

// Pause saves a running Workspace into a snapshot beside its layer and
// frees its node; a start resumes it only on a node whose VMM can
// restore it; a failed pause leaves it running; a stop discards the
// snapshot, whose files go with the next start.
func TestPauseResume(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.resumer("node-a", canResume)
	h.resumer("node-b", &api.ResumeInfo{QEMUVersion: "8.0.0", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}})
	h.poolCapacity("nfs", 100*gib)
	pin := smallWS
	pin.NodeID = "node-a"
	w := h.running("c1", pin)
	h.fail(api.CodeNotFound, OpWorkspacePause, WorkspaceArgs{WorkspaceID: "ws-nope"})
	h.advance(time.Second)
	p := decode[api.Workspace](t, h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if p.State != api.WorkspacePausing || p.Pending == nil || p.Pending.Kind != api.WSCmdPause || p.Pending.NodeID != "node-a" {
		t.Fatalf("pause accepted: %+v pending %+v", p, p.Pending)
	}
	if u := h.pool("nfs").UsedBytes; u != gib+gib {
		t.Errorf("the guest's memory is not reserved for the snapshot: used %d", u)
	}
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	// A pause that could not save the guest: it runs on.
	h.advance(time.Second)
	h.ok(OpWorkspaceResult, h.resultArgs(w.WorkspaceID, OutcomeFailed, "qmp migrate: no space"))
	if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceAvailable || got.LastError == nil || !strings.Contains(got.LastError.Message, "no space") || got.InstanceID != w.InstanceID {
		t.Fatalf("after a failed pause: %+v last error %+v", got, got.LastError)
	}
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	got := h.pauseAnswer(w.WorkspaceID)
	if got.State != api.WorkspacePaused || got.NodeID != "" || got.InstanceID != "" || got.Layer.Held || got.Snapshot == nil ||
		got.Snapshot.NodeID != "node-a" || got.Snapshot.InstanceID != w.InstanceID || got.Snapshot.SizeBytes != 300<<20 || got.LastError != nil {
		t.Fatalf("after the pause: %+v snapshot %+v", got, got.Snapshot)
	}
	if hd := h.holds("node-a"); hd.Instances != 0 || hd.Allocated.CPU != 0 {
		t.Errorf("a paused Workspace still holds node-a: %+v", hd)
	}
	if u := h.pool("nfs").UsedBytes; u != gib+300<<20 {
		t.Errorf("pool use with the snapshot: %d", u)
	}
	// node-b's QEMU differs: never tried, even when asked for.
	h.advance(time.Second)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID, NodeID: "node-b"}); !strings.Contains(err.Message, "node node-b cannot take this Workspace: it cannot resume the snapshot: its QEMU is 8.0.0, the snapshot's 7.2.9") {
		t.Errorf("resume on an incompatible node: %v", err)
	}
	r := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if r.State != api.WorkspaceStarting || r.NodeID != "node-a" || r.Snapshot == nil {
		t.Fatalf("resume: %+v", r)
	}
	var ts *api.TaskSnapshot = TaskSnapshot(&r)
	if ts == nil || ts.Discard || ts.Compat.QEMUVersion != "7.2.9" {
		t.Errorf("the start task's snapshot %+v", ts)
	}
	// A resume that failed without discarding the snapshot: PAUSED again.
	h.advance(time.Second)
	h.ok(OpWorkspaceResult, h.resultArgs(w.WorkspaceID, OutcomeFailed, "storage pool is unavailable"))
	if got := h.ws(w.WorkspaceID); got.State != api.WorkspacePaused || got.Snapshot == nil || got.LastError == nil {
		t.Fatalf("after a failed resume: %+v", got)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceAvailable || got.Snapshot != nil {
		t.Fatalf("after the resume: %+v", got)
	}
	if u := h.pool("nfs").UsedBytes; u != gib {
		t.Errorf("pool use after the resume: %d", u)
	}
	checkIndex(t, h.f)

	// Paused, then stopped: the snapshot is discarded; the next start
	// boots afresh and its node removes the files.
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.pauseAnswer(w.WorkspaceID)
	h.advance(time.Second)
	s := decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if s.State != api.WorkspaceStopped || s.Snapshot == nil || !s.Snapshot.Discarded {
		t.Fatalf("stop of a paused Workspace: %+v", s)
	}
	h.advance(time.Second)
	st := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID, NodeID: "node-b"}))
	if ts := TaskSnapshot(&st); st.NodeID != "node-b" || ts == nil || !ts.Discard {
		t.Fatalf("start after a discarded snapshot: %+v task snapshot %+v", st, ts)
	}
	if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.Snapshot != nil {
		t.Errorf("the discarded snapshot outlived the start: %+v", got.Snapshot)
	}
	checkIndex(t, h.f)
}

// A VMM killed during the pause: the Workspace can start again at once
// (cold); a resume whose snapshot the node found torn boots afresh next.
func TestPauseAndResumeFailures(t *testing.T) {
	h := resumeHarness(t)
	w := h.running("c1", smallWS)
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	a := h.resultArgs(w.WorkspaceID, OutcomeFailed, "qmp: connection reset: the VMM ended")
	a.InstanceGone = true
	h.advance(time.Second)
	h.ok(OpWorkspaceResult, a)
	got := h.ws(w.WorkspaceID)
	if got.State != api.WorkspaceFailed || got.InstanceID != "" || got.Snapshot != nil {
		t.Fatalf("after the VMM died during the pause: %+v", got)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.pauseAnswer(w.WorkspaceID)
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	a = h.resultArgs(w.WorkspaceID, OutcomeFailed, "snapshot state checksum mismatch")
	a.SnapshotDiscarded = true
	h.advance(time.Second)
	h.ok(OpWorkspaceResult, a)
	if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceFailed || got.Snapshot != nil {
		t.Fatalf("after a torn snapshot: %+v", got)
	}
	// A pause without room for the guest's memory in the pool.
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "nfs", CapacityBytes: gib + 100<<20})
	h.fail(api.CodeResourceExhausted, OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	checkIndex(t, h.f)
}
