package ctrl

import (
	"context"
	"encoding/json"
	"time"
)

// Pieces the leader's periodic services share (lifetimes.go, idle.go).

// everyTick runs fn now and then every d until ctx ends.
func everyTick(ctx context.Context, d time.Duration, fn func()) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		fn()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// applyDecoded proposes op and decodes its result into out; a refusal is
// the error.
func (l *Leader) applyDecoded(ctx context.Context, op string, args, out any) error {
	res, err := l.c.ApplyOp(ctx, op, args)
	if err == nil {
		err = res.Err()
	}
	if err == nil {
		err = json.Unmarshal(res.Value, out)
	}
	return err
}

// retryTimes holds, per Workspace, when a refused action may be tried
// again.
type retryTimes map[string]time.Time

// waiting says whether id's action waits for its retry at now.
func (r retryTimes) waiting(id string, now time.Time) bool { return now.Before(r[id]) }

// keepOnly forgets the Workspaces no longer due: deleted, or their
// action done or moot.
func (r retryTimes) keepOnly(due map[string]bool) {
	for id := range r {
		if !due[id] {
			delete(r, id)
		}
	}
}
