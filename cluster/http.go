package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/trust"
)

// Headers between members. The actor headers are honoured only from ctrl
// members (they forward to the leader for the caller they authenticated);
// from anyone else they are dropped.
const (
	hdrActor         = "X-Kibotos-Actor"          // who asked: node id of a member, admin@<node> of an operator
	hdrActorKind     = "X-Kibotos-Actor-Kind"     // trust.KindMember or trust.KindAdmin
	hdrActorNode     = "X-Kibotos-Actor-Node"     // the node the actor's certificate names
	hdrActorRoles    = "X-Kibotos-Actor-Roles"    // a member actor's roles
	hdrActorAdmitted = "X-Kibotos-Actor-Admitted" // admission time in the actor's certificate (unix ns)
	hdrForwarded     = "X-Kibotos-Forwarded"      // hop count of a forwarded request
	hdrApplied       = "X-Kibotos-Applied"        // the leader's applied index when it answered a forwarded write
	hdrLeader        = "X-Kibotos-Leader"         // ctrl members name the leader they know in every answer
	maxHops          = 3
	maxBody          = 4 << 20
)

var actorHeaders = []string{hdrActor, hdrActorKind, hdrActorNode, hdrActorRoles, hdrActorAdmitted}

type caller struct {
	id     trust.Identity // the caller's identity; on a forwarded request, the original caller's
	name   string         // id.Name(): node id of a member, "admin@<node>" of an operator
	kind   string         // trust.KindMember or trust.KindAdmin
	viaHop bool
}

type ctxKey struct{}

func callerOf(r *http.Request) caller {
	c, _ := r.Context().Value(ctxKey{}).(caller)
	return c
}

// authenticate admits a request only with a certificate of this cluster
// whose node is admitted (checked against the local replica on every
// request), except the join endpoint, whose credential is the grant in the
// body. Data-plane certificates call nothing.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l := s.leaderAddr(); l != "" {
			w.Header().Set(hdrLeader, l)
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if r.URL.Path == "/v1/join" {
			host := remoteHost(r)
			if !s.joinLimit.allow(host) {
				writeError(w, api.Errorf(api.CodeResourceExhausted, "member %s refused too many joins from %s (at most %d a second after %d); wait and join with a valid grant", s.id.NodeID, host, joinRate, joinBurst))
				return
			}
			rec := &resultRecorder{ResponseWriter: w, status: http.StatusOK}
			next.ServeHTTP(rec, r)
			if rec.status != http.StatusOK && rec.status != http.StatusMisdirectedRequest {
				s.joinLimit.refused(host)
			}
			return
		}
		c, err := s.authenticateRequest(r)
		for _, h := range actorHeaders {
			r.Header.Del(h)
		}
		if err != nil {
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, c)))
	})
}

func (s *Server) authenticateRequest(r *http.Request) (caller, error) {
	if r.TLS == nil {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "the API is served over TLS only")
	}
	id, err := s.peerIdentity(*r.TLS)
	if err != nil {
		return caller{}, err
	}
	if id.Kind == trust.KindDataPlane {
		return caller{}, api.Errorf(api.CodePermissionDenied, "%s presented a data-plane certificate: it serves Workspace connections and calls no API", id.NodeID)
	}
	if err := s.admitted(id); err != nil {
		return caller{}, err
	}
	c := caller{id: id, name: id.Name(), kind: id.Kind}
	if r.Header.Get(hdrActor) == "" || id.Kind != trust.KindMember || !id.HasRole(trust.RoleCtrl) {
		return c, nil // only a ctrl member speaks for another caller
	}
	actor, err := actorFromHeaders(r.Header, id.ClusterID)
	if err != nil {
		return caller{}, err
	}
	if err := s.admitted(actor); err != nil {
		return caller{}, err
	}
	return caller{id: actor, name: actor.Name(), kind: actor.Kind, viaHop: true}, nil
}

