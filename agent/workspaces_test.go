package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/vmm/template"
)

// Workspace commands travel over real control sessions: ctrl places a
// Workspace only on a node that reports its template, delivers the start
// to that node, and the node's answer (here: it runs no VMs) lands in the
// Workspace; a template no node has is refused at create.
func TestWorkspaceCommandsOverTheSession(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	leader, node := c.Members[0], c.Members[1]
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "hello"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := template.Build(ctx, template.Options{StorageRoot: node.Dir.StorageRoot(), Name: "tiny", FromDir: tree, SizeMiB: 8}); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		if err != nil || n.Report == nil {
			return false, "no report"
		}
		return len(n.Report.Templates) == 1 && n.Report.Templates[0] == "tiny", "templates " + strings.Join(n.Report.Templates, ",")
	})
	cl := c.Client(leader)
	var ws api.Workspace
	req := api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "t1"}, Template: "tiny", CPU: 1000, MemoryBytes: 256 << 20}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", req, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.NodeID != "node-2" || ws.State != api.WorkspaceCreating || ws.Pending == nil {
		t.Fatalf("created %+v: want CREATING on node-2, the only node with the template", ws)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		var now api.Workspace // fresh: absent fields must read as empty
		_, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID, nil, &now)
		if err == nil {
			ws = now
		}
		return err == nil && ws.State == api.WorkspaceFailed, "state " + ws.State
	})
	if f := ws.Failure; f == nil || f.Reason != api.FailureStart || !strings.Contains(f.Message, "node-2 runs no VMs") || ws.Pending != nil || ws.InstanceID != "" {
		t.Fatalf("the node's answer: %+v failure %+v", ws, ws.Failure)
	}
	req.CommandID, req.Template = "t2", "nowhere"
	_, err := cl.Do(ctx, "POST", "/v1/workspaces", req, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "template nowhere is not built on any node") {
		t.Fatalf("create with a template no node has: %v", err)
	}
}
