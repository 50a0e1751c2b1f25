package agent

import (
	"context"
	"maps"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
)

// sweepInterval is how often the node looks for stopped Instances that no
// Workspace owns any more.
const sweepInterval = 30 * time.Second

// sweepUnowned deletes, every sweepInterval until ctx ends, the stopped
// Instances of no Workspace: ones a pause or a failed start's undo ended
// but could not delete. Their directories would otherwise stay until the
// node is wiped; a failed Delete is tried again at the next round.
func (a *Agent) sweepUnowned(ctx context.Context) {
	if a.cfg.Runtime == nil {
		return
	}
	tick := time.NewTicker(sweepInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a.deleteUnowned(ctx)
	}
}

// deleteUnowned is one round of sweepUnowned. Only a STOPPED Instance is
// deleted: nothing of it runs, and every start records its owner before
// its Instance exists.
func (a *Agent) deleteUnowned(ctx context.Context) {
	rt := a.cfg.Runtime
	a.tasks.mu.Lock()
	owners := maps.Clone(a.tasks.owners)
	a.tasks.mu.Unlock()
	for _, st := range rt.Owned() {
		if st.State != runtime.StateStopped || owners[st.ID] != "" {
			continue
		}
		if err := rt.Delete(ctx, st.ID); err != nil {
			if !isUnknownInstance(err) {
				a.log.Warn("stopped instance of no Workspace not deleted; tried again later", "instance_id", st.ID, "err", err)
			}
			continue
		}
		a.releaseObjects(st.ID, objectsOf(st))
		a.log.Info("stopped instance of no Workspace deleted", "instance_id", st.ID)
	}
}
