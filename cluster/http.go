package cluster

import (
	"bytes"
	"context"
	"encoding/json"
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
	hdrActor         = "X-Kibotos-Actor"          // who asked: node id of a member, admin@<node> of a host's operator certificate, operator:<name> of a person's
	hdrActorKind     = "X-Kibotos-Actor-Kind"     // trust.KindMember, trust.KindAdmin or trust.KindOperator
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
	name   string         // id.Name(): node id of a member, "admin@<node>" or "operator:<name>" of an operator
	kind   string         // trust.KindMember, trust.KindAdmin or trust.KindOperator
	viaHop bool
	hop    string     // on a forwarded request, the ctrl member that forwarded it
	key    *keyCaller // the API key of a request authenticated with one
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
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if r.URL.Path == joinPath {
			host := remoteHost(r)
			if !s.joinLimit.allow(host) {
				fail(api.Errorf(api.CodeResourceExhausted, "member %s refused too many joins from %s (at most %d a second after %d); wait and join with a valid grant", s.id.NodeID, host, refusedRate, refusedBurst)).render(w)
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
			s.auditRefused(r, "", err)
			fail(err).render(w)
			return
		}
		// Who leads is told to those who may call (not to anyone who
		// connects).
		if l := s.leaderAddr(); l != "" {
			w.Header().Set(hdrLeader, l)
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
	if r.Header.Get(hdrActorKind) == kindAPIKey {
		c, err := s.keyActor(r.Header.Get(hdrActor))
		c.viaHop, c.hop = true, id.NodeID
		return c, err
	}
	actor, err := actorFromHeaders(r.Header, id.ClusterID)
	if err != nil {
		return caller{}, err
	}
	if err := s.admitted(actor); err != nil {
		return caller{}, err
	}
	return caller{id: actor, name: actor.Name(), kind: actor.Kind, viaHop: true, hop: id.NodeID}, nil
}

func actorFromHeaders(h http.Header, clusterID string) (trust.Identity, error) {
	id := trust.Identity{ClusterID: clusterID, Kind: h.Get(hdrActorKind), NodeID: h.Get(hdrActorNode)}
	if id.Kind != trust.KindMember && id.Kind != trust.KindAdmin && id.Kind != trust.KindOperator {
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

// ctrlLocal serves h on this ctrl member (it needs the CA key, which every
// ctrl member holds); node-only members send the caller to ctrl.
func (s *Server) ctrlLocal(h handler) handler {
	return func(r *http.Request) response {
		if s.raft == nil || !s.holdsCAKey() {
			return s.misdirect()
		}
		return h(r)
	}
}

// onLeader runs h on the leader; elsewhere the request is forwarded there.
func (s *Server) onLeader(h handler) handler {
	return func(r *http.Request) response {
		s.awaitLeader(r.Context())
		if !s.IsLeader() {
			return s.forward(r)
		}
		res := h(r)
		if r.Header.Get(hdrForwarded) == "" {
			return res
		}
		return rawResponse(func(w http.ResponseWriter) { res.render(&appliedHeader{ResponseWriter: w, s: s}) })
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
func (s *Server) reader(h handler) handler {
	return func(r *http.Request) response {
		consistent := r.URL.Query().Get("consistent") == "true"
		switch {
		case s.fsm == nil || (consistent && !s.IsLeader()):
			return s.forward(r)
		case consistent:
			if err := s.raft.VerifyLeader().Error(); err != nil {
				return fail(api.Errorf(api.CodeUnavailable, "member %s could not confirm it leads ctrl: %v; retry", s.id.NodeID, err))
			}
			// A new leader may not have applied what the old one
			// acknowledged until its barrier is through.
			if !s.consistentReady.Load() {
				return fail(api.Errorf(api.CodeUnavailable, "member %s was just elected ctrl leader and is catching up; retry", s.id.NodeID))
			}
			return h(r)
		default:
			return h(r)
		}
	}
}

// forward sends the request to the leader and copies the answer back
// (ctrl members). A node-only member never speaks for its caller: it names
// the ctrl members, and the caller goes there with its own certificate.
func (s *Server) forward(r *http.Request) response {
	if s.raft == nil {
		return s.misdirect()
	}
	hops, _ := strconv.Atoi(r.Header.Get(hdrForwarded))
	if hops >= maxHops {
		return fail(api.Errorf(api.CodeUnavailable, "request was forwarded %d times without reaching the ctrl leader; retry once the leader is elected", hops))
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "read request body: %v", err))
	}
	var targets []string
	if l := s.leaderAddr(); l != "" && l != s.id.Advertise {
		targets = []string{l}
	}
	if len(targets) == 0 {
		return fail(api.Errorf(api.CodeUnavailable, "no ctrl leader is elected: check that a majority of ctrl members are running and can reach each other"))
	}
	c := callerOf(r)
	var lastErr error
	for _, t := range targets {
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, "https://"+t+r.URL.RequestURI(), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(hdrForwarded, strconv.Itoa(hops+1))
		switch {
		case c.key != nil:
			req.Header.Set(hdrActor, c.name)
			req.Header.Set(hdrActorKind, kindAPIKey)
		case c.name != "":
			setActorHeaders(req.Header, c.id)
		}
		resp, err := s.memberClient().Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		if index, err := strconv.ParseUint(resp.Header.Get(hdrApplied), 10, 64); err == nil && s.fsm != nil {
			s.awaitApplied(r.Context(), index, appliedWait)
		}
		return rawResponse(func(w http.ResponseWriter) {
			defer resp.Body.Close()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
		})
	}
	return fail(api.Errorf(api.CodeUnavailable, "no ctrl member answered (%v): check that the ctrl members are running", lastErr))
}

// handleMetrics serves the metrics handler ServeLocal gave.
func (s *Server) handleMetrics(r *http.Request) response {
	h := s.own().Metrics
	if h == nil {
		return fail(api.Errorf(api.CodeUnavailable, "member %s serves no metrics yet: it is still starting", s.id.NodeID))
	}
	return rawResponse(func(w http.ResponseWriter) { h.ServeHTTP(w, r) })
}

// misdirect answers a call that only ctrl serves on a node-only member:
// 421 with the ctrl members' addresses (api.Client follows it).
func (s *Server) misdirect() response {
	addrs := s.ctrlAddrs()
	if len(addrs) == 0 {
		return fail(api.Errorf(api.CodeUnavailable, "member %s is not a ctrl member and knows none: check that the ctrl members are running", s.id.NodeID))
	}
	return rawResponse(func(w http.ResponseWriter) {
		w.Header().Set(api.HdrCtrl, strings.Join(addrs, ","))
		writeJSON(w, http.StatusMisdirectedRequest, api.ErrorBody{Error: api.Errorf(api.CodeUnavailable,
			"member %s is not a ctrl member: call a ctrl member (%s) directly", s.id.NodeID, strings.Join(addrs, ", "))})
	})
}

// write applies op on the leader and answers with its result.
func (s *Server) write(r *http.Request, op string, meta api.WriteMeta, args any) response {
	res, err := s.applyWrite(r, op, meta, args)
	if err != nil {
		return fail(err)
	}
	return resultResponse{value: res.Value, replayed: res.Replayed}
}

// applyWrite applies op on the leader for r's caller; a refusal of the
// state machine is the error.
func (s *Server) applyWrite(r *http.Request, op string, meta api.WriteMeta, args any) (fsm.Result, error) {
	raw, err := json.Marshal(args)
	if err != nil {
		return fsm.Result{}, err
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	res, err := s.Apply(ctx, fsm.Entry{CommandID: meta.CommandID, ExpectedVersion: meta.ExpectedVersion, Actor: callerOf(r).name, Op: op, Args: raw})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	s.quotaRefusals.note(err)
	return res, err
}

func (s *Server) view(fn func(tx *bolt.Tx) (any, error)) response {
	var out any
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		out, err = fn(tx)
		return err
	})
	if err != nil {
		return fail(err)
	}
	return answer(out)
}

// memberClient is the client of member-authenticated calls to ctrl
// members.
func (s *Server) memberClient() *http.Client { return s.memberHTTP.Load() }

// resetMemberConns starts a new client for member calls and closes the
// idle connections of the one before: after this member's certificate was
// renewed, or the CAs it trusts changed, a kept-alive connection would go
// on presenting the certificate of its handshake, which a peer that
// dropped its CA refuses on every request for as long as calls keep it
// alive. Requests under way finish on their connections, which then
// idle out of the old client's pool.
func (s *Server) resetMemberConns() {
	c := &http.Client{Transport: s.client.HTTPTransport(trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, 3*time.Second), Timeout: 60 * time.Second}
	if old := s.memberHTTP.Swap(c); old != nil {
		old.CloseIdleConnections()
	}
}
