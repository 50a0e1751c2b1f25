package ctrl

import (
	"context"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/fsm"
)

// CollectArtifacts removes the store's content-addressed objects that no
// catalog entry references (a template published again, deleted; a
// Platform withdrawn) once older than age; dryRun only says what it would
// remove. The caller keeps this cluster's publishes from running
// meanwhile, and the age keeps an object another writer has just put.
// Named objects (Transfer archives) are the transfer driver's, not this
// collector's.
func (l *Leader) CollectArtifacts(ctx context.Context, st artifacts.Store, age time.Duration, dryRun bool) (api.ArtifactsGCResult, error) {
	res := api.ArtifactsGCResult{Objects: []api.ArtifactsGCObject{}, DryRun: dryRun}
	listed, err := st.List(ctx)
	if err != nil {
		return res, err
	}
	var refs map[string]string
	if err := l.c.View(func(tx *bolt.Tx) (err error) { refs, err = fsm.CatalogDigests(tx); return }); err != nil {
		return res, err
	}
	cutoff := time.Now().Add(-age)
	for _, o := range listed {
		if _, ok := refs[string(o.Digest)]; ok {
			res.Referenced++
			continue
		}
		g := api.ArtifactsGCObject{Digest: string(o.Digest), SizeBytes: o.Size, Modified: o.Modified}
		switch {
		case o.Modified.After(cutoff):
			g.Action = api.GCKeptYoung
		case dryRun:
			g.Action = api.GCWouldRemove
		default:
			if err := st.Delete(ctx, o.Digest); err != nil {
				g.Action, g.Error = api.GCFailed, err.Error()
				l.log.Warn("artifacts gc: object not removed", "digest", o.Digest, "err", err)
				break
			}
			g.Action = api.GCRemoved
			res.RemovedBytes += o.Size
			l.log.Info("artifacts gc: object removed", "digest", o.Digest, "bytes", o.Size)
		}
		res.Objects = append(res.Objects, g)
	}
	return res, nil
}
