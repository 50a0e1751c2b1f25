package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// peerIdentity is the identity of a client whose certificate the TLS
// handshake verified (chain to the cluster CA, client-auth usage).
func (s *Server) peerIdentity(cs tls.ConnectionState) (trust.Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return trust.Identity{}, api.Errorf(api.CodeUnauthenticated, "a client certificate of this cluster is required: pass an operator credential (--credentials DIR, from kibo operator issue) or run the CLI as root on a ctrl or operator member")
	}
	// The handshake verified the chain against the CAs trusted then; a
	// connection kept alive across the end of a rotation must not outlive
	// the CA it was verified with.
	if !s.roots.TrustsChains(cs.VerifiedChains) {
		return trust.Identity{}, api.Errorf(api.CodeUnauthenticated, "certificate %q was issued by a CA this cluster no longer trusts (the CA was rotated): reissue it, or join the host again", cs.PeerCertificates[0].Subject.CommonName)
	}
	id, err := trust.Identify(cs.PeerCertificates[0])
	if errors.Is(err, trust.ErrNoIdentity) {
		return id, api.Errorf(api.CodeUnauthenticated, "%v: it was issued by an older kibotos; join the host anew", err)
	}
	if err != nil {
		return id, api.Errorf(api.CodeUnauthenticated, "%v", err)
	}
	if id.ClusterID != s.id.ClusterID {
		return id, api.Errorf(api.CodeUnauthenticated, "certificate of %s belongs to cluster %s, not to %s", id.Name(), id.ClusterID, s.id.ClusterID)
	}
	return id, nil
}

// admitted checks the node behind a certificate against the state: it must
// be admitted, not retired, admitted at the time the certificate names (a
// node revoked and joined again invalidates the certificates of its
// earlier admission) and, for members, with every role the certificate
// claims. Ctrl members check their local replica, which follows the log
// within a heartbeat, so a revocation takes effect on every ctrl member
// within about a second of its commit.
func (s *Server) admitted(id trust.Identity) error {
	if s.fsm == nil {
		// A node-only member has no replica: it asks ctrl (cached for
		// admissionTTL), for every call it answers itself, its metrics
		// and its redirects to ctrl included.
		return s.admittedByCtrl(id)
	}
	if id.Kind == trust.KindOperator {
		return s.operatorAccepted(id)
	}
	var a fsm.NodeAdmission
	var ok, bootstrapped bool
	err := s.fsm.View(func(tx *bolt.Tx) error {
		bootstrapped = fsm.ClusterID(tx) != ""
		var err error
		a, ok, err = fsm.Admission(tx, id.NodeID)
		return err
	})
	if err != nil {
		return api.Errorf(api.CodeUnavailable, "member %s could not read the admission of node %s: %v; retry", s.id.NodeID, id.NodeID, err)
	}
	if !bootstrapped {
		// A ctrl member that joined and has not replicated the state yet:
		// the chain and the certificate's role are all it can check.
		return nil
	}
	return admissionError(id, a, ok)
}

func admissionError(id trust.Identity, a fsm.NodeAdmission, ok bool) error {
	switch {
	case !ok:
		return api.Errorf(api.CodeUnauthenticated, "node %s is not registered in this cluster: its certificates are not accepted; join the host with an enrollment grant", id.NodeID)
	case a.Retired:
		return api.Errorf(api.CodeUnauthenticated, "node %s is %s: its certificates are no longer accepted; a new host joins with a new node id", id.NodeID, api.NodeRetired)
	case a.Admission != api.Admitted:
		return api.Errorf(api.CodeUnauthenticated, "node %s is %s: its certificates are no longer accepted; grant it again (kibo enrollment grant %s) and join the host anew", id.NodeID, api.NodeRevoked, id.NodeID)
	case !a.AdmittedAt.Equal(id.Admitted):
		return api.Errorf(api.CodeUnauthenticated, "certificate of %s is from an earlier admission of node %s (%s; admitted again %s): it is no longer accepted; use the credentials the host received when it joined again",
			id.Name(), id.NodeID, id.Admitted.Format(time.RFC3339), a.AdmittedAt.Format(time.RFC3339))
	}
	for _, r := range id.Roles {
		if !contains(a.Roles, r) {
			return api.Errorf(api.CodePermissionDenied, "certificate of node %s claims role %s, which the node was not admitted with (%v)", id.NodeID, r, a.Roles)
		}
	}
	// A host's operator certificate acts for whoever controls the host:
	// only ctrl hosts and hosts admitted as operator may hold one. Those
	// that every member issued before (an older build) are refused here,
	// on every member at once, without waiting for them to expire.
	if id.Kind == trust.KindAdmin && !contains(a.Roles, api.RoleCtrl) && !contains(a.Roles, api.RoleOperator) {
		return api.Errorf(api.CodePermissionDenied, "operator certificate of %s is refused: node %s was admitted as %s, without the ctrl or operator role, so its host holds no operator credential; use a personal one (kibo operator issue NAME)",
			id.Name(), id.NodeID, strings.Join(a.Roles, ","))
	}
	return nil
}

