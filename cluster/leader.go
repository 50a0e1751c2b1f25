package cluster

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl"
	"github.com/kibotos/kibotos/fsm"
)

// The leader's services are ctrl's (ctrl.Leader); this file gives them
// what they need of the member: its Raft group, state, sessions and calls
// of nodes.

// exportTimeout bounds one export call (copying a layer and Volumes of
// some GiB into the store).
const exportTimeout = time.Hour

// newLeader builds the member's leader services (ctrl members only).
func (s *Server) newLeader() *ctrl.Leader {
	t := s.cfg.Timings
	return ctrl.New(ctrl.Config{NodeID: s.id.NodeID, Cluster: leaderCluster{s}, Levels: s.levels, Log: s.log, Timings: ctrl.Timings{
		SessionPing: t.SessionPing, SessionTimeout: t.SessionTimeout, CommandExpiry: t.CommandExpiry,
		CommandRetention: t.CommandRetention, CommandExpiryBatch: t.CommandExpiryBatch,
	}})
}

// runLeader runs the leader's services, driven by raft's leadership
// notifications, until the member stops; it returns once they have.
// ctx is Open's: its values, not its end (Open returns long before).
func (s *Server) runLeader(ctx context.Context) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { s.leader.Run(ctx, s.leadership) })
	<-s.stop
	cancel()
	wg.Wait()
}

// kickTransfers wakes the leader's transfer driver.
func (s *Server) kickTransfers() {
	if s.leader != nil {
		s.leader.KickTransfers()
	}
}

// leaderCluster is the member as ctrl.Leader sees it.
type leaderCluster struct{ s *Server }

var _ ctrl.Cluster = leaderCluster{}

// Barrier waits as long as raft lets a new leader catch up, whatever ctx,
// or until the member stops.
func (c leaderCluster) Barrier(context.Context) error {
	return c.s.awaitRaft(c.s.raft.Barrier(30 * time.Second))
}

func (c leaderCluster) ApplyOp(ctx context.Context, op string, args any) (fsm.Result, error) {
	return c.s.ApplyOp(ctx, op, args)
}

func (c leaderCluster) View(fn func(tx *bolt.Tx) error) error { return c.s.fsm.View(fn) }

func (c leaderCluster) CaughtUp(ok bool) { c.s.consistentReady.Store(ok) }

func (c leaderCluster) Servers() ([]ctrl.RaftServer, error) { return c.s.raftServers() }

func (c leaderCluster) RemoveServer(id string) {
	c.s.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second)
}

func (c leaderCluster) SessionAttached(node, sid string) bool {
	return c.s.sessions.attached(node, sid)
}
func (c leaderCluster) CloseSessions() { c.s.sessions.closeAll() }

// ExportTransfer runs the export on this member's own node runtime, or
// asks node n on its internal route.
func (c leaderCluster) ExportTransfer(ctx context.Context, n *api.Node, t api.TransferExportTask) (api.TransferExportResult, error) {
	s := c.s
	var res api.TransferExportResult
	if n.NodeID != s.id.NodeID {
		err := s.nodeCall(ctx, n, http.MethodPost, "/v1/internal/transfers/export", t, exportTimeout, 64<<10, &res)
		return res, err
	}
	e := s.own().Transfers
	if e == nil {
		return res, api.Errorf(api.CodeFailedPrecondition, "member %s runs no node runtime", s.id.NodeID)
	}
	return e.ExportTransfer(ctx, t)
}

func (c leaderCluster) ExportProgress(ctx context.Context, n *api.Node, id string) (api.TransferProgress, error) {
	if n.NodeID == c.s.id.NodeID {
		return c.s.localProgress(id)
	}
	var p api.TransferProgress
	err := c.s.nodeCall(ctx, n, http.MethodGet, "/v1/internal/transfers/"+id+"/progress", nil, 10*time.Second, 4<<10, &p)
	return p, err
}

func (c leaderCluster) RemoveArchive(ctx context.Context, tr *api.Transfer) error {
	return c.s.removeArchive(ctx, tr)
}
