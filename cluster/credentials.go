package cluster

import (
	"crypto/ed25519"
	"net/http"
	"sync"
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
		if ws, err = visibleWorkspace(r, tx, id); err != nil {
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
	if ws.AutoResume && ws.State != api.WorkspaceAvailable {
		if ws, node, err = s.resumeOnConnect(r, ws); err != nil {
			return fail(err)
		}
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
// every ctrl member holds. It follows the CA a rotation's finish installs:
// every ctrl member switches at the same entry. The nodes' data planes
// accept the new CA's key from the rotation's begin on
// (CredentialPublicKeys), so the switch refuses no credential.
func (s *Server) credentialKey() (ed25519.PrivateKey, error) {
	ca := s.activeCA()
	if ca.Key == nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "member %s holds no cluster CA key: credentials are issued by ctrl members", s.id.NodeID)
	}
	return s.cred.of(ca)
}

// CredentialPublicKeys are the keys nodes hand their data-plane process,
// the signing key first: during a CA rotation the key derived from the
// new CA too, which signs from the finish on. Nil on a member without the
// CA key.
func (s *Server) CredentialPublicKeys() [][]byte {
	active := s.activeCA()
	if active.Key == nil {
		return nil
	}
	k, err := s.cred.of(active)
	if err != nil {
		return nil
	}
	keys := [][]byte{k.Public().(ed25519.PublicKey)}
	// A finish between the two reads ends the session this welcomes
	// anyway: it closes the sessions after both stores.
	next := s.rot.next.Load()
	if next == nil || trust.Fingerprint(next.Cert) == trust.Fingerprint(active.Cert) {
		return keys // no rotation, or its finish under way on this member
	}
	nk, err := s.cred.of(next)
	if err != nil {
		s.log.Warn("CA rotation: no credential key derived from the new CA; nodes accept the old CA's only until the finish", "err", err)
		return keys
	}
	return append(keys, nk.Public().(ed25519.PublicKey))
}

// credentialKeys caches the keys derived from the CAs a ctrl member holds
// (the welcome and every credential ask for them).
type credentialKeys struct {
	mu   sync.Mutex
	keys map[*trust.CA]ed25519.PrivateKey
}

// of is the credential key derived from ca's key.
func (c *credentialKeys) of(ca *trust.CA) (ed25519.PrivateKey, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k, ok := c.keys[ca]; ok {
		return k, nil
	}
	pemBytes, err := trust.EncodeKey(ca.Key)
	if err != nil {
		return nil, err
	}
	k, err := credential.KeyFromCA(pemBytes)
	if err != nil {
		return nil, err
	}
	// A member holds two CAs at most (a rotation's): the keys of CAs
	// rotated away are dropped, never more than a few kept.
	if c.keys == nil || len(c.keys) >= 4 {
		c.keys = map[*trust.CA]ed25519.PrivateKey{}
	}
	c.keys[ca] = k
	return k, nil
}
