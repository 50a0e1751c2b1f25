package cluster

import (
	"net/http"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// handleArtifactsGC is POST /v1/artifacts/gc on the leader: the store's
// content-addressed objects that no catalog entry references (a template
// published again, deleted; a Platform withdrawn) are removed once older
// than the age asked. No publish of this cluster runs meanwhile
// (s.publishing), and the age keeps an object another writer has just put.
// Named objects (Transfer
// archives) are ctrl's Transfer driver's, not this collector's.
// artifactRoutes: the collection of the artifact store.
func (s *Server) artifactRoutes() []route {
	return []route{
		{"POST", "/v1/artifacts/gc", operators, atLeader, decoded(s.handleArtifactsGC)},
	}
}

func (s *Server) handleArtifactsGC(r *http.Request, req api.ArtifactsGCRequest) response {
	age := api.DefaultGCAge
	if req.OlderThanSeconds != nil {
		if *req.OlderThanSeconds < 0 {
			return fail(api.Errorf(api.CodeInvalidArgument, "artifacts gc: older_than %ds is negative: give an age of 0s or more", *req.OlderThanSeconds))
		}
		age = time.Duration(*req.OlderThanSeconds) * time.Second
	}
	st, err := s.needStore("artifacts gc")
	if err != nil {
		return fail(err)
	}
	s.publishing.Lock()
	defer s.publishing.Unlock()
	listed, err := st.List(r.Context())
	if err != nil {
		return fail(err)
	}
	var refs map[string]string
	if err := s.fsm.View(func(tx *bolt.Tx) (err error) { refs, err = fsm.CatalogDigests(tx); return }); err != nil {
		return fail(err)
	}
	res := api.ArtifactsGCResult{Objects: []api.ArtifactsGCObject{}, DryRun: req.DryRun}
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
		case req.DryRun:
			g.Action = api.GCWouldRemove
		default:
			if err := st.Delete(r.Context(), o.Digest); err != nil {
				g.Action, g.Error = api.GCFailed, err.Error()
				s.log.Warn("artifacts gc: object not removed", "digest", o.Digest, "err", err)
				break
			}
			g.Action = api.GCRemoved
			res.RemovedBytes += o.Size
			s.log.Info("artifacts gc: object removed", "digest", o.Digest, "bytes", o.Size)
		}
		res.Objects = append(res.Objects, g)
	}
	return answer(res)
}
