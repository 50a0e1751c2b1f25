package dataplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/trust"
)

// apply installs a state pushed by the node. Connections whose Workspace no
// longer has their Instance as its target are closed, and so are guest
// sessions of Instances that are no longer targets.
func (s *Server) apply(st State) error {
	cert, err := tls.X509KeyPair(st.CertPEM, st.KeyPEM)
	if err != nil {
		return fmt.Errorf("dataplane: state: certificate and key: %w: push the node's member certificate and key", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("dataplane: state: certificate: %w", err)
	}
	// The node is the one the certificate's identity names (its URI, as
	// every member reads it), not its common name.
	id, err := trust.FromCert(leaf)
	if err != nil {
		return fmt.Errorf("dataplane: state: certificate: %w: push the data-plane certificate ctrl issued to the node", err)
	}
	if id.Kind != trust.KindDataPlane {
		return fmt.Errorf("dataplane: state: the certificate is %s's %s certificate: push the data-plane certificate ctrl issued to the node", id.NodeID, id.Kind)
	}
	nodeID := id.NodeID
	cert.Leaf = leaf
	keys, err := st.verificationKeys()
	if err != nil {
		return err
	}
	targets := make(map[string]Target, len(st.Targets))
	for _, t := range st.Targets {
		if t.WorkspaceID == "" || t.InstanceID == "" || t.DataSocket == "" {
			return fmt.Errorf("dataplane: state: target %+v needs workspace_id, instance_id and data_socket", t)
		}
		if old, dup := targets[t.WorkspaceID]; dup {
			return fmt.Errorf("dataplane: state: workspace %s has two targets (instances %s and %s): push one per workspace", t.WorkspaceID, old.InstanceID, t.InstanceID)
		}
		targets[t.WorkspaceID] = t
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied, s.nodeID, s.pubs, s.cert, s.targets = true, nodeID, keys, &cert, targets
	s.certPEM, s.keyPEM = st.CertPEM, st.KeyPEM
	sockets := map[string]string{} // instance → data socket
	boots := map[string]string{}   // instance → the guest boot claimed
	for _, t := range targets {
		sockets[t.InstanceID], boots[t.InstanceID] = t.DataSocket, t.GuestBoot
	}
	for id, l := range s.links {
		if sockets[id] != l.socket {
			l.close()
			delete(s.links, id)
			continue
		}
		l.claim(boots[id])
	}
	// Dial new targets now, not at their first connection: the node pushes
	// a target right before it tells ctrl the Workspace is AVAILABLE, so
	// the first exec finds the guest session ready. A draining process
	// dials nothing: the guest's one data channel is its successor's.
	for id, sock := range sockets {
		if s.links[id] == nil && !s.draining {
			l := s.newLink(id, sock, boots[id])
			s.links[id] = l
			s.dials.Go(func() {
				ctx, cancel := context.WithTimeout(s.dialCtx, s.cfg.GuestTimeout)
				defer cancel()
				l.get(ctx) // failures are retried by the first connection that needs it
			})
		}
	}
	s.forgetBound(sockets)
	closed := 0
	for c := range s.conns {
		if c.instanceID == "" {
			continue // not authorized yet: it checks the new targets
		}
		if t, ok := targets[c.workspaceID]; !ok || t.InstanceID != c.instanceID || c.link != s.links[t.InstanceID] {
			c.kill()
			closed++
		}
	}
	s.settleLocked()
	s.log.Info("data-plane state applied", "node", nodeID, "targets", len(targets), "verification_keys", len(keys), "connections_closed", closed)
	return nil
}

// refusal is a connection refused with a code.
type refusal struct{ code, msg string }

func (r *refusal) Error() string { return r.msg }

func refuse(code, format string, args ...any) *refusal {
	return &refusal{code: code, msg: fmt.Sprintf(format, args...)}
}

// authorize checks a credential against the current state and binds c to
// its target. The check and the binding happen under one lock, so a state
// push either sees the connection bound or the connection sees the push.
func (s *Server) authorize(c *clientConn, token string) (*guestLink, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || s.ended {
		return nil, refuse(CodeStopping, "this data-plane process is stopping: retry, the node starts a new one")
	}
	if !s.applied {
		return nil, refuse(CodeUnavailable, "the node has not delivered its state to this data-plane process yet: retry in a few seconds")
	}
	claims, err := verifyAny(s.pubs, token, s.cfg.Now())
	switch {
	case errors.Is(err, credential.ErrExpired):
		return nil, refuse(CodeExpired, "%v", err)
	case errors.Is(err, credential.ErrForged):
		return nil, refuse(CodeForged, "%v", err)
	case err != nil:
		return nil, refuse(CodeMalformed, "%v", err)
	}
	if claims.NodeID != s.nodeID {
		return nil, refuse(CodeWrongNode, "the credential is for node %s, this is node %s: connect to node %s's data-plane address", claims.NodeID, s.nodeID, claims.NodeID)
	}
	t, ok := s.targets[claims.WorkspaceID]
	if !ok {
		return nil, refuse(CodeNoTarget, "workspace %s has no running instance on node %s (stopped, moved, or not delivered yet): request a new credential", claims.WorkspaceID, s.nodeID)
	}
	if t.InstanceID != claims.InstanceID {
		return nil, refuse(CodeNoTarget, "the credential names instance %s, but workspace %s runs instance %s on node %s: request a new credential", claims.InstanceID, claims.WorkspaceID, t.InstanceID, s.nodeID)
	}
	l := s.links[t.InstanceID]
	if l == nil {
		l = s.newLink(t.InstanceID, t.DataSocket, t.GuestBoot)
		s.links[t.InstanceID] = l
	}
	c.workspaceID, c.instanceID, c.link = claims.WorkspaceID, claims.InstanceID, l
	s.noteBound(t.InstanceID)
	s.settleLocked() // one connection fewer that might need any Instance
	return l, nil
}
