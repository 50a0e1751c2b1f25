package ctrl

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/fsm"
)

// The idle pause service: while this member leads, it pauses every
// Workspace whose node reports its Instance idle at least its idle
// timeout (fsm/idle.go). Like the lifetime service it keeps nothing
// between leads: a new leader reads the nodes' stored reports at its
// first tick.
//
// Each tick reads the nodes' latest reports and, of those, only the
// Workspaces of the Instances reported idle (fsm.IdleDue): the cost
// follows the nodes and the idle Instances, not every Workspace, so no
// index of the Workspaces with an idle timeout is kept in the FSM.

// Timings of the idle pause service.
const (
	// idleTick bounds how late an idle pause is. Idle timeouts are
	// minutes; a tick of seconds costs one read of the nodes' records.
	idleTick = 5 * time.Second
	// idleBatch bounds the pauses of one tick; the rest go at the next.
	idleBatch = 64
)

// driveIdlePauses pauses the idle Workspaces until ctx ends.
func (l *Leader) driveIdlePauses(ctx context.Context) {
	retryAt := retryTimes{}
	everyTick(ctx, idleTick, func() { l.pauseIdle(ctx, retryAt) })
}

// pauseIdle proposes the idle pause of every Workspace due by this
// member's clock. The FSM checks again with the entry's time and the
// report it holds then, so a clock ahead of the log's, or a node that
// reported a connection meanwhile, makes the proposal fail, never pause
// early.
func (l *Leader) pauseIdle(ctx context.Context, retryAt retryTimes) {
	now := time.Now()
	var due []fsm.IdleCandidate
	if err := l.c.View(func(tx *bolt.Tx) (err error) { due, err = fsm.IdleDue(tx, now, idleBatch); return }); err != nil {
		l.log.Warn("reading the idle Workspaces failed; the next tick retries", "err", err)
		return
	}
	still := make(map[string]bool, len(due))
	for _, d := range due {
		still[d.WorkspaceID] = true
		if retryAt.waiting(d.WorkspaceID, now) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		var out fsm.IdlePaused
		if err := l.applyDecoded(ctx, fsm.OpWorkspaceIdlePause, fsm.WorkspaceIdlePauseArgs{WorkspaceID: d.WorkspaceID, InstanceID: d.InstanceID}, &out); err != nil {
			if ctx.Err() == nil {
				// A pause with no room for its snapshot, or a report
				// that changed since the read: tried again later.
				retryAt[d.WorkspaceID] = now.Add(lifetimeRetry)
				l.log.Warn("workspace idle pause refused; retrying", "workspace_id", d.WorkspaceID, "instance_id", d.InstanceID, "retry_in", lifetimeRetry, "err", err)
			}
			continue
		}
		delete(retryAt, d.WorkspaceID)
		l.log.Info("workspace idle, pausing", "workspace_id", d.WorkspaceID, "idle_since", d.IdleSince.UTC().Format(time.RFC3339),
			"idle_timeout", d.IdleTimeout, "node_id", d.NodeID, "instance_id", d.InstanceID, "state", out.Workspace.State)
	}
	retryAt.keepOnly(still)
}
