package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
)

// Headers between members.
const (
	hdrActor     = "X-Kibotos-Actor"     // who asked, set by the first member that authenticated the caller
	hdrForwarded = "X-Kibotos-Forwarded" // hop count of a forwarded request
	hdrLeader    = "X-Kibotos-Leader"    // ctrl members name the leader they know in every answer
	maxHops      = 3
	maxBody      = 4 << 20
)

type caller struct {
	name   string // node id of a member, "admin@<node>" of an admin
	kind   string // datadir.OUMember or datadir.OUAdmin
	viaHop bool
}

type ctxKey struct{}

func callerOf(r *http.Request) caller {
	c, _ := r.Context().Value(ctxKey{}).(caller)
	return c
}

// authenticate admits only callers with a CA-signed certificate, except the
// join endpoint, whose credential is the grant in the body.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l := s.leaderAddr(); l != "" {
			w.Header().Set(hdrLeader, l)
		}
		if r.URL.Path == "/v1/join" {
			next.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
			writeError(w, api.Errorf(api.CodeUnauthenticated, "a client certificate of this cluster is required: run the CLI as root on a member, or pass --data-dir of a member"))
			return
		}
		leaf := r.TLS.PeerCertificates[0]
		c := caller{name: leaf.Subject.CommonName, kind: datadir.CertOU(leaf)}
		if c.kind == datadir.OUMember && r.Header.Get(hdrActor) != "" {
			// A member forwarded the request: act for its caller.
			c.name, c.kind, c.viaHop = r.Header.Get(hdrActor), r.Header.Get(hdrActor+"-Kind"), true
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)))
	})
}

func (s *Server) routes() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/status", s.handleStatus)
	m.HandleFunc("POST /v1/join", s.onLeader(s.handleJoin))
	m.HandleFunc("POST /v1/internal/raft/voter", s.onLeader(s.handleAddVoter))

	m.HandleFunc("GET /v1/nodes", s.reader(s.handleNodeList))
	m.HandleFunc("GET /v1/nodes/{id}", s.reader(s.handleNodeGet))
	m.HandleFunc("POST /v1/nodes/{id}/drain", s.onLeader(s.nodeWrite(fsm.OpNodeDrain)))
	m.HandleFunc("POST /v1/nodes/{id}/cancel-drain", s.onLeader(s.nodeWrite(fsm.OpNodeCancelDrain)))
	m.HandleFunc("POST /v1/nodes/{id}/isolate", s.onLeader(s.nodeWrite(fsm.OpNodeIsolate)))
	m.HandleFunc("POST /v1/nodes/{id}/retire", s.onLeader(s.nodeWrite(fsm.OpNodeRetire)))
	m.HandleFunc("POST /v1/nodes/{id}/overcommit", s.onLeader(s.handleOvercommitSet))
	m.HandleFunc("GET /v1/overcommit", s.reader(s.handleOvercommitGet))
	m.HandleFunc("POST /v1/overcommit/default", s.onLeader(s.handleOvercommitSetDefault))

	m.HandleFunc("POST /v1/workspaces", s.onLeader(s.handleWorkspaceCreate))
	m.HandleFunc("GET /v1/workspaces", s.reader(s.handleWorkspaceList))
	m.HandleFunc("GET /v1/workspaces/{id}", s.reader(s.handleWorkspaceGet))
	m.HandleFunc("GET /v1/workspaces/{id}/cleanup-status", s.reader(s.handleCleanupStatus))
	m.HandleFunc("POST /v1/workspaces/{id}/start", s.onLeader(s.workspaceOp(fsm.OpWorkspaceStart)))
	m.HandleFunc("POST /v1/workspaces/{id}/stop", s.onLeader(s.workspaceOp(fsm.OpWorkspaceStop)))
	m.HandleFunc("POST /v1/workspaces/{id}/delete", s.onLeader(s.workspaceOp(fsm.OpWorkspaceDelete)))
	m.HandleFunc("POST /v1/workspaces/{id}/credentials", s.onLeader(s.handleCredential))

	m.HandleFunc("GET /v1/enrollment/grants", s.reader(s.handleGrantList))
	m.HandleFunc("POST /v1/enrollment/grants", s.onLeader(s.handleGrant))
	m.HandleFunc("POST /v1/enrollment/grants/{id}/revoke", s.onLeader(s.handleRevoke))
	return s.authenticate(m)
}

