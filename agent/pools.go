package agent

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
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

// DefaultPoolPath is the directory of the node's private pool.
func DefaultPoolPath(d datadir.Dir) string { return filepath.Join(d.StorageRoot(), "pools", "default") }

// checkPools validates the configured pools: valid unique ids, absolute
// paths, and a default pool that exists. Another node's private pool
// ("node-a:default") may be declared: its disk was moved here.
func checkPools(cfg *Config) error {
	own := api.PrivatePoolID(cfg.NodeID)
	seen := map[string]bool{api.LegacyPrivatePool: true, own: true}
	for _, p := range cfg.Pools {
		switch {
		case p.ID == "" || seen[p.ID]:
			return fmt.Errorf("storage pool %q: ids must be non-empty and unique (\"default\" and %q are the node's own pool)", p.ID, own)
		case api.ValidPoolID(p.ID) != nil:
			return fmt.Errorf("storage pool %q: use 1-63 lowercase letters, digits, '.', '_' or '-' (or NODE:default for the moved private pool of another node)", p.ID)
		case api.PrivatePoolOwner(p.ID) != "" && p.Shared:
			return fmt.Errorf("storage pool %s: a node's private pool is never shared; remove shared = true", p.ID)
		case !filepath.IsAbs(p.Path):
			return fmt.Errorf("storage pool %s: path %q is not absolute", p.ID, p.Path)
		}
		seen[p.ID] = true
	}
	if cfg.DefaultPool == own {
		cfg.DefaultPool = ""
	}
	if cfg.DefaultPool != "" && !seen[cfg.DefaultPool] {
		return fmt.Errorf("default pool %q is not configured: add it under [[storage.pools]] or leave default_pool empty", cfg.DefaultPool)
	}
	return nil
}

// poolPath is the directory of pool id, "" when the node has no such pool.
func (a *Agent) poolPath(id string) string {
	if id == "" || id == api.LegacyPrivatePool || id == api.PrivatePoolID(a.cfg.NodeID) {
		return DefaultPoolPath(a.cfg.DataDir)
	}
	for _, p := range a.cfg.Pools {
		if p.ID == id {
			return p.Path
		}
	}
	return ""
}

func poolStatus(id, path string) api.Pool {
	p := api.Pool{PoolID: id, Path: path}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		p.Reason = err.Error()
		return p
	}
	p.Available = true
	p.CapacityBytes = st.Blocks * uint64(st.Bsize)
	p.FreeBytes = st.Bavail * uint64(st.Bsize)
	return p
}
