package cluster_test

import (
	"context"
	"fmt"
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
	if err := p.answerPending(p.ctx, &ws, snap); err != nil {
		p.t.Fatalf("answer the %s of %s: %v", ws.Pending.Kind, id, err)
	}
}

// answerEvery answers every command of the node's Workspaces ok until
// ctx ends, as a node with VMs would (a pause with snap): for calls that
// wait for a Workspace to run or pause. The returned func stops it and
// waits for it.
func (p *playedNode) answerEvery(snap *api.SnapshotReport) (stop func()) {
	ctx, cancel := context.WithCancel(p.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var list api.WorkspaceList
			if _, err := p.cl.Do(ctx, "GET", "/v1/workspaces?all_namespaces=true", nil, &list); err != nil {
				continue
			}
			for _, ws := range list.Workspaces {
				if ws.Pending == nil {
					continue
				}
				var s *api.SnapshotReport
				if ws.Pending.Kind == api.WSCmdPause {
					s = snap
				}
				p.answerPending(ctx, &ws, s) // a failed answer is tried again at the next tick

			}
		}
	}()
	return func() { cancel(); <-done }
}

// answerPending answers ws's pending command ok, as its node.
func (p *playedNode) answerPending(ctx context.Context, ws *api.Workspace, snap *api.SnapshotReport) error {
	n, err := p.c.Node(p.m, ws.Pending.NodeID)
	if err != nil {
		return err
	}
	if n.Session == nil {
		return fmt.Errorf("node %s has no session", n.NodeID)
	}
	res, err := p.m.Server.ApplyOp(ctx, fsm.OpWorkspaceResult, fsm.WorkspaceResultArgs{NodeID: n.NodeID, SessionID: n.Session.SessionID,
		WorkspaceID: ws.WorkspaceID, CommandID: ws.Pending.CommandID, Outcome: fsm.OutcomeOK, Snapshot: snap})
	if err != nil {
		return err
	}
	if res.Error != nil {
		return res.Error
	}
	return nil
}