// authorizeRaft admits a Raft connection: only a ctrl member of the
// current configuration. A member that is not in any configuration yet
// (it joined and waits to be added) accepts the ctrl members adding it.
func (s *Server) authorizeRaft(id trust.Identity) error {
	if id.Kind != trust.KindMember || !id.HasRole(trust.RoleCtrl) {
		return api.Errorf(api.CodePermissionDenied, "%s may not speak Raft: only ctrl members may", id.Name())
	}
	if err := s.admitted(id); err != nil {
		return err
	}
	if s.raft == nil {
		return api.Errorf(api.CodePermissionDenied, "member %s is not a ctrl member and takes no Raft connections", s.id.NodeID)
	}
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return api.Errorf(api.CodeUnavailable, "member %s cannot read its Raft configuration: %v", s.id.NodeID, f.Error())
	}
	servers := f.Configuration().Servers
	self := false
	for _, srv := range servers {
		if srv.ID == raft.ServerID(id.NodeID) {
			return nil
		}
		self = self || srv.ID == raft.ServerID(s.id.NodeID)
	}
	if !self {
		return nil
	}
	return api.Errorf(api.CodePermissionDenied, "ctrl member %s is not in the Raft configuration of member %s", id.NodeID, s.id.NodeID)
}

// authorizeSession admits a control-session connection: a member with the
// node role (whether it claims its own node id is checked at its hello).
func (s *Server) authorizeSession(id trust.Identity) error {
	if id.Kind != trust.KindMember || !id.HasRole(trust.RoleNode) {
		return api.Errorf(api.CodePermissionDenied, "%s may not open a control session: only node members may", id.Name())
	}
	return s.admitted(id)
}

// connWatch holds the long-lived connections (Raft, control sessions) of
// authenticated peers, so a revocation also ends connections made before
// it: after every change of the state each peer is checked again.
type connWatch struct {
	mu    sync.Mutex
	conns map[net.Conn]trust.Identity
}

func newConnWatch() *connWatch { return &connWatch{conns: map[net.Conn]trust.Identity{}} }

func (w *connWatch) add(c net.Conn, id trust.Identity) {
	w.mu.Lock()
	w.conns[c] = id
	w.mu.Unlock()
}

func (w *connWatch) remove(c net.Conn) {
	w.mu.Lock()
	delete(w.conns, c)
	w.mu.Unlock()
}

// watchedConn leaves the watch when it is closed.
type watchedConn struct {
	net.Conn
	id   trust.Identity // the authenticated peer
	w    *connWatch
	once sync.Once
}

func (c *watchedConn) Close() error {
	c.once.Do(func() { c.w.remove(c) })
	return c.Conn.Close()
}

func (w *connWatch) wrap(c net.Conn, id trust.Identity) net.Conn {
	wc := &watchedConn{Conn: c, id: id, w: w}
	w.add(wc, id)
	return wc
}

// admissionOps are the operations that can change whether a node's
// certificates are accepted.
var admissionOps = map[string]bool{
	fsm.OpEnrollmentConsume: true, fsm.OpEnrollmentRevoke: true, fsm.OpNodeRetire: true,
}

