package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/ctxsleep"
)

// Storage pools at takeover. A running Instance writes its layer and its
// Volumes in pools; after a node restart a pool may not be there yet (a
// network filesystem still mounting). The node waits for them, once, and
// an Instance with a pool that does not open is not taken over: FAILED,
// its VMM left running, until stop --force ends it (troubleshooting row
// of the process-model seed).

// DefaultPoolOpenWait bounds the wait for the pools of running Instances
// at Open.
const DefaultPoolOpenWait = 5 * time.Minute

// StagePreparingLayer is the failure stage of an Instance whose retained
// layer's pool was unavailable when the node took it over.
const StagePreparingLayer = api.StagePreparingRetainedLayer

// StageAttachingVolume is the failure stage of an Instance whose layer
// was fine but a Volume's pool was unavailable when the node took it over.
const StageAttachingVolume = api.StageAttachingVolume

// PoolDir is one storage pool of the node: its id and directory.
type PoolDir struct {
	ID     string
	Path   string
	Shared bool
}

// poolOf is the pool a layer is in (the longest directory holding it);
// the zero PoolDir when none is configured.
func (rt *Runtime) poolOf(layer string) PoolDir {
	var best PoolDir
	for _, p := range rt.cfg.Pools {
		dir := filepath.Clean(p.Path) + string(filepath.Separator)
		if strings.HasPrefix(layer, dir) && len(p.Path) > len(best.Path) {
			best = p
		}
	}
	return best
}

// poolOpen says why a pool's directory cannot be used, "" when it can.
func poolOpen(p PoolDir) string {
	st, err := os.Stat(p.Path)
	switch {
	case err != nil:
		return err.Error()
	case !st.IsDir():
		return p.Path + " is not a directory"
	}
	return ""
}

// poolFiles are the files in pools a launch writes: its layer, then its
// Volumes.
func poolFiles(rec *LaunchRecord) []string {
	var files []string
	if rec.LayerPath != "" {
		files = append(files, rec.LayerPath)
	}
	for _, v := range rec.Volumes {
		files = append(files, v.Path)
	}
	return files
}

// openPools waits until every pool holding the layer or a Volume of a
// running Instance among verdicts opens, at most PoolOpenWait; it returns
// the error of each pool that did not, by pool id.
func (rt *Runtime) openPools(ctx context.Context, verdicts []verdict) map[string]string {
	need := map[string]PoolDir{}
	for _, v := range verdicts {
		if v.state != StateRunning && v.state != StateStarting {
			continue
		}
		for _, f := range poolFiles(v.rec) {
			if p := rt.poolOf(f); p.ID != "" {
				need[p.ID] = p
			}
		}
	}
	wait := rt.cfg.PoolOpenWait
	if wait <= 0 {
		wait = DefaultPoolOpenWait
	}
	t0 := time.Now()
	waitLogged := false
	for {
		for id, p := range need {
			if poolOpen(p) == "" {
				delete(need, id)
			}
		}
		if len(need) == 0 || time.Since(t0) >= wait {
			break
		}
		if !waitLogged {
			rt.log.Warn("waiting for storage pools to open before taking Instances over", "pools", len(need), "max_wait", wait)
			waitLogged = true
		}
		if ctxsleep.Sleep(ctx, 200*time.Millisecond) != nil {
			break
		}
	}
	out := map[string]string{}
	for id, p := range need {
		why := poolOpen(p)
		rt.log.Error("storage pool not opened for takeover", "pool", id, "path", p.Path, "waited", time.Since(t0).Round(time.Millisecond), "reason", why)
		out[id] = fmt.Sprintf("storage pool is unavailable: pool %s at %s did not open for takeover: %s; fix the storage, then kibo workspace stop --force and start", id, p.Path, why)
	}
	return out
}

// poolFailure is why a running Instance cannot be taken over with the pools
// in unopened (openPools), beginning with its failure stage; "" when all
// its pools opened. The layer's pool is named first: without its root
// the guest is not running what the Workspace holds.
func (rt *Runtime) poolFailure(rec *LaunchRecord, unopened map[string]string) string {
	if rec.LayerPath != "" {
		if why, ok := unopened[rt.poolOf(rec.LayerPath).ID]; ok {
			return StagePreparingLayer + ": " + why
		}
	}
	for _, v := range rec.Volumes {
		if why, ok := unopened[rt.poolOf(v.Path).ID]; ok {
			return StageAttachingVolume + ": " + why
		}
	}
	return ""
}
