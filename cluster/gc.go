package cluster

import (
	"net/http"
	"time"

	"github.com/kibotos/kibotos/api"
)

// handleArtifactsGC is POST /v1/artifacts/gc on the leader: the leader's
// collector (ctrl.Leader.CollectArtifacts) removes the store's objects no
// catalog entry references, once older than the age asked. No publish of
// this cluster runs meanwhile (s.publishing).
func (s *Server) handleArtifactsGC(w http.ResponseWriter, r *http.Request) {
	var req api.ArtifactsGCRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	age := api.DefaultGCAge
	if req.OlderThanSeconds != nil {
		if *req.OlderThanSeconds < 0 {
			writeError(w, api.Errorf(api.CodeInvalidArgument, "artifacts gc: older_than %ds is negative: give an age of 0s or more", *req.OlderThanSeconds))
			return
		}
		age = time.Duration(*req.OlderThanSeconds) * time.Second
	}
	st, err := s.needStore("artifacts gc")
	if err != nil {
		writeError(w, err)
		return
	}
	s.publishing.Lock()
	defer s.publishing.Unlock()
	res, err := s.leader.CollectArtifacts(r.Context(), st, age, req.DryRun)
	if err != nil {
		writeError(w, err)
		return
	}
	writeResult(w, res)
}