// admissionChanges returns the nodes whose admission the entries may have
// changed (their node_id argument).
func admissionChanges(entries []fsm.Entry) []string {
	var out []string
	for _, e := range entries {
		if !admissionOps[e.Op] {
			continue
		}
		var a struct {
			NodeID string `json:"node_id"`
		}
		if json.Unmarshal(e.Args, &a) == nil && a.NodeID != "" {
			out = append(out, a.NodeID)
		}
	}
	return out
}

// noteAdmissionChanges is called after every applied batch (and restore,
// with nil: everything may have changed). It must not block the apply.
func (s *Server) noteAdmissionChanges(nodes []string, all bool) {
	s.revokeMu.Lock()
	if all {
		s.revokeAll = true
	}
	for _, n := range nodes {
		s.revokePending[n] = true
	}
	s.revokeMu.Unlock()
	select {
	case s.revokeKick <- struct{}{}:
	default:
	}
}

// enforceRevocations closes watched connections of nodes that are no longer
// admitted. It looks only at the nodes whose admission a batch touched (or
// at every connection after a snapshot restore), so thousands of sessions
// cost nothing per write.
func (s *Server) enforceRevocations() {
	for {
		select {
		case <-s.stop:
			return
		case <-s.revokeKick:
		}
		s.revokeMu.Lock()
		pending, all := s.revokePending, s.revokeAll
		s.revokePending, s.revokeAll = map[string]bool{}, false
		s.revokeMu.Unlock()
		s.conns.mu.Lock()
		peers := map[net.Conn]trust.Identity{}
		for c, id := range s.conns.conns {
			if all || pending[id.NodeID] {
				peers[c] = id
			}
		}
		s.conns.mu.Unlock()
		for c, id := range peers {
			if err := s.admitted(id); err != nil && api.CodeOf(err) != api.CodeUnavailable {
				s.log.Warn("connection of a node that is no longer admitted closed", "peer", id.Name(), "remote", c.RemoteAddr().String(), "reason", err.Error())
				c.Close()
			}
		}
	}
}

// admissionTTL is how long a node-only member trusts ctrl's word that a
// certificate's node is admitted: a revocation reaches it within that.
const admissionTTL = time.Second

type admissionAnswer struct {
	err error
	at  time.Time
}

// admittedByCtrl asks a ctrl member whether the node behind a certificate
// is admitted: a node-only member holds no state, and answers only its
// status itself (everything else goes to ctrl, which checks there). Answers
// are kept for admissionTTL; without an answer the request is refused.
func (s *Server) admittedByCtrl(id trust.Identity) error {
	key := id.URI().String()
	s.admissionMu.Lock()
	a, ok := s.admissionCache[key]
	s.admissionMu.Unlock()
	if ok && time.Since(a.at) < admissionTTL {
		return a.err
	}
	body, _ := json.Marshal(api.AdmissionRequest{Kind: id.Kind, NodeID: id.NodeID, Roles: id.Roles, Admitted: id.Admitted})
	ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
	defer cancel()
	err := s.callCtrl(ctx, "/v1/internal/admission", body, nil)
	if api.CodeOf(err) == api.CodeUnavailable {
		return api.Errorf(api.CodeUnavailable, "member %s cannot confirm with ctrl that node %s is admitted: %v; retry", s.id.NodeID, id.NodeID, err)
	}
	s.admissionMu.Lock()
	if len(s.admissionCache) > 4096 {
		s.admissionCache = map[string]admissionAnswer{}
	}
	s.admissionCache[key] = admissionAnswer{err: err, at: time.Now()}
	s.admissionMu.Unlock()
	return err
}

// handleAdmission tells a node-only member whether a certificate's node is
// admitted (ctrl members answer from their replica).
func (s *Server) handleAdmission(r *http.Request, req api.AdmissionRequest) response {
	id := trust.Identity{ClusterID: s.id.ClusterID, Kind: req.Kind, NodeID: req.NodeID, Roles: req.Roles, Admitted: req.Admitted}
	if err := s.admitted(id); err != nil {
		return fail(err)
	}
	return answer(map[string]string{"node_id": req.NodeID})
}
