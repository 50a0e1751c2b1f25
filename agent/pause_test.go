package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
)

// A delete ctrl accepted while a pause ran names no snapshot (ctrl ignored
// the pause's result), yet the node ran the pause first and its snapshot
// is beside the layer: the delete removes it too. The fault harness found
// such snapshots left in the pool after the delete.
func TestDeleteRemovesTheSnapshotOfAPauseItOvertook(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	var logs bytes.Buffer
	a := restarted(t, &Agent{cfg: Config{NodeID: "node-a", DataDir: datadir.Dir(dir)}}, clock, &logs)
	snap, err := a.snapshotDir("", "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state", "snapshot.json"} {
		if err := os.MkdirAll(snap, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(snap, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	other, _ := a.snapshotDir("", "ws-2")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}

	del := api.WorkspaceTask{WorkspaceID: "ws-1", Command: api.WorkspaceCommand{Kind: api.WSCmdDelete, CommandID: "ws-1/4"}}
	if r := a.execute(context.Background(), del); r.Outcome != fsm.OutcomeOK {
		t.Fatalf("delete: %+v", r)
	}
	if _, err := os.Stat(snap); !os.IsNotExist(err) {
		t.Fatalf("the delete left the snapshot of the pause it overtook (%s): %v", snap, err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("the delete of ws-1 removed another Workspace's snapshot: %v", err)
	}
}
