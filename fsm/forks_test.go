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

// fork is a create --from with labels.
func fork(src string) WorkspaceCreateArgs {
	return WorkspaceCreateArgs{From: src, Labels: map[string]string{"fork": "yes"}}
}

// pausedWS creates, runs and pauses a Workspace on node-a.
func (h *harness) pausedWS(cmd string, a WorkspaceCreateArgs) *api.Workspace {
	h.t.Helper()
	a.NodeID = "node-a"
	w := h.running(cmd, a)
	h.advance(time.Second)
	h.ok(OpWorkspacePause, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	return h.pauseAnswer(w.WorkspaceID)
}

// create --from refuses, changing nothing, a source it cannot fork and
// flags a snapshot cannot be restored with.
func TestForkRefusals(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.resumer("node-a", canResume)
	h.poolCapacity("nfs", 100*gib)
	h.createVolume("v1", dataVol)
	running := h.running("c1", smallWS)
	withVol := smallWS
	withVol.Volumes = []api.VolumeAttach{{Volume: "data", Path: "/data"}}
	vols := h.pausedWS("c2", withVol)
	src := h.pausedWS("c3", smallWS)
	stopped := h.pausedWS("c4", smallWS)
	h.advance(time.Second)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopped.WorkspaceID})

	override := func(f func(*WorkspaceCreateArgs)) WorkspaceCreateArgs { a := fork(src.WorkspaceID); f(&a); return a }
	for _, c := range []struct {
		name string
		args WorkspaceCreateArgs
		code api.Code
		msg  string
	}{
		{"unknown source", fork("ws-nope"), api.CodeNotFound, "workspace ws-nope does not exist"},
		{"source running", fork(running.WorkspaceID), api.CodeFailedPrecondition, "is AVAILABLE: a fork needs it PAUSED with its snapshot"},
		{"snapshot discarded by a stop", fork(stopped.WorkspaceID), api.CodeFailedPrecondition, "is STOPPED: a fork needs it PAUSED with its snapshot; start it"},
		{"source with Volumes", fork(vols.WorkspaceID), api.CodeFailedPrecondition, "has 1 Volumes attached"},
		{"memory override", override(func(a *WorkspaceCreateArgs) { a.MemoryBytes = 2 * gib }), api.CodeInvalidArgument, "a snapshot restores only into the vCPUs and memory it was saved with"},
		{"cpu override", override(func(a *WorkspaceCreateArgs) { a.CPU = 2000 }), api.CodeInvalidArgument, "leave --cpu and --memory out"},
		{"other template", override(func(a *WorkspaceCreateArgs) { a.Template = "debian-12" }), api.CodeInvalidArgument, "runs its template kibotos-coding"},
		{"volumes given", override(func(a *WorkspaceCreateArgs) { a.NewVolumes = []api.NewVolume{{SizeBytes: gib, Path: "/x"}} }), api.CodeInvalidArgument, "takes no --volume"},
	} {
		h.advance(time.Second)
		err := h.fail(c.code, OpWorkspaceCreate, c.args, withCommand("fork-"+c.name))
		if !strings.Contains(err.Message, c.msg) {
			t.Errorf("%s: %s, want it to say %q", c.name, err.Message, c.msg)
		}
	}
	// Same values as the source's are no override.
	same := override(func(a *WorkspaceCreateArgs) {
		a.Template, a.CPU, a.MemoryBytes = src.Template, src.CPU, src.MemoryBytes
	})
	if f := h.create("fork-same", same); f.ForkedFrom != src.WorkspaceID {
		t.Errorf("fork with the source's own values: %+v", f)
	}
	checkIndex(t, h.f)
}

// A fork refused for room is named by its source: the fork's own id was
// never shown to its user.
func TestForkOnFullHost(t *testing.T) {
	h := resumeHarness(t)
	h.report("node-a", sessOf("node-a"), poolReport("usb", gib, usbPool))
	h.poolCapacity("usb", 10*gib)
	src := h.pausedWS("c1", smallWS)
	h.running("c2", wsArgs(4000, gib)) // every CPU of node-a
	err := h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, fork(src.WorkspaceID), withCommand("f1"))
	if want := "a fork of workspace " + src.WorkspaceID + ": the layer it forks is in standalone pool usb of node node-a, the only node that can start it, which has no room for it now: not enough CPU"; !strings.HasPrefix(err.Message, want) {
		t.Errorf("fork on a full host: %v, want %q", err, want)
	}
}

// The level the leader checks before it proposes a create --from.
func TestForkLevel(t *testing.T) {
	if LevelForks > FeatureLevel {
		t.Fatalf("LevelForks %d above this build's level %d", LevelForks, FeatureLevel)
	}
	err := CheckLevel("workspace create --from", LevelForks, []MemberLevel{{NodeID: "ctrl-1", Level: FeatureLevel}, {NodeID: "ctrl-2", Level: LevelForks - 1, Release: "v0.5.0"}})
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "workspace create --from needs every ctrl voter at feature level 6, and voter ctrl-2 runs v0.5.0 at level 5") {
		t.Errorf("a voter below LevelForks: %v", err)
	}
}

