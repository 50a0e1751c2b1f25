package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/testenv"
)

// playedNode is a test playing the node of an in-process cluster whose
// nodes hold every task (Options.HoldTask): it reads Workspaces and
// answers their commands as a node with VMs would.
type playedNode struct {
	t   *testing.T
	ctx context.Context
	c   *clustertest.Cluster
	m   *clustertest.Member
	cl  *api.Client
}

func playNode(t *testing.T, ctx context.Context, c *clustertest.Cluster, m *clustertest.Member) *playedNode {
	return &playedNode{t: t, ctx: ctx, c: c, m: m, cl: c.Client(m)}
}

// get reads a Workspace.
func (p *playedNode) get(id string) api.Workspace {
	p.t.Helper()
	var ws api.Workspace
	if _, err := p.cl.Do(p.ctx, "GET", "/v1/workspaces/"+id, nil, &ws); err != nil {
		p.t.Fatal(err)
	}
	return ws
}

// answer answers the Workspace's pending command ok (a pause with snap).
func (p *playedNode) answer(id string, snap *api.SnapshotReport) {
	p.t.Helper()
	var ws api.Workspace
	testenv.WaitFor(p.t, 20*time.Second, "a pending command of "+id, func() (bool, string) {
		ws = p.get(id)
		return ws.Pending != nil, ws.State
	})
	n, err := p.c.Node(p.m, ws.Pending.NodeID)
	if err != nil {
		p.t.Fatal(err)
	}
	res, err := p.m.Server.ApplyOp(p.ctx, fsm.OpWorkspaceResult, fsm.WorkspaceResultArgs{NodeID: n.NodeID, SessionID: n.Session.SessionID,
		WorkspaceID: id, CommandID: ws.Pending.CommandID, Outcome: fsm.OutcomeOK, Snapshot: snap})
	if err != nil || res.Error != nil {
		p.t.Fatalf("answer the %s of %s: %v %v", ws.Pending.Kind, id, err, res.Error)
	}
}
