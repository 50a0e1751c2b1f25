package cluster

import (
	"crypto/ed25519"
	"net/http"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// CredentialTTL is how long a data-plane credential is valid. Connections
// opened with it outlive it; a new connection needs a new credential.
const CredentialTTL = 10 * time.Minute

// handleCredential issues a data-plane credential for the Workspace's
// current Instance, signed with the key every ctrl member derives from
// the cluster CA.
func (s *Server) handleCredential(r *http.Request) response {
	id := r.PathValue("id")
	var ws *api.Workspace
	var node *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		if ws, err = fsm.GetWorkspace(tx, id); err != nil {
			return err
		}
		if ws.NodeID != "" {
			node, err = fsm.GetNode(tx, ws.NodeID)
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	if ws.State != api.WorkspaceAvailable || ws.InstanceID == "" {
		return fail(api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: exec, terminal, cp and port-forward need AVAILABLE; %s", id, ws.State, untilAvailable(ws)))
	}
	if node == nil || node.Report == nil || node.Report.DataPlaneAddress == "" {
		return fail(api.Errorf(api.CodeUnavailable, "node %s of workspace %s has not reported a data-plane address yet; retry in a few seconds", ws.NodeID, id))
	}
	key, err := s.credentialKey()
	if err != nil {
		return fail(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	c := credential.Claims{WorkspaceID: ws.WorkspaceID, InstanceID: ws.InstanceID, NodeID: ws.NodeID, IssuedAt: now, ExpiresAt: now.Add(CredentialTTL)}
	tok, err := credential.Sign(key, c)
	if err != nil {
		return fail(err)
	}
	return answer(api.DataPlaneCredential{WorkspaceID: ws.WorkspaceID, NodeID: ws.NodeID, InstanceID: ws.InstanceID,
		Address: node.Report.DataPlaneAddress, Credential: tok, ExpiresAt: c.ExpiresAt})
}

// credentialKey derives the signing key from the cluster CA key, which
// every ctrl member holds. It follows the CA a rotation's finish installs
// (cached per CA): every ctrl member switches at the same entry, and the
// leader then ends the control sessions, whose welcome hands the nodes'
// data planes the new key.
func (s *Server) credentialKey() (ed25519.PrivateKey, error) {
	ca := s.activeCA()
	if ca.Key == nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "member %s holds no cluster CA key: credentials are issued by ctrl members", s.id.NodeID)
	}
	s.credMu.Lock()
	defer s.credMu.Unlock()
	if s.credFor != ca {
		pemBytes, err := trust.EncodeKey(ca.Key)
		if err != nil {
			return nil, err
		}
		if s.credKey, err = credential.KeyFromCA(pemBytes); err != nil {
			return nil, err
		}
		s.credFor = ca
	}
	return s.credKey, nil
}

// CredentialPublicKey is the key nodes hand their data-plane process.
func (s *Server) CredentialPublicKey() ed25519.PublicKey {
	k, err := s.credentialKey()
	if err != nil {
		return nil
	}
	return k.Public().(ed25519.PublicKey)
}