func actorFromHeaders(h http.Header, clusterID string) (trust.Identity, error) {
	id := trust.Identity{ClusterID: clusterID, Kind: h.Get(hdrActorKind), NodeID: h.Get(hdrActorNode)}
	if id.Kind != trust.KindMember && id.Kind != trust.KindAdmin {
		return id, api.Errorf(api.CodeInvalidArgument, "forwarded request names actor kind %q", id.Kind)
	}
	if roles := h.Get(hdrActorRoles); roles != "" {
		id.Roles = strings.Split(roles, ",")
	}
	ns, err := strconv.ParseInt(h.Get(hdrActorAdmitted), 10, 64)
	if err != nil || id.NodeID == "" {
		return id, api.Errorf(api.CodeInvalidArgument, "forwarded request for %q lacks the actor's node or admission", h.Get(hdrActor))
	}
	id.Admitted = time.Unix(0, ns).UTC()
	if id.Name() != h.Get(hdrActor) {
		return id, api.Errorf(api.CodeInvalidArgument, "forwarded request names actor %q but node %q", h.Get(hdrActor), id.NodeID)
	}
	return id, nil
}

func setActorHeaders(h http.Header, id trust.Identity) {
	h.Set(hdrActor, id.Name())
	h.Set(hdrActorKind, id.Kind)
	h.Set(hdrActorNode, id.NodeID)
	if len(id.Roles) > 0 {
		h.Set(hdrActorRoles, strings.Join(id.Roles, ","))
	}
	h.Set(hdrActorAdmitted, strconv.FormatInt(id.Admitted.UnixNano(), 10))
}

// operator admits operator (admin) callers only.
func operator(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if requireAdmin(w, r) {
			h(w, r)
		}
	}
}

// member admits members only, for the calls members make of ctrl.
func member(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c := callerOf(r); c.kind != trust.KindMember {
			writeError(w, api.Errorf(api.CodePermissionDenied, "%s is not a member: %s is an internal call of members", c.name, r.URL.Path))
			return
		}
		h(w, r)
	}
}

// ctrlLocal serves h on this ctrl member (it needs the CA key, which every
// ctrl member holds); node-only members send the caller to ctrl.
func (s *Server) ctrlLocal(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.raft == nil || s.ca.Key == nil {
			s.misdirect(w)
			return
		}
		h(w, r)
	}
}

