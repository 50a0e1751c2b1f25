package ctrl

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/fsm"
)

// The lifetime service: while this member leads, it does the timeout
// action of every Workspace whose end has passed (fsm/lifetimes.go). It
// keeps nothing of its own between leads: a new leader reads the ends
// from the replicated state at its first tick, so an end that passed
// while no member led fires then.

// Timings of the lifetime service.
const (
	// lifetimeTick bounds how late an action is: an end is read at most
	// this long after it passed (plus the apply).
	lifetimeTick = time.Second
	// lifetimeRetry spaces the attempts of an action the FSM refused
	// for another reason than a command in flight (a pause with no room
	// for the snapshot, a delete while forks read the Workspace).
	lifetimeRetry = 15 * time.Second
	// lifetimeBatch bounds the actions of one tick, so a burst of ends
	// does not hold the tick for long; the rest go at the next.
	lifetimeBatch = 256
)

// driveLifetimes fires the due ends until ctx ends.
func (l *Leader) driveLifetimes(ctx context.Context) {
	retryAt := retryTimes{}
	everyTick(ctx, lifetimeTick, func() { l.fireDueEnds(ctx, retryAt) })
}

// fireDueEnds proposes the timeout of every Workspace whose end is past
// by this member's clock. The FSM checks again with the entry's time, so
// a clock ahead of the log's proposes in vain, never early.
func (l *Leader) fireDueEnds(ctx context.Context, retryAt retryTimes) {
	now := time.Now()
	var due []fsm.DueEnd
	if err := l.c.View(func(tx *bolt.Tx) (err error) { due, err = fsm.DueEnds(tx, now, lifetimeBatch); return }); err != nil {
		l.log.Warn("reading the Workspaces' ends failed; the next tick retries", "err", err)
		return
	}
	still := make(map[string]bool, len(due))
	for _, d := range due {
		still[d.WorkspaceID] = true
		// One waiting for a command in flight is due again once the
		// node's answer rewrote it: reading it costs no Raft entry.
		if d.Waits || retryAt.waiting(d.WorkspaceID, now) {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		var out fsm.TimedOut
		if err := l.applyDecoded(ctx, fsm.OpWorkspaceTimedOut, fsm.WorkspaceTimedOutArgs{WorkspaceID: d.WorkspaceID, EndsAt: d.EndsAt}, &out); err != nil {
			if ctx.Err() == nil {
				retryAt[d.WorkspaceID] = now.Add(lifetimeRetry)
				l.log.Warn("workspace timeout refused; retrying", "workspace_id", d.WorkspaceID, "action", d.OnTimeout, "ends_at", d.EndsAt, "retry_in", lifetimeRetry, "err", err)
			}
			continue
		}
		delete(retryAt, d.WorkspaceID)
		did := out.Did
		if did == "" {
			did = "none"
		}
		l.log.Info("workspace timed out", "workspace_id", d.WorkspaceID, "action", d.OnTimeout, "ends_at", d.EndsAt, "did", did, "state", out.Workspace.State)
	}
	retryAt.keepOnly(still)
}