// onLeader runs h on the leader; elsewhere the request is forwarded there.
func (s *Server) onLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.IsLeader() {
			h(w, r)
			return
		}
		s.forward(w, r)
	}
}

// reader serves reads from the local state when this member has one;
// ?consistent=true reads on the leader after it confirmed its leadership.
func (s *Server) reader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		consistent := r.URL.Query().Get("consistent") == "true"
		switch {
		case s.fsm == nil || (consistent && !s.IsLeader()):
			s.forward(w, r)
		case consistent:
			if err := s.raft.VerifyLeader().Error(); err != nil {
				writeError(w, api.Errorf(api.CodeUnavailable, "member %s could not confirm it leads ctrl: %v; retry", s.id.NodeID, err))
				return
			}
			// A new leader may not have applied what the old one
			// acknowledged until its barrier is through.
			if !s.consistentReady.Load() {
				writeError(w, api.Errorf(api.CodeUnavailable, "member %s was just elected ctrl leader and is catching up; retry", s.id.NodeID))
				return
			}
			h(w, r)
		default:
			h(w, r)
		}
	}
}

// forward sends the request to the leader (ctrl members) or to a ctrl
// member (node-only members) and copies the answer back.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	hops, _ := strconv.Atoi(r.Header.Get(hdrForwarded))
	if hops >= maxHops {
		writeError(w, api.Errorf(api.CodeUnavailable, "request was forwarded %d times without reaching the ctrl leader; retry once the leader is elected", hops))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, api.Errorf(api.CodeInvalidArgument, "read request body: %v", err))
		return
	}
	var targets []string
	if s.raft != nil {
		if l := s.leaderAddr(); l != "" && l != s.id.Advertise {
			targets = []string{l}
		}
	} else {
		targets = s.ctrlAddrs()
	}
	if len(targets) == 0 {
		writeError(w, api.Errorf(api.CodeUnavailable, "no ctrl leader is elected: check that a majority of ctrl members are running and can reach each other"))
		return
	}
	c := callerOf(r)
	var lastErr error
	for _, t := range targets {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, "https://"+t+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(hdrForwarded, strconv.Itoa(hops+1))
		if c.name != "" {
			req.Header.Set(hdrActor, c.name)
			req.Header.Set(hdrActor+"-Kind", c.kind)
		}
		resp, err := s.httpClient.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		if l := resp.Header.Get(hdrLeader); l != "" && s.raft == nil {
			// Node-only members go to the leader first next time, so a read
			// after a write through them sees that write.
			s.leaderHint.Store(l)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		resp.Body.Close()
		return
	}
	writeError(w, api.Errorf(api.CodeUnavailable, "no ctrl member answered (%v): check that the ctrl members are running", lastErr))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var e *api.Error
	if !errors.As(err, &e) {
		e = &api.Error{Code: api.CodeInternal, Message: err.Error()}
	}
	writeJSON(w, e.Code.HTTPStatus(), api.ErrorBody{Error: e})
}

func writeResult(w http.ResponseWriter, v any) {
	writeJSON(w, http.StatusOK, api.ResultBody{Result: v})
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalidArgument, "request body is not valid: %v", err)
	}
	return nil
}

// requireAdmin refuses member certificates on operator endpoints.
func requireAdmin(w http.ResponseWriter, r *http.Request) bool {
	if callerOf(r).kind != datadir.OUAdmin {
		writeError(w, api.Errorf(api.CodePermissionDenied, "%s is not an operator: use the admin credentials of a member data directory", callerOf(r).name))
		return false
	}
	return true
}

// write applies op on the leader and answers with its result.
func (s *Server) write(w http.ResponseWriter, r *http.Request, op string, meta api.WriteMeta, args any) {
	raw, err := json.Marshal(args)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	res, err := s.Apply(ctx, fsm.Entry{CommandID: meta.CommandID, ExpectedVersion: meta.ExpectedVersion, Actor: callerOf(r).name, Op: op, Args: raw})
	if err != nil {
		writeError(w, err)
		return
	}
	if res.Error != nil {
		writeError(w, res.Error)
		return
	}
	writeJSON(w, http.StatusOK, api.ResultBody{Result: res.Value, Replayed: res.Replayed})
}

func (s *Server) view(w http.ResponseWriter, fn func(tx *bolt.Tx) (any, error)) {
	var out any
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeResult(w, out)
}