func (s *Server) routes() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/status", s.handleStatus)
	// This member's own metrics, also on a node-only member (never
	// misdirected): what Prometheus scrapes with an admin certificate.
	m.HandleFunc("GET /metrics", operator(s.handleMetrics))
	m.HandleFunc("POST /v1/join", s.onLeader(s.handleJoin))
	m.HandleFunc("POST /v1/internal/raft/voter", member(s.onLeader(s.handleAddVoter)))
	m.HandleFunc("GET /v1/internal/member-level", member(s.handleMemberLevel))
	m.HandleFunc("POST /v1/internal/certs/renew", member(s.ctrlLocal(s.handleRenew)))
	m.HandleFunc("POST /v1/internal/certs/dataplane", member(s.ctrlLocal(s.handleDataPlaneCert)))
	m.HandleFunc("POST /v1/internal/admission", member(s.ctrlLocal(s.handleAdmission)))
	m.HandleFunc("GET /v1/internal/egress/{name}/revisions/{rev}", member(s.reader(s.handleEgressCredentials)))
	m.HandleFunc("GET /v1/internal/machine-logs/{instance}", s.handleNodeMachineLog)
	m.HandleFunc("POST /v1/internal/templates/{name}/upload", nodeUploadRoute(s, "templates are published through ctrl (kibo template publish)", s.publishTemplate))
	m.HandleFunc("POST /v1/internal/transfers/export", s.handleNodeTransferExport)
	m.HandleFunc("GET /v1/internal/transfers/{name}/progress", s.handleNodeTransferProgress)
	m.HandleFunc("GET /v1/internal/progress/{key}", s.handleNodeProgress)
	m.HandleFunc("POST /v1/internal/platforms/{name}/upload", nodeUploadRoute(s, "Platforms are published through ctrl (kibo platform publish)", s.publishPlatform))

	m.HandleFunc("GET /v1/nodes", operator(s.reader(s.handleNodeList)))
	m.HandleFunc("GET /v1/nodes/{id}", operator(s.reader(s.handleNodeGet)))
	m.HandleFunc("POST /v1/nodes/{id}/drain", operator(s.onLeader(s.nodeWrite(fsm.OpNodeDrain))))
	m.HandleFunc("POST /v1/nodes/{id}/cancel-drain", operator(s.onLeader(s.nodeWrite(fsm.OpNodeCancelDrain))))
	m.HandleFunc("POST /v1/nodes/{id}/isolate", operator(s.onLeader(s.nodeWrite(fsm.OpNodeIsolate))))
	m.HandleFunc("POST /v1/nodes/{id}/retire", operator(s.onLeader(s.nodeWrite(fsm.OpNodeRetire))))
	m.HandleFunc("POST /v1/nodes/{id}/overcommit", operator(s.onLeader(s.handleOvercommitSet)))
	m.HandleFunc("GET /v1/overcommit", operator(s.reader(s.handleOvercommitGet)))
	m.HandleFunc("POST /v1/overcommit/default", operator(s.onLeader(s.handleOvercommitSetDefault)))

	m.HandleFunc("POST /v1/workspaces", operator(s.onLeader(s.handleWorkspaceCreate)))
	m.HandleFunc("GET /v1/workspaces", operator(s.reader(s.handleWorkspaceList)))
	m.HandleFunc("GET /v1/workspaces/{id}", operator(s.reader(s.handleWorkspaceGet)))
	m.HandleFunc("GET /v1/workspaces/{id}/cleanup-status", operator(s.reader(s.handleCleanupStatus)))
	m.HandleFunc("GET /v1/workspaces/{id}/logs", operator(s.reader(s.handleMachineLog)))
	m.HandleFunc("GET /v1/workspaces/{id}/progress", operator(s.reader(s.handleWorkspaceProgress)))
	m.HandleFunc("POST /v1/workspaces/{id}/start", operator(s.onLeader(s.workspaceOp(fsm.OpWorkspaceStart))))
	m.HandleFunc("POST /v1/workspaces/{id}/stop", operator(s.onLeader(s.workspaceOp(fsm.OpWorkspaceStop))))
	m.HandleFunc("POST /v1/workspaces/{id}/pause", operator(s.onLeader(s.workspaceOp(fsm.OpWorkspacePause))))
	m.HandleFunc("POST /v1/workspaces/{id}/delete", operator(s.onLeader(s.workspaceOp(fsm.OpWorkspaceDelete))))
	m.HandleFunc("POST /v1/workspaces/{id}/network", operator(s.onLeader(s.handleWorkspaceSetNetwork)))
	m.HandleFunc("POST /v1/workspaces/{id}/credentials", operator(s.onLeader(s.handleCredential)))

	m.HandleFunc("POST /v1/egress", operator(s.onLeader(s.handleEgressCreate)))
	m.HandleFunc("GET /v1/egress", operator(s.reader(s.handleEgressList)))
	m.HandleFunc("GET /v1/egress/{name}", operator(s.reader(s.handleEgressGet)))
	m.HandleFunc("POST /v1/egress/{name}/update", operator(s.onLeader(s.handleEgressUpdate)))
	m.HandleFunc("POST /v1/egress/{name}/delete", operator(s.onLeader(s.objectWrite(fsm.OpEgressDelete, objectName("egress")))))
	m.HandleFunc("POST /v1/resolvers", operator(s.onLeader(s.handleResolverCreate)))
	m.HandleFunc("GET /v1/resolvers", operator(s.reader(s.handleResolverList)))
	m.HandleFunc("GET /v1/resolvers/{name}", operator(s.reader(s.handleResolverGet)))
	m.HandleFunc("POST /v1/resolvers/{name}/delete", operator(s.onLeader(s.objectWrite(fsm.OpResolverDelete, objectName("resolver")))))

	m.HandleFunc("GET /v1/templates", operator(s.reader(s.handleTemplateList)))
	m.HandleFunc("GET /v1/templates/{name}", operator(s.reader(s.handleTemplateGet)))
	m.HandleFunc("POST /v1/templates/{name}/publish", operator(s.onLeader(s.handleTemplatePublish)))
	m.HandleFunc("GET /v1/templates/{name}/publish-progress", operator(s.reader(s.handleTemplatePublishProgress)))
	m.HandleFunc("POST /v1/templates/{name}/delete", operator(s.onLeader(s.objectWrite(fsm.OpTemplateDelete, api.ValidTemplateName))))
	m.HandleFunc("GET /v1/transfers", operator(s.reader(s.handleTransferList)))
	m.HandleFunc("GET /v1/transfers/{name}", operator(s.reader(s.handleTransferGet)))
	m.HandleFunc("POST /v1/transfers", operator(s.onLeader(s.handleTransferExport)))
	m.HandleFunc("POST /v1/transfers/{name}/delete", operator(s.onLeader(s.handleTransferDelete)))
	m.HandleFunc("POST /v1/transfers/{name}/import", operator(s.onLeader(s.handleTransferImport)))
	m.HandleFunc("POST /v1/artifacts/gc", operator(s.onLeader(s.handleArtifactsGC)))
	m.HandleFunc("GET /v1/platforms", operator(s.reader(s.handlePlatformList)))
	m.HandleFunc("GET /v1/platforms/{name}", operator(s.reader(s.handlePlatformGet)))
	m.HandleFunc("POST /v1/platforms/publish", operator(s.onLeader(s.handlePlatformPublish)))
	m.HandleFunc("GET /v1/platforms/publish-progress", operator(s.reader(s.handlePlatformPublishProgress)))
	m.HandleFunc("POST /v1/platforms/{name}/approve", operator(s.onLeader(s.objectWrite(fsm.OpPlatformApprove, api.ValidPlatformID))))
	m.HandleFunc("POST /v1/platforms/{name}/withdraw", operator(s.onLeader(s.objectWrite(fsm.OpPlatformWithdraw, api.ValidPlatformID))))

	m.HandleFunc("GET /v1/storage-pools", operator(s.reader(s.handlePoolList)))
	m.HandleFunc("GET /v1/storage-pools/{id}", operator(s.reader(s.handlePoolGet)))
	m.HandleFunc("POST /v1/storage-pools/{id}/capacity", operator(s.onLeader(s.handlePoolSetCapacity)))
	m.HandleFunc("POST /v1/storage-pools/{id}/declare-lost", operator(s.onLeader(s.handlePoolDeclareLost)))

	m.HandleFunc("POST /v1/volumes", operator(s.onLeader(s.handleVolumeCreate)))
	m.HandleFunc("GET /v1/volumes", operator(s.reader(s.handleVolumeList)))
	m.HandleFunc("GET /v1/volumes/{ref}", operator(s.reader(s.handleVolumeGet)))
	m.HandleFunc("POST /v1/volumes/{ref}/resize", operator(s.onLeader(s.handleVolumeResize)))
	m.HandleFunc("POST /v1/volumes/{ref}/delete", operator(s.onLeader(s.handleVolumeDelete)))

	m.HandleFunc("GET /v1/enrollment/grants", operator(s.reader(s.handleGrantList)))
	m.HandleFunc("POST /v1/enrollment/grants", operator(s.onLeader(s.handleGrant)))
	m.HandleFunc("POST /v1/enrollment/grants/{id}/revoke", operator(s.onLeader(s.handleRevoke)))
	return s.authenticate(m)
}

