package cluster

import (
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Storage pools over the API: reads of what nodes declare and ctrl
// decided, and the two writes only ctrl can make (capacity, declare-lost).

func (s *Server) handlePoolList(w http.ResponseWriter, r *http.Request) {
	size, token, err := pageParams(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.ListStoragePools(tx, size, token) })
}

func (s *Server) handlePoolGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.GetStoragePool(tx, id) })
}

func (s *Server) handlePoolSetCapacity(w http.ResponseWriter, r *http.Request) {
	var req api.PoolCapacityRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	args := fsm.PoolCapacityArgs{PoolID: r.PathValue("id"), CapacityBytes: req.CapacityBytes}
	// Bad input never enters the log; the FSM checks again.
	if err := fsm.CheckPoolCapacity(args); err != nil {
		writeError(w, err)
		return
	}
	s.write(w, r, fsm.OpPoolSetCapacity, req.WriteMeta, args)
}

func (s *Server) handlePoolDeclareLost(w http.ResponseWriter, r *http.Request) {
	var req api.PoolDeclareLostRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if err := api.ValidPoolID(id); err != nil {
		writeError(w, err)
		return
	}
	s.write(w, r, fsm.OpPoolDeclareLost, req.WriteMeta, fsm.PoolDeclareLostArgs{PoolID: id, ConfirmDataLost: req.ConfirmDataLost})
}
