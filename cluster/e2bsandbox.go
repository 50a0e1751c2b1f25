package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// e2bSandboxes serves E2B's sandbox API its access tokens and guests
// (e2b.Sandboxes). A sandbox's envdAccessToken is KEYID.MAC: the MAC
// binds the key and the sandbox under a secret every ctrl member derives
// from the cluster CA's key. The SDK sends it on every request to envd,
// which carries no API key: the request then acts as that key, looked
// up again each time, so a revoked or expired key's tokens die with it
// and a token opens only its own sandbox of its key's namespace.
type e2bSandboxes struct {
	s      *Server
	limit  *buckets     // the E2B listener's per-key rates
	routes http.Handler // the member's route table, behind no key check
	// secret is the MAC key of the CA it was derived from: every
	// request to envd checks a token, the CA changes at rotations only.
	secret atomic.Pointer[tokenSecret]
}

type tokenSecret struct {
	ca  *trust.CA
	key [sha256.Size]byte
}

// connectWait bounds reaching a guest through its node's data plane.
const e2bConnectWait = 30 * time.Second

// tokenMAC is the MAC of a token of keyID for sandbox id.
func (x *e2bSandboxes) tokenMAC(keyID, id string) ([]byte, error) {
	ca := x.s.activeCA()
	if ca == nil || ca.Key == nil {
		return nil, api.Errorf(api.CodeUnavailable, "member %s holds no cluster CA key to sign sandbox tokens with: call a ctrl member", x.s.id.NodeID)
	}
	secret := x.secret.Load()
	if secret == nil || secret.ca != ca {
		der, err := x509.MarshalECPrivateKey(ca.Key)
		if err != nil {
			return nil, err
		}
		secret = &tokenSecret{ca: ca, key: sha256.Sum256(append([]byte("kibotos e2b envd access token v1\x00"), der...))}
		x.secret.Store(secret)
	}
	mac := hmac.New(sha256.New, secret.key[:])
	mac.Write([]byte(keyID + "\x00" + id))
	return mac.Sum(nil), nil
}

func (x *e2bSandboxes) AccessToken(key, id string) (string, error) {
	keyID, _, ok := api.ParseKeySecret(key)
	if !ok {
		return "", api.Errorf(api.CodeUnauthenticated, "the X-API-Key is not a Kibotos API key (kbt_...)")
	}
	mac, err := x.tokenMAC(keyID, id)
	if err != nil {
		return "", err
	}
	return keyID + "." + base64.RawURLEncoding.EncodeToString(mac), nil
}

func (x *e2bSandboxes) Open(ctx context.Context, token, id, remote string) (*guestproto.Client, error) {
	c, err := x.tokenCaller(token, id)
	if err != nil {
		return nil, err
	}
	cl := api.NewHandlerClient(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x.s.serveKeyCaller(x.limit, c, x.routes, w, r)
	}), "", remote)
	cl.Consistent = true
	// The credential of a PAUSED sandbox with auto-resume resumes it.
	var cred api.DataPlaneCredential
	if _, err := cl.Do(ctx, http.MethodPost, "/v1/workspaces/"+url.PathEscape(id)+"/credentials", struct{}{}, &cred); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, e2bConnectWait)
	defer cancel()
	gc, err := dataplane.Connect(cctx, cred, x.s.roots.Pool())
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "sandbox %s: reach its guest: %v", id, err)
	}
	return gc, nil
}

func (x *e2bSandboxes) Authorize(_ context.Context, token, id string) error {
	_, err := x.tokenCaller(token, id)
	return err
}

// tokenCaller is the key a token of sandbox id was issued to, as a
// caller, if the token is one and the key active.
func (x *e2bSandboxes) tokenCaller(token, id string) (caller, error) {
	refused := api.Errorf(api.CodeUnauthenticated, "sandbox %s: the access token is not this sandbox's: use the envdAccessToken of its create or connect", api.EscapeText(id))
	keyID, sum, ok := strings.Cut(token, ".")
	got, err := base64.RawURLEncoding.DecodeString(sum)
	if !ok || err != nil || len(keyID) > 64 {
		return caller{}, refused
	}
	want, err := x.tokenMAC(keyID, id)
	if err != nil {
		return caller{}, err
	}
	if !hmac.Equal(got, want) {
		return caller{}, refused
	}
	var cred *fsm.KeyCredential
	err = x.s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		cred, err = fsm.FindAPIKey(tx, keyID, time.Now())
		return err
	})
	if err != nil {
		return caller{}, api.Errorf(api.CodeUnavailable, "member %s could not read API key %s: %v; retry", x.s.id.NodeID, keyID, err)
	}
	if cred == nil || cred.Key.State != api.OperatorActive {
		return caller{}, api.Errorf(api.CodeUnauthenticated, "sandbox %s: the API key its access token was issued to is no longer active: connect again with an active key", api.EscapeText(id))
	}
	x.s.keyUses.note(keyID, cred.Key.LastUsedAt, time.Now())
	return keyCallerOf(cred.Key), nil
}