// A fork is placed like a resume (only where the snapshot restores), its
// first start restores the source's snapshot with the source's shape, and
// the source waits meanwhile; afterwards either goes its own way.
func TestFork(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.resumer("node-a", canResume)
	h.resumer("node-b", &api.ResumeInfo{QEMUVersion: "8.0.0", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}})
	h.poolCapacity("nfs", 100*gib)
	src := h.pausedWS("c1", wsArgs(2000, 2*gib))
	used := h.pool("nfs").UsedBytes
	// node-b reaches the pool but its QEMU differs: never tried.
	pin := fork(src.WorkspaceID)
	pin.NodeID = "node-b"
	h.advance(time.Second)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, pin, withCommand("f0")); !strings.Contains(err.Message, "node node-b cannot take this Workspace: it cannot resume the snapshot: its QEMU is 8.0.0") {
		t.Errorf("fork pinned to an incompatible node: %s", err.Message)
	}

	f := h.create("f1", fork(src.WorkspaceID))
	ts := TaskSnapshot(&f)
	switch {
	case f.State != api.WorkspaceCreating || f.NodeID != "node-a" || f.ForkedFrom != src.WorkspaceID:
		t.Fatalf("fork: %+v", f)
	case f.Template != src.Template || f.CPU != 2000 || f.MemoryBytes != 2*gib || f.Labels["fork"] != "yes" || f.Volumes != nil:
		t.Errorf("fork's shape: %+v", f)
	case f.Layer == nil || f.Layer.PoolID != src.Layer.PoolID || !f.Layer.Held || f.Layer.SizeBytes != src.Layer.SizeBytes:
		t.Errorf("fork's layer right %+v, the source's %+v", f.Layer, src.Layer)
	case ts == nil || ts.Discard || ts.From != src.WorkspaceID || ts.FromInstance != src.Snapshot.InstanceID || ts.Compat.QEMUVersion != "7.2.9":
		t.Errorf("the fork's start task snapshot: %+v", ts)
	}
	if u := h.pool("nfs").UsedBytes; u != used+src.Layer.SizeBytes {
		t.Errorf("pool use %d after the fork, %d before: want one more layer and no second snapshot", u, used)
	}
	if got := h.ws(src.WorkspaceID); got.State != api.WorkspacePaused || got.Snapshot == nil || got.Snapshot.Discarded {
		t.Fatalf("the source after a fork: %+v", got)
	}
	checkIndex(t, h.f)
	// Its files are read by the fork's start: the source waits.
	for _, op := range []string{OpWorkspaceStart, OpWorkspaceStop, OpWorkspaceDelete} {
		h.advance(time.Second)
		if err := h.fail(api.CodeFailedPrecondition, op, WorkspaceArgs{WorkspaceID: src.WorkspaceID}); !strings.Contains(err.Message, "is being forked by "+f.WorkspaceID) {
			t.Errorf("%s of the source while forked: %s", op, err.Message)
		}
	}
	// A second fork of the same pause meanwhile is fine.
	f2 := h.create("f2", fork(src.WorkspaceID))
	if got := h.answer(f.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceAvailable || got.Snapshot != nil || got.ForkedFrom != src.WorkspaceID {
		t.Fatalf("the fork after its first start: %+v", got)
	}
	h.advance(time.Second)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: src.WorkspaceID}); !strings.Contains(err.Message, f2.WorkspaceID) {
		t.Errorf("start of the source while its second fork starts: %s", err.Message)
	}
	// The second's first restore fails: FAILED, its snapshot discarded,
	// the source free again.
	got := h.answer(f2.WorkspaceID, OutcomeFailed, "restore: qmp: load failed")
	if got.State != api.WorkspaceFailed || got.Snapshot == nil || !got.Snapshot.Discarded || !strings.Contains(got.Failure.Message, "first restore of this fork") {
		t.Fatalf("a fork whose first restore failed: %+v", got)
	}
	if ts := TaskSnapshot(got); ts == nil || !ts.Discard || ts.From != "" {
		t.Errorf("a failed fork's next task snapshot: %+v", ts)
	}
	// The source resumes; the fork lives on when the source is deleted.
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: src.WorkspaceID})
	h.answer(src.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: src.WorkspaceID})
	h.answer(src.WorkspaceID, OutcomeOK, "")
	if got := h.ws(f.WorkspaceID); got.State != api.WorkspaceAvailable {
		t.Errorf("the fork after its source's delete: %+v", got)
	}
	checkIndex(t, h.f)
}

// A fork refused by the only node that can restore its snapshot fails,
// and its source no longer waits for it.
func TestForkRefusedEverywhere(t *testing.T) {
	h := resumeHarness(t)
	src := h.pausedWS("c1", smallWS)
	f := h.create("f1", fork(src.WorkspaceID))
	got := h.answer(f.WorkspaceID, OutcomeRefused, "host memory is tight")
	if got.State != api.WorkspaceFailed || got.Layer == nil || got.Layer.Held || got.Snapshot == nil || !got.Snapshot.Discarded {
		t.Fatalf("a fork refused everywhere: %+v layer %+v", got, got.Layer)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: src.WorkspaceID})
	checkIndex(t, h.f)
}

// forksProblem recounts the forks bucket from the Workspaces.
func forksProblem(tx *bolt.Tx) error {
	want, got := map[string]bool{}, map[string]bool{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if src := forkSource(w); err == nil && src != "" {
			want[string(forkKey(src, w.WorkspaceID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	tx.Bucket(bucketForks).ForEach(func(k, _ []byte) error { got[string(k)] = true; return nil })
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("forks index %q, want %q", keys(got), keys(want))
	}
	return nil
}
