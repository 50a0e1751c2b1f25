package fsm

import (
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	bolt "go.etcd.io/bbolt"
)

// pendingIDs is what PendingCommands says waits for node, by id.
func pendingIDs(t testing.TB, f *FSM, node string) []string {
	t.Helper()
	var ids []string
	if err := f.View(func(tx *bolt.Tx) error {
		ws, err := PendingCommands(tx, node)
		for _, w := range ws {
			ids = append(ids, w.WorkspaceID)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestPendingCommandsIndexed: a node's session is sent the commands
// waiting for that node and no other: a create's start until the node
// answers it, a stop, a delete; not the Workspaces the node runs with
// nothing pending, nor another node's. (The property test checks the
// index against the records after every entry.)
func TestPendingCommandsIndexed(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	h.schedNode("node-a", 1, 8000, 16*gib)
	idle := h.running("idle", smallWS)
	creating := h.create("creating", smallWS)
	stopping := h.running("stopping", smallWS)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopping.WorkspaceID})
	if got, want := pendingIDs(t, h.f, "node-a"), sorted(creating.WorkspaceID, stopping.WorkspaceID); !slices.Equal(got, want) {
		t.Fatalf("pending for node-a %q, want %q (not the idle %s)", got, want, idle.WorkspaceID)
	}
	if got := pendingIDs(t, h.f, "node-b"); len(got) != 0 {
		t.Fatalf("pending for node-b %q, want none", got)
	}
	h.answer(creating.WorkspaceID, OutcomeOK, "")
	h.answer(stopping.WorkspaceID, OutcomeOK, "")
	if got := pendingIDs(t, h.f, "node-a"); len(got) != 0 {
		t.Fatalf("pending for node-a after its answers %q, want none", got)
	}
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: idle.WorkspaceID})
	if got := pendingIDs(t, h.f, "node-a"); !slices.Equal(got, []string{idle.WorkspaceID}) {
		t.Fatalf("pending for node-a after a delete %q, want %q", got, idle.WorkspaceID)
	}
}

// TestPendingCommandsRebuilt: a restored state whose index an older build
// did not keep (its snapshot has none, or it changed a Workspace without
// the index and the clock moved on) gets the index built anew, so no
// command waits unsent; a state of this build restores as it was.
func TestPendingCommandsRebuilt(t *testing.T) {
	for name, older := range map[string]func(tx *bolt.Tx, stale *api.Workspace) error{
		"snapshot without the index": func(tx *bolt.Tx, _ *api.Workspace) error {
			if err := tx.DeleteBucket(bucketWorkspaceCommands); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Delete(keyWorkspaceCommandsAt)
		},
		"a command added by an older build": func(tx *bolt.Tx, stale *api.Workspace) error {
			// An older build stores the record and moves the clock, not
			// the mark.
			stale.Pending = &api.WorkspaceCommand{Kind: api.WSCmdStop, CommandID: "older-stop", NodeID: "node-a", InstanceID: stale.InstanceID, IssuedAt: t0}
			stale.State = api.WorkspaceStopping
			if err := putJSON(tx, bucketWorkspaces, wsKey(stale.WorkspaceID), stale); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyClock, []byte(t0.Add(100*time.Hour).Format(time.RFC3339Nano)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.bootstrap()
			h.schedNode("node-a", 1, 8000, 16*gib)
			stale := h.running("stale", smallWS)
			creating := h.create("creating", smallWS)
			if err := h.f.db.Update(func(tx *bolt.Tx) error { return older(tx, &stale) }); err != nil {
				t.Fatal(err)
			}
			want := []string{creating.WorkspaceID}
			if stale.Pending != nil {
				want = sorted(creating.WorkspaceID, stale.WorkspaceID)
			}
			g := restored(t, h.f)
			if err := g.View(indexProblem); err != nil {
				t.Fatal(err)
			}
			if got := pendingIDs(t, g, "node-a"); !slices.Equal(got, want) {
				t.Fatalf("pending for node-a after the restore %q, want %q", got, want)
			}
		})
	}
	t.Run("kept by this build", func(t *testing.T) {
		h := newHarness(t)
		h.bootstrap()
		h.schedNode("node-a", 1, 8000, 16*gib)
		h.create("creating", smallWS)
		g := restored(t, h.f)
		if mustDump(t, g) != mustDump(t, h.f) {
			t.Fatal("a restored state differs from the one it was taken of")
		}
	})
}
