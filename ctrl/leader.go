// Package ctrl runs the ctrl leader's services: while its member leads the
// Raft group, one lead at a time closes sessions no connection backs,
// expires old command records, drops retired voters, refreshes the
// voters' feature levels, drives Transfers and ends Workspaces whose
// timeout passed. It also keeps what the voters' levels allow (Levels),
// decides which reports carry ended-Instance records (Rounds) and
// collects unreferenced artifacts. It reaches the
// member only through the Cluster and LevelSource interfaces; it never
// imports cluster or cli, and owns no rule about the state (that is fsm)
// nor any transport (control sessions and HTTP stay in cluster).
package ctrl

import (
	"context"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// State is the replicated state as the leader reads and writes it.
type State interface {
	// Barrier returns once every entry of earlier terms is applied here.
	Barrier(ctx context.Context) error
	// ApplyOp proposes op with args as this member and waits for its result.
	ApplyOp(ctx context.Context, op string, args any) (fsm.Result, error)
	// View reads the local state.
	View(fn func(tx *bolt.Tx) error) error
	// CaughtUp is told true once the leadership's barrier went through
	// (consistent reads may be served) and false when its lead ended.
	CaughtUp(bool)
}

// Voters is the Raft configuration.
type Voters interface {
	// Servers is the Raft configuration.
	Servers() ([]RaftServer, error)
	// RemoveServer starts dropping a server from the configuration; the
	// next tick sees whether it went.
	RemoveServer(id string)
}

// Sessions are the nodes' control sessions attached to this member.
type Sessions interface {
	// SessionAttached reports whether node's session sid has a connection here.
	SessionAttached(node, sid string) bool
	// CloseSessions closes every control connection (their nodes reconnect
	// to the new leader).
	CloseSessions()
}

// Nodes are the calls the leader makes of a node, this member's own or
// another's, and the artifact store the Transfers' archives are in.
type Nodes interface {
	// ExportTransfer asks node n to write the archive of Transfer t.
	ExportTransfer(ctx context.Context, n *api.Node, t api.TransferExportTask) (api.TransferExportResult, error)
	// ExportProgress asks node n how far its export of Transfer id is.
	ExportProgress(ctx context.Context, n *api.Node, id string) (api.TransferProgress, error)
	// RemoveArchive deletes a Transfer's archive and manifest from the store.
	RemoveArchive(ctx context.Context, tr *api.Transfer) error
}

// Cluster is what the leader needs of the member it runs in.
type Cluster interface {
	State
	Voters
	Sessions
	Nodes
	CATrust
}

// Timings of the leader's services (cluster.Timings carries them).
type Timings struct {
	SessionPing    time.Duration // the services' tick
	SessionTimeout time.Duration // a session not attached this long after the lead began is closed
	CommandExpiry  time.Duration // how often old command records are expired
	// CommandRetention and CommandExpiryBatch, when set, replace
	// fsm.CommandRetentionHours and commandExpiryBatch (tests of expiry).
	CommandRetention   time.Duration
	CommandExpiryBatch int
}

// Config configures a Leader.
type Config struct {
	NodeID  string // this member's, which reconcileVoters never removes
	Cluster Cluster
	Levels  *Levels // the voters' feature levels, which the leader refreshes
	Log     *slog.Logger
	Timings Timings
}

// Leader runs the leader's services while its member leads.
type Leader struct {
	id           string
	c            Cluster
	levels       *Levels
	log          *slog.Logger
	t            Timings
	transferKick chan struct{}
}

// New returns a Leader; Run starts following leadership.
func New(cfg Config) *Leader {
	return &Leader{id: cfg.NodeID, c: cfg.Cluster, levels: cfg.Levels, log: cfg.Log, t: cfg.Timings, transferKick: make(chan struct{}, 1)}
}

// Run runs one lead while leadership says this member leads (true on
// becoming leader, false on stepping down) until ctx ends. It waits for
// one lead's services to return before anything else: two never overlap,
// and Run returns only once the last one has.
func (l *Leader) Run(ctx context.Context, leadership <-chan bool) {
	var endLead func() // cancels the lead's services and waits for them
	defer func() {
		if endLead != nil {
			endLead()
		}
	}()
	for {
		var leader bool
		select {
		case <-ctx.Done():
			return
		case leader = <-leadership:
		}
		switch {
		case leader && endLead == nil:
			lctx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() { l.lead(lctx) })
			endLead = func() { cancel(); wg.Wait() }
		case !leader && endLead != nil:
			endLead()
			endLead = nil
			l.c.CloseSessions() // nodes reconnect to the new leader
		}
	}
}

// levelRefresh is how often the leader asks the voters their levels again.
const levelRefresh = time.Minute

// lead is one leadership's services: close sessions that no connection
// backs any more (after a leader change), expire old command records, and
// drop retired or revoked ctrl members from the voters, and refresh the
// voters' feature levels. It returns once
// the transfer driver it starts has returned too.
func (l *Leader) lead(ctx context.Context) {
	t := l.t
	// The voters' levels this member kept may be from an earlier
	// leadership, and the previous leader may have recorded others.
	l.levels.Forget()
	if err := l.c.Barrier(ctx); err != nil {
		return
	}
	// Everything the previous leader acknowledged is now applied here.
	l.levels.Forget()
	l.c.CaughtUp(true)
	defer l.c.CaughtUp(false)
	l.log.Info("leading ctrl")
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { l.driveTransfers(ctx) })
	wg.Go(func() { l.driveCARotation(ctx) })
	wg.Go(func() { l.driveLifetimes(ctx) })
	wg.Go(func() { l.driveIdlePauses(ctx) })
	since := time.Now()
	lastExpiry, expiring := time.Now(), false
	l.levels.Refresh(ctx)
	lastLevels := time.Now()
	tick := time.NewTicker(t.SessionPing)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(since) > t.SessionTimeout {
			l.sweepSessions(ctx)
		}
		if expiring || time.Since(lastExpiry) > t.CommandExpiry {
			lastExpiry = time.Now()
			expiring = l.expireCommands(ctx, lastExpiry.Add(t.SessionPing/2))
		}
		l.reconcileVoters()
		if time.Since(lastLevels) > levelRefresh {
			lastLevels = time.Now()
			l.levels.Refresh(ctx)
		}
	}
}
