package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/vmm/template"
)

// Workspace commands travel over real control sessions: ctrl places a
// Workspace only on a node that reports its template, delivers the start
// to that node, and the node's answer (here: it runs no VMs) lands in the
// Workspace; a template no node has is refused at create.
func TestWorkspaceCommandsOverTheSession(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	leader := c.Members[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	buildTiny(ctx, t, c, leader, c.Members[1])
	cl := c.Client(leader)
	req := api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "t1"}, Template: "tiny", CPU: 1000, MemoryBytes: 256 << 20}
	ws := createTiny(ctx, t, cl, req, "node-2")
	if f := ws.Failure; f == nil || f.Reason != api.FailureStart || !strings.Contains(f.Message, "node-2 runs no VMs") || ws.Pending != nil || ws.InstanceID != "" {
		t.Fatalf("the node's answer: %+v failure %+v", ws, ws.Failure)
	}
	req.CommandID, req.Template = "t2", "nowhere"
	_, err := cl.Do(ctx, "POST", "/v1/workspaces", req, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "template nowhere is not built on any node") {
		t.Fatalf("create with a template no node has: %v", err)
	}
}

// buildTiny builds template "tiny" on node and waits until leader has its
// report listing it.
func buildTiny(ctx context.Context, t *testing.T, c *clustertest.Cluster, leader, node *clustertest.Member) {
	t.Helper()
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "hello"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := template.Build(ctx, template.Options{StorageRoot: node.Dir.StorageRoot(), Name: "tiny", FromDir: tree, SizeMiB: 8}); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n, err := c.Node(leader, node.ID)
		if err != nil || n.Report == nil {
			return false, "no report"
		}
		return len(n.Report.Templates) == 1 && n.Report.Templates[0] == "tiny", "templates " + strings.Join(n.Report.Templates, ",")
	})
}

// createTiny creates a Workspace of "tiny", which must be placed on node
// (the only one with the template), and waits for the node's answer: it
// runs no VMs, so the Workspace ends FAILED.
func createTiny(ctx context.Context, t *testing.T, cl *api.Client, req api.WorkspaceCreateRequest, node string) api.Workspace {
	t.Helper()
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", req, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.NodeID != node || ws.State != api.WorkspaceCreating || ws.Pending == nil {
		t.Fatalf("created %+v: want CREATING on %s, the only node with the template", ws, node)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		var now api.Workspace // fresh: absent fields must read as empty
		_, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID, nil, &now)
		if err == nil {
			ws = now
		}
		return err == nil && ws.State == api.WorkspaceFailed, "state " + ws.State
	})
	return ws
}

// The report a node owes after each task travels in the task's result
// message, and ctrl stores it with the result, in one entry: the
// Workspace's change and the node's new report carry the same entry time.
// With a voter below fsm.LevelResultReports, which would not store a
// report inside a result, the leader stores them as two entries, and the
// report still lands.
func TestTaskResultCarriesReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		o        clustertest.Options
		oneEntry bool
	}{
		{"one entry", clustertest.Options{Ctrl: 1, NodeOnly: 1}, true},
		{"a voter below the level", clustertest.Options{Ctrl: 2, NodeOnly: 1, FeatureLevels: map[string]int{"node-2": fsm.LevelResultReports - 1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := clustertest.New(t, tc.o)
			leader := c.WaitLeader()
			node := c.Members[len(c.Members)-1]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			buildTiny(ctx, t, c, leader, node)
			before, err := c.Node(leader, node.ID)
			if err != nil {
				t.Fatal(err)
			}
			cl := c.Client(leader)
			ws := createTiny(ctx, t, cl, api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "r1"}, Template: "tiny", CPU: 1000, MemoryBytes: 256 << 20}, node.ID)
			var n *api.Node
			clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
				n, err = c.Node(leader, node.ID)
				if err != nil {
					return false, err.Error()
				}
				return n.Report.ReportVersion > before.Report.ReportVersion, fmt.Sprintf("report version %d, %d before the task", n.Report.ReportVersion, before.Report.ReportVersion)
			})
			if n.Report.ReportVersion != before.Report.ReportVersion+1 {
				t.Fatalf("report version %d after one task, %d before: one report per task", n.Report.ReportVersion, before.Report.ReportVersion)
			}
			if same := n.Report.ReportedAt.Equal(ws.UpdatedAt); same != tc.oneEntry {
				t.Fatalf("the report stored at %v, the result at %v: in one entry %v, want %v", n.Report.ReportedAt, ws.UpdatedAt, same, tc.oneEntry)
			}
		})
	}
}