// onLeader runs h on the leader; elsewhere the request is forwarded there.
func (s *Server) onLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.awaitLeader(r.Context())
		if s.IsLeader() {
			if r.Header.Get(hdrForwarded) != "" {
				w = &appliedHeader{ResponseWriter: w, s: s}
			}
			h(w, r)
			return
		}
		s.forward(w, r)
	}
}

// leaderWait bounds how long a request waits for an election's outcome.
const leaderWait = 5 * time.Second

// awaitLeader waits, at most leaderWait and never past the request, until
// this ctrl member leads or knows who does: a write that reaches a member
// in the middle of an election (the old leader gone, no heartbeat from
// the new one yet) waits for its outcome instead of failing at once.
func (s *Server) awaitLeader(ctx context.Context) {
	if s.raft == nil {
		return // not a ctrl member: forward says where to go
	}
	deadline := time.Now().Add(leaderWait)
	for !s.IsLeader() {
		if l := s.leaderAddr(); l != "" && l != s.id.Advertise {
			return
		}
		if time.Now().After(deadline) || ctxsleep.Sleep(ctx, 20*time.Millisecond) != nil {
			return
		}
	}
}

// appliedHeader tells the member that forwarded a write how far the
// leader had applied the log when it answered: the entry of the write is
// at or below it, and the member answers its client only once it has
// applied as far, so the client reads its own write there.
type appliedHeader struct {
	http.ResponseWriter
	s     *Server
	wrote bool
}

