package cluster

import (
	"net/http"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/fsm"
)

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	if s.fsm == nil {
		if err := s.admittedByCtrl(callerOf(r).id); err != nil {
			writeError(w, err)
			return
		}
	}
	st := api.Status{ClusterID: s.id.ClusterID, NodeID: s.id.NodeID, Roles: s.id.Roles, Advertise: s.id.Advertise,
		RaftState: "none", Release: buildinfo.ReleaseName(), Revision: buildinfo.SourceRevision(), Time: time.Now().UTC()}
	if s.raft != nil {
		st.RaftState = s.raft.State().String()
	}
	st.Leader = s.leaderAddr() // node-only members: the leader a ctrl member last named
	writeResult(w, st)
}

func (s *Server) handleNodeList(w http.ResponseWriter, r *http.Request) {
	size := 0
	if v := r.URL.Query().Get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, api.Errorf(api.CodeInvalidArgument, "page size %q is not a non-negative integer", v))
			return
		}
		size = n
	}
	token := r.URL.Query().Get("page_token")
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.ListNodes(tx, size, token) })
}

func (s *Server) handleNodeGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.GetNode(tx, id) })
}

// nodeWrite serves drain, cancel-drain, isolate and retire.
func (s *Server) nodeWrite(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !requireAdmin(w, r) {
			return
		}
		var req api.NodeWriteRequest
		if err := decodeBody(r, &req); err != nil {
			writeError(w, err)
			return
		}
		id := r.PathValue("id")
		switch op {
		case fsm.OpNodeIsolate:
			if !req.ConfirmHostCannotWrite {
				writeError(w, api.Errorf(api.CodeInvalidArgument, "isolate of node %s needs --confirm-host-cannot-write: you assert the host is shut down or cut off from its storage", id))
				return
			}
		case fsm.OpNodeRetire:
			if req.Explicit() && req.ExpectedVersion == nil {
				writeError(w, api.Errorf(api.CodeInvalidArgument, "retire of node %s: --command-id needs --expected-version too, so a replay has the same inputs", id))
				return
			}
		}
		s.write(w, r, op, req.WriteMeta, fsm.NodeArgs{NodeID: id})
		s.kickAllSessions() // a drain request reaches the node now, not at the next ping
	}
}

// parseMultiplier reads one overcommit item of a request.
func parseMultiplier(item, v string, allowDefault bool) (*fsm.MultiplierChange, error) {
	if v == "default" && allowDefault {
		return &fsm.MultiplierChange{Default: true}, nil
	}
	m, err := api.ParseMilli(v)
	if err == nil {
		err = fsm.ValidMultiplier(item, m)
		if err == nil {
			return &fsm.MultiplierChange{Value: m}, nil
		}
		return nil, err
	}
	return nil, api.Errorf(api.CodeInvalidArgument, "%s multiplier is not valid: %v; use a decimal between 0 and 16 with at most three places", item, err)
}

// overcommitItems parses the cpu and memory items of a request; with an
// explicit command id both and an expected version are required, so a
// replay's inputs never depend on values read at execution time.
func overcommitItems(req *api.OvercommitSetRequest, allowDefault bool, object string) (cpu, mem *fsm.MultiplierChange, err error) {
	if req.CPU == nil && req.Memory == nil {
		return nil, nil, api.Errorf(api.CodeInvalidArgument, "overcommit of %s: give --cpu, --memory or both", object)
	}
	if req.Explicit() && (req.ExpectedVersion == nil || req.CPU == nil || req.Memory == nil) {
		return nil, nil, api.Errorf(api.CodeInvalidArgument, "overcommit of %s: --command-id needs --expected-version and both --cpu and --memory", object)
	}
	if req.CPU != nil {
		if cpu, err = parseMultiplier("cpu", *req.CPU, allowDefault); err != nil {
			return nil, nil, err
		}
	}
	if req.Memory != nil {
		if mem, err = parseMultiplier("memory", *req.Memory, allowDefault); err != nil {
			return nil, nil, err
		}
	}
	return cpu, mem, nil
}

func (s *Server) handleOvercommitSet(w http.ResponseWriter, r *http.Request) {
	if !requireAdmin(w, r) {
		return
	}
	var req api.OvercommitSetRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	cpu, mem, err := overcommitItems(&req, true, "node "+id)
	if err != nil {
		writeError(w, err)
		return
	}
	s.write(w, r, fsm.OpOvercommitSet, req.WriteMeta, fsm.OvercommitSetArgs{NodeID: id, CPU: cpu, Memory: mem})
}

func (s *Server) handleOvercommitSetDefault(w http.ResponseWriter, r *http.Request) {
	if !requireAdmin(w, r) {
		return
	}
	var req api.OvercommitSetRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	cpu, mem, err := overcommitItems(&req, false, "the cluster default")
	if err != nil {
		writeError(w, err)
		return
	}
	var args fsm.OvercommitDefaultArgs
	if cpu != nil {
		args.CPU = &cpu.Value
	}
	if mem != nil {
		args.Memory = &mem.Value
	}
	s.write(w, r, fsm.OpOvercommitSetDefault, req.WriteMeta, args)
}

func (s *Server) handleOvercommitGet(w http.ResponseWriter, r *http.Request) {
	s.view(w, func(tx *bolt.Tx) (any, error) {
		d, err := fsm.GetOvercommitDefault(tx)
		if err != nil {
			return nil, err
		}
		nodes, err := fsm.ListNodes(tx, 0, "")
		if err != nil {
			return nil, err
		}
		out := api.OvercommitView{Default: d, Nodes: []api.NodeOvercommit{}}
		for _, n := range nodes.Nodes {
			if n.Retired || n.Overcommit == nil {
				continue
			}
			out.Nodes = append(out.Nodes, api.NodeOvercommit{NodeID: n.NodeID, RegistrationVersion: n.RegistrationVersion, Overcommit: *n.Overcommit})
		}
		return out, nil
	})
}

func (s *Server) handleGrantList(w http.ResponseWriter, r *http.Request) {
	s.view(w, func(tx *bolt.Tx) (any, error) { return fsm.ListGrants(tx, time.Now()) })
}

func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request) {
	if !requireAdmin(w, r) {
		return
	}
	var req api.WriteMeta
	if err := decodeBody(r, &req); err != nil {
		writeError(w, err)
		return
	}
	s.write(w, r, fsm.OpEnrollmentRevoke, req, fsm.NodeArgs{NodeID: r.PathValue("id")})
}
