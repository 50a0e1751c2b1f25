package cluster

import (
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Volumes over the API: operator certificates only (their routes' rule
// is operators). Bad input is refused before it enters the log;
// the FSM checks again.

// volumeRoutes are the operator's calls about Volumes.
func (s *Server) volumeRoutes() []route {
	return []route{
		{"POST", "/v1/volumes", tenants, atLeader, decoded(s.handleVolumeCreate)},
		{"GET", "/v1/volumes", tenants, atReader, s.handleVolumeList},
		{"GET", "/v1/volumes/{ref}", tenants, atReader, s.handleVolumeGet},
		{"POST", "/v1/volumes/{ref}/resize", tenants, atLeader, decoded(s.handleVolumeResize)},
		{"POST", "/v1/volumes/{ref}/delete", tenants, atLeader, decoded(s.handleVolumeDelete)},
	}
}

func (s *Server) handleVolumeCreate(r *http.Request, req api.VolumeCreateRequest) response {
	ns, err := namespaceArg(r)
	if err != nil {
		return fail(err)
	}
	if err := s.namespaceLevel("volume create", ns); err != nil {
		return fail(err)
	}
	args := fsm.VolumeCreateArgs{Namespace: ns, Name: req.Name, SizeBytes: req.SizeBytes, PoolID: req.PoolID, NodeID: req.NodeID}
	if err := fsm.CheckVolumeCreate(args); err != nil {
		return fail(err)
	}
	if err := noExpectedVersion("volume", req.Name, req.WriteMeta); err != nil {
		return fail(err)
	}
	if req.CommandID == "" {
		// The Volume id derives from the command id.
		req.WriteMeta = api.WriteMeta{CommandID: "api-" + newSessionID()[5:], Generated: true}
	}
	return s.workspaceWrite(r, fsm.OpVolumeCreate, req.WriteMeta, args)
}

func (s *Server) handleVolumeResize(r *http.Request, req api.VolumeResizeRequest) response {
	ref := r.PathValue("ref")
	if err := api.ValidVolumeRef(ref); err != nil {
		return fail(err)
	}
	if err := api.ValidVolumeSize("volume "+ref, req.SizeBytes); err != nil {
		return fail(err)
	}
	ns, err := namespaceArg(r)
	if err != nil {
		return fail(err)
	}
	if err := s.namespaceLevel("volume resize", ns); err != nil {
		return fail(err)
	}
	return s.workspaceWrite(r, fsm.OpVolumeResize, req.WriteMeta, fsm.VolumeResizeArgs{Namespace: ns, Volume: ref, SizeBytes: req.SizeBytes})
}

func (s *Server) handleVolumeDelete(r *http.Request, req api.WriteMeta) response {
	ref := r.PathValue("ref")
	if err := api.ValidVolumeRef(ref); err != nil {
		return fail(err)
	}
	ns, err := namespaceArg(r)
	if err != nil {
		return fail(err)
	}
	if err := s.namespaceLevel("volume delete", ns); err != nil {
		return fail(err)
	}
	return s.workspaceWrite(r, fsm.OpVolumeDelete, req, fsm.VolumeArgs{Namespace: ns, Volume: ref})
}

func (s *Server) handleVolumeGet(r *http.Request) response {
	ref := r.PathValue("ref")
	ns, _, err := requestNamespace(r)
	if err != nil {
		return fail(err)
	}
	get := func(tx *bolt.Tx) (*api.Volume, error) {
		v, err := fsm.GetVolume(tx, ns, ref)
		if err != nil {
			return nil, err
		}
		return v, visible(r, v.Namespace, "volume "+ref)
	}
	return s.blockingGet(r,
		func(tx *bolt.Tx) (uint64, error) {
			v, err := get(tx)
			if err != nil {
				return 0, err
			}
			return v.Version, nil
		},
		func(tx *bolt.Tx) (any, error) { return get(tx) })
}

func (s *Server) handleVolumeList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	q := r.URL.Query()
	f := fsm.VolumeFilter{PoolID: q.Get("pool"), WorkspaceID: q.Get("workspace")}
	if f.PoolID != "" {
		if err := api.ValidPoolID(f.PoolID); err != nil {
			return fail(err)
		}
	}
	ns, all, err := requestNamespace(r)
	if err != nil {
		return fail(err)
	}
	if !all {
		f.Namespace = &ns
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListVolumes(tx, f, size, token) })
}
