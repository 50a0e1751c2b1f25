package cluster

import (
	"net/http"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/fsm"
)

// memberRoutes are what every member serves of itself, and the calls
// members make of ctrl.
func (s *Server) memberRoutes() []route {
	return []route{
		{"GET", "/v1/status", anyCaller, atLocal, s.handleStatus},
		// This member's own metrics, also on a node-only member (never
		// misdirected): what Prometheus scrapes with an admin certificate.
		{"GET", "/metrics", operators, atLocal, s.handleMetrics},
		{"GET", "/v1/internal/member-level", fromCtrl("the leader asks a ctrl member's level"), atLocal, s.handleMemberLevel},
		{"POST", "/v1/internal/raft/voter", members, atLeader, decoded(s.handleAddVoter)},
		{"POST", "/v1/internal/certs/renew", members, atCtrl, decoded(s.handleRenew)},
		{"POST", "/v1/internal/certs/dataplane", nodeMembers, atCtrl, decoded(s.handleDataPlaneCert)},
		{"POST", "/v1/internal/admission", members, atCtrl, decoded(s.handleAdmission)},
		{"POST", keyUsesPath, fromCtrl("only ctrl members report API key uses"), atLeader, decoded(s.handleKeyUses)},
		{"GET", "/v1/internal/egress/{name}/revisions/{rev}", members, atReader, s.handleEgressCredentials},
	}
}

// nodeRoutes are the operator's calls about nodes.
func (s *Server) nodeRoutes() []route {
	return []route{
		{"GET", "/v1/nodes", operators, atReader, s.handleNodeList},
		{"GET", "/v1/nodes/{id}", operators, atReader, s.handleNodeGet},
		{"POST", "/v1/nodes/{id}/drain", operators, atLeader, s.nodeWrite(fsm.OpNodeDrain)},
		{"POST", "/v1/nodes/{id}/cancel-drain", operators, atLeader, s.nodeWrite(fsm.OpNodeCancelDrain)},
		{"POST", "/v1/nodes/{id}/isolate", operators, atLeader, s.nodeWrite(fsm.OpNodeIsolate)},
		{"POST", "/v1/nodes/{id}/retire", operators, atLeader, s.nodeWrite(fsm.OpNodeRetire)},
		{"POST", "/v1/nodes/{id}/overcommit", operators, atLeader, decoded(s.handleOvercommitSet)},
		{"GET", "/v1/overcommit", operators, atReader, s.handleOvercommitGet},
		{"POST", "/v1/overcommit/default", operators, atLeader, decoded(s.handleOvercommitSetDefault)},
	}
}

func (s *Server) handleStatus(r *http.Request) response {
	st := api.Status{ClusterID: s.id.ClusterID, NodeID: s.id.NodeID, Roles: s.id.Roles, Advertise: s.id.Advertise,
		RaftState: "none", Release: buildinfo.ReleaseName(), Revision: buildinfo.SourceRevision(), Time: time.Now().UTC()}
	if s.raft != nil {
		st.RaftState = s.raft.State().String()
	}
	st.Leader = s.leaderAddr() // node-only members: the leader a ctrl member last named
	return answer(st)
}

func (s *Server) handleNodeList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListNodes(tx, size, token) })
}

func (s *Server) handleNodeGet(r *http.Request) response {
	id := r.PathValue("id")
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.GetNode(tx, id) })
}

// nodeWrite serves drain, cancel-drain, isolate and retire.
func (s *Server) nodeWrite(op string) handler {
	return decoded(func(r *http.Request, req api.NodeWriteRequest) response {
		id := r.PathValue("id")
		switch op {
		case fsm.OpNodeIsolate:
			if !req.ConfirmHostCannotWrite {
				return fail(api.Errorf(api.CodeInvalidArgument, "isolate of node %s needs --confirm-host-cannot-write: you assert the host is shut down or cut off from its storage", id))
			}
		case fsm.OpNodeRetire:
			if req.Explicit() && req.ExpectedVersion == nil {
				return fail(api.Errorf(api.CodeInvalidArgument, "retire of node %s: --command-id needs --expected-version too, so a replay has the same inputs", id))
			}
		}
		res := s.write(r, op, req.WriteMeta, fsm.NodeArgs{NodeID: id})
		s.kickAllSessions() // a drain request reaches the node now, not at the next ping
		return res
	})
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

func (s *Server) handleOvercommitSet(r *http.Request, req api.OvercommitSetRequest) response {
	id := r.PathValue("id")
	cpu, mem, err := overcommitItems(&req, true, "node "+id)
	if err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpOvercommitSet, req.WriteMeta, fsm.OvercommitSetArgs{NodeID: id, CPU: cpu, Memory: mem})
}

func (s *Server) handleOvercommitSetDefault(r *http.Request, req api.OvercommitSetRequest) response {
	cpu, mem, err := overcommitItems(&req, false, "the cluster default")
	if err != nil {
		return fail(err)
	}
	var args fsm.OvercommitDefaultArgs
	if cpu != nil {
		args.CPU = &cpu.Value
	}
	if mem != nil {
		args.Memory = &mem.Value
	}
	return s.write(r, fsm.OpOvercommitSetDefault, req.WriteMeta, args)
}

func (s *Server) handleOvercommitGet(r *http.Request) response {
	return s.view(func(tx *bolt.Tx) (any, error) {
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

func (s *Server) handleGrantList(r *http.Request) response {
	if err := noPaging(r, "enrollment grants"); err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListGrants(tx, time.Now()) })
}

func (s *Server) handleRevoke(r *http.Request, req api.WriteMeta) response {
	return s.write(r, fsm.OpEnrollmentRevoke, req, fsm.NodeArgs{NodeID: r.PathValue("id")})
}
