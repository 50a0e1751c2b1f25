package cluster

import (
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Volumes over the API: operator certificates only (the routes wrap
// these in operator()). Bad input is refused before it enters the log;
// the FSM checks again.

func (s *Server) handleVolumeCreate(w http.ResponseWriter, r *http.Request) {
	var req api.VolumeCreateRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	args := fsm.VolumeCreateArgs{Name: req.Name, SizeBytes: req.SizeBytes, PoolID: req.PoolID, NodeID: req.NodeID}
	if err := fsm.CheckVolumeCreate(args); err != nil {
		writeError(w, err)
		return
	}
	if err := noExpectedVersion("volume", req.Name, req.WriteMeta); err != nil {
		writeError(w, err)
		return
	}
	if req.CommandID == "" {
		// The Volume id derives from the command id.
		req.WriteMeta = api.WriteMeta{CommandID: "api-" + newSessionID()[5:], Generated: true}
	}
	s.workspaceWrite(w, r, fsm.OpVolumeCreate, req.WriteMeta, args)
}

func (s *Server) handleVolumeResize(w http.ResponseWriter, r *http.Request) {
	var req api.VolumeResizeRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	ref := r.PathValue("ref")
	if err := api.ValidVolumeRef(ref); err != nil {
		writeError(w, err)
		return
	}
	if err := api.ValidVolumeSize("volume "+ref, req.SizeBytes); err != nil {
		writeError(w, err)
		return
	}
	s.workspaceWrite(w, r, fsm.OpVolumeResize, req.WriteMeta, fsm.VolumeResizeArgs{Volume: ref, SizeBytes: req.SizeBytes})
}

func (s *Server) handleVolumeDelete(w http.ResponseWriter, r *http.Request) {
	var req api.WriteMeta
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	ref := r.PathValue("ref")
	if err := api.ValidVolumeRef(ref); err != nil {
		writeError(w, err)
		return
	}
	s.workspaceWrite(w, r, fsm.OpVolumeDelete, req, fsm.VolumeArgs{Volume: ref})
}

func (s *Server) handleVolumeGet(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("ref")
	s.blockingGet(w, r,
		func(tx *bolt.Tx) (uint64, error) {
			v, err := fsm.GetVolume(tx, ref)
			if err != nil {
				return 0, err
			}
			return v.Version, nil
		},
		func(tx *bolt.Tx) (any, error) { return fsm.GetVolume(tx, ref) })
}

func (s *Server) handleVolumeList(w http.ResponseWriter, r *http.Request) {
	size, token, err := pageParams(r)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	f := fsm.VolumeFilter{PoolID: q.Get("pool"), WorkspaceID: q.Get("workspace")}
	if f.PoolID != "" {
		if err := api.ValidPoolID(f.PoolID); err != nil {
			writeError(w, err)
			return
		}
	}
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.ListVolumes(tx, f, size, token) })
}
