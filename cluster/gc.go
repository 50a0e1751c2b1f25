package cluster

import (
	"net/http"
	"time"

	"github.com/kibotos/kibotos/api"
)

// artifactRoutes: the collection of the artifact store.
func (s *Server) artifactRoutes() []route {
	return []route{
		{"POST", "/v1/artifacts/gc", operators, atLeader, decoded(s.handleArtifactsGC)},
	}
}

// handleArtifactsGC is POST /v1/artifacts/gc on the leader: the leader's
// collector (ctrl.Leader.CollectArtifacts) removes the store's objects no
// catalog entry references, once older than the age asked. No publish of
// this cluster runs meanwhile (s.publishing).
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
	res, err := s.leader.CollectArtifacts(r.Context(), st, age, req.DryRun)
	if err != nil {
		return fail(err)
	}
	return answer(res)
}
