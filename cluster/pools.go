package cluster

import (
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Storage pools over the API: reads of what nodes declare and ctrl
// decided, and the two writes only ctrl can make (capacity, declare-lost).

// poolRoutes are the operator's calls about storage pools.
func (s *Server) poolRoutes() []route {
	return []route{
		{"GET", "/v1/storage-pools", operators, atReader, s.handlePoolList},
		{"GET", "/v1/storage-pools/{id}", operators, atReader, s.handlePoolGet},
		{"POST", "/v1/storage-pools/{id}/capacity", operators, atLeader, decoded(s.handlePoolSetCapacity)},
		{"POST", "/v1/storage-pools/{id}/declare-lost", operators, atLeader, decoded(s.handlePoolDeclareLost)},
	}
}

func (s *Server) handlePoolList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListStoragePools(tx, size, token) })
}

func (s *Server) handlePoolGet(r *http.Request) response {
	id := r.PathValue("id")
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetStoragePool(tx, id) })
}

func (s *Server) handlePoolSetCapacity(r *http.Request, req api.PoolCapacityRequest) response {
	args := fsm.PoolCapacityArgs{PoolID: r.PathValue("id"), CapacityBytes: req.CapacityBytes}
	// Bad input never enters the log; the FSM checks again.
	if err := fsm.CheckPoolCapacity(args); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpPoolSetCapacity, req.WriteMeta, args)
}

func (s *Server) handlePoolDeclareLost(r *http.Request, req api.PoolDeclareLostRequest) response {
	id := r.PathValue("id")
	if err := api.ValidPoolID(id); err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpPoolDeclareLost, req.WriteMeta, fsm.PoolDeclareLostArgs{PoolID: id, ConfirmDataLost: req.ConfirmDataLost})
}