func (a *appliedHeader) WriteHeader(status int) {
	if !a.wrote {
		a.wrote = true
		a.Header().Set(hdrApplied, strconv.FormatUint(a.s.appliedIndex(), 10))
	}
	a.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (a *appliedHeader) Unwrap() http.ResponseWriter { return a.ResponseWriter }

func (a *appliedHeader) Write(b []byte) (int, error) {
	if !a.wrote {
		a.WriteHeader(http.StatusOK)
	}
	return a.ResponseWriter.Write(b)
}

// appliedWait bounds how long a member holds a forwarded write's answer
// for its own state to catch up (a member cut off from the leader answers
// anyway, and says so in its log).
const appliedWait = 5 * time.Second

// appliedIndex is how far this member's state has applied the log: the
// FSM's own count, since Raft's AppliedIndex moves when a batch is handed
// to the FSM, before it is applied. Until an entry is applied here (after
// a restart or a snapshot restore) Raft's is all there is.
func (s *Server) appliedIndex() uint64 {
	if s.raft == nil || s.rfsm == nil {
		return 0
	}
	if n := s.rfsm.applied.Load(); n > 0 {
		return n
	}
	return s.raft.AppliedIndex()
}

// awaitApplied waits until this member applied the log up to index, at
// most d: a forwarded write is answered once the client can read it here.
func (s *Server) awaitApplied(ctx context.Context, index uint64, d time.Duration) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		changed := s.changed.next() // before the check: no change is missed
		if s.appliedIndex() >= index {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			s.log.Warn("forwarded write answered before this member applied it", "index", index, "applied", s.appliedIndex())
			return
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		}
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

// forward sends the request to the leader and copies the answer back
// (ctrl members). A node-only member never speaks for its caller: it names
// the ctrl members, and the caller goes there with its own certificate.
func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	if s.raft == nil {
		s.misdirect(w)
		return
	}
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
	if l := s.leaderAddr(); l != "" && l != s.id.Advertise {
		targets = []string{l}
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
			setActorHeaders(req.Header, c.id)
		}
		resp, err := s.httpClient.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		if index, err := strconv.ParseUint(resp.Header.Get(hdrApplied), 10, 64); err == nil && s.fsm != nil {
			s.awaitApplied(r.Context(), index, appliedWait)
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
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalidArgument, "request body holds more than one JSON value: send exactly one")
	}
	return nil
}

// handleMetrics serves the handler SetMetrics installed.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	h := s.metrics.Load()
	if h == nil {
		writeError(w, api.Errorf(api.CodeUnavailable, "member %s serves no metrics yet: it is still starting", s.id.NodeID))
		return
	}
	(*h).ServeHTTP(w, r)
}

// SetMetrics installs what GET /metrics serves.
func (s *Server) SetMetrics(h http.Handler) { s.metrics.Store(&h) }

// misdirect answers a call that only ctrl serves on a node-only member:
// 421 with the ctrl members' addresses (api.Client follows it).
func (s *Server) misdirect(w http.ResponseWriter) {
	addrs := s.ctrlAddrs()
	if len(addrs) == 0 {
		writeError(w, api.Errorf(api.CodeUnavailable, "member %s is not a ctrl member and knows none: check that the ctrl members are running", s.id.NodeID))
		return
	}
	w.Header().Set(api.HdrCtrl, strings.Join(addrs, ","))
	writeJSON(w, http.StatusMisdirectedRequest, api.ErrorBody{Error: api.Errorf(api.CodeUnavailable,
		"member %s is not a ctrl member: call a ctrl member (%s) directly", s.id.NodeID, strings.Join(addrs, ", "))})
}

// requireAdmin refuses member certificates on operator endpoints.
func requireAdmin(w http.ResponseWriter, r *http.Request) bool {
	if callerOf(r).kind != trust.KindAdmin {
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
