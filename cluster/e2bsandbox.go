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
	"github.com/kibotos/kibotos/e2b"
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
	// guests are the sessions opened for keys, kept for their next
	// requests.
	guests guestSessions
}

type tokenSecret struct {
	ca  *trust.CA
	key [sha256.Size]byte
}

// connectWait bounds reaching a guest through its node's data plane.
const e2bConnectWait = 30 * time.Second

// What a token opens: the MAC of each kind binds its purpose, so that a
// sandbox's traffic token is no envd token and the other way round.
const (
	envdToken    = "envd"
	trafficToken = "traffic"
)

// tokenMAC is the MAC of a token of keyID for sandbox id, for purpose.
func (x *e2bSandboxes) tokenMAC(purpose, keyID, id string) ([]byte, error) {
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
	if purpose != envdToken {
		mac.Write([]byte(purpose + "\x00")) // envd's tokens predate purposes
	}
	mac.Write([]byte(keyID + "\x00" + id))
	return mac.Sum(nil), nil
}

func (x *e2bSandboxes) AccessToken(key, id string) (string, error) {
	return x.token(envdToken, key, id)
}

func (x *e2bSandboxes) TrafficToken(key, id string) (string, error) {
	return x.token(trafficToken, key, id)
}

func (x *e2bSandboxes) token(purpose, key, id string) (string, error) {
	keyID, _, ok := api.ParseKeySecret(key)
	if !ok {
		return "", api.Errorf(api.CodeUnauthenticated, "the X-API-Key is not a Kibotos API key (kbt_...)")
	}
	return x.keyToken(purpose, keyID, id)
}

// keyToken is the token of key keyID for sandbox id, for purpose.
func (x *e2bSandboxes) keyToken(purpose, keyID, id string) (string, error) {
	mac, err := x.tokenMAC(purpose, keyID, id)
	if err != nil {
		return "", err
	}
	return keyID + "." + base64.RawURLEncoding.EncodeToString(mac), nil
}

func (x *e2bSandboxes) Open(ctx context.Context, token, id, remote string) (*guestproto.Client, func(), error) {
	c, err := x.tokenCaller(envdToken, token, id)
	if err != nil {
		return nil, nil, err
	}
	return x.guests.open(ctx, c.name+"\x00"+id, func(ctx context.Context) (*guestproto.Client, error) {
		return x.open(ctx, c, id, remote)
	})
}

// OpenPort opens sandbox id's guest for traffic to its ports: as the key
// of its traffic token when it takes none without one, else as the key
// that created it (e2b.CreatorLabel), which must still be active and
// may open only a sandbox of its namespace.
func (x *e2bSandboxes) OpenPort(ctx context.Context, token, id, remote string) (*guestproto.Client, error) {
	ws, err := x.workspace(id)
	if err != nil {
		return nil, err
	}
	var c caller
	switch mode, creator := ws.Labels[e2b.TrafficLabel], ws.Labels[e2b.CreatorLabel]; {
	case mode == e2b.TrafficPublic && token == "" && creator != "":
		c, err = x.activeKey(creator, id) // the credential below checks its namespace
	case mode == e2b.TrafficPublic || mode == e2b.TrafficToken:
		c, err = x.tokenCaller(trafficToken, token, id)
	default:
		err = api.Errorf(api.CodePermissionDenied, "sandbox %s was not created through the E2B API: reach its ports with kibo port-forward", api.EscapeText(id))
	}
	if err != nil {
		return nil, err
	}
	return x.open(ctx, c, id, remote)
}

func (x *e2bSandboxes) CreatorToken(id string) (string, error) {
	ws, err := x.workspace(id)
	if err != nil {
		return "", err
	}
	keyID := ws.Labels[e2b.CreatorLabel]
	if !api.ValidKeyID(keyID) {
		return "", api.Errorf(api.CodePermissionDenied, "sandbox %s was not created through the E2B API: its files have no signed URLs", api.EscapeText(id))
	}
	return x.keyToken(envdToken, keyID, id)
}

// workspace is sandbox id's Workspace in this member's replica.
func (x *e2bSandboxes) workspace(id string) (*api.Workspace, error) {
	var ws *api.Workspace
	err := x.s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		ws, err = fsm.GetWorkspace(tx, id)
		return err
	})
	if err != nil || ws == nil {
		return nil, api.Errorf(api.CodeNotFound, "sandbox %s not found", api.EscapeText(id))
	}
	return ws, nil
}

// open opens sandbox id's guest as c.
func (x *e2bSandboxes) open(ctx context.Context, c caller, id, remote string) (*guestproto.Client, error) {
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

// tokenCaller is the key a token of sandbox id was issued to, as a
// caller, if the token is one and the key active.
func (x *e2bSandboxes) tokenCaller(purpose, token, id string) (caller, error) {
	refused := api.Errorf(api.CodeUnauthenticated, "sandbox %s: the access token is not this sandbox's: use the envdAccessToken of its create or connect", api.EscapeText(id))
	if purpose == trafficToken {
		refused = api.Errorf(api.CodePermissionDenied, "sandbox %s takes no public traffic: send its trafficAccessToken as e2b-traffic-access-token", api.EscapeText(id))
	}
	keyID, sum, ok := strings.Cut(token, ".")
	got, err := base64.RawURLEncoding.DecodeString(sum)
	if !ok || err != nil || len(keyID) > 64 {
		return caller{}, refused
	}
	want, err := x.tokenMAC(purpose, keyID, id)
	if err != nil {
		return caller{}, err
	}
	if !hmac.Equal(got, want) {
		return caller{}, refused
	}
	return x.activeKey(keyID, id)
}

// activeKey is key keyID as a caller for sandbox id, if it is active.
func (x *e2bSandboxes) activeKey(keyID, id string) (caller, error) {
	var cred *fsm.KeyCredential
	err := x.s.fsm.View(func(tx *bolt.Tx) error {
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
