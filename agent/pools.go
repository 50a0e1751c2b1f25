package agent

import (
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
)

// watchedPool is what the node last saw of one of its pools.
type watchedPool struct {
	seen, available bool
	reason          string
	// swept: the temporary files interrupted writes left were deleted
	// once, the first time the pool was available.
	swept bool
}

// notePools looks at the pools' statuses of a fresh report: every change
// of a pool's availability is logged with why, and a pool's leftover
// temporary files are deleted the first time it is available (at start,
// or later for a pool that was not: the seed's temp-file rule). Only the
// report watcher calls it, one call at a time.
func (a *Agent) notePools(statuses []api.Pool) {
	if a.watched == nil {
		a.watched = map[string]*watchedPool{}
	}
	for _, st := range statuses {
		w := a.watched[st.PoolID]
		if w == nil {
			w = &watchedPool{}
			a.watched[st.PoolID] = w
		}
		if !w.seen || w.available != st.Available || !st.Available && w.reason != st.Reason {
			reason := st.Reason
			switch {
			case st.Available && !w.seen:
				reason = "first check since the node started"
			case st.Available:
				reason = "the pool directory is reachable again"
			}
			a.log.Info("storage pool availability changed", "pool", st.PoolID, "path", st.Path, "available", st.Available, "shared", st.Shared, "reason", reason)
			w.seen, w.available, w.reason = true, st.Available, st.Reason
		}
		if st.Available && !w.swept {
			n, err := storagepool.SweepPool(st.Path, st.Shared, a.cfg.NodeID)
			if err == nil {
				var k int
				k, err = sweepImportArchives(st.Path, st.Shared, a.cfg.NodeID)
				n += k
			}
			if err != nil {
				a.log.Warn("temporary files in a storage pool not all removed", "pool", st.PoolID, "path", st.Path, "removed", n, "err", err)
				continue
			}
			w.swept = true
			if n > 0 {
				a.log.Info("temporary files of interrupted writes removed", "pool", st.PoolID, "path", st.Path, "count", n, "shared", st.Shared)
			}
		}
	}
}
