package dataplane

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// pki is a cluster CA with the data-plane certificate of one node, made by
// trust as ctrl makes them.
type pki struct {
	pool            *x509.CertPool
	certPEM, keyPEM []byte
	signKey         ed25519.PrivateKey
	nodeID          string
}

func newPKI(t testing.TB, nodeID string) *pki {
	t.Helper()
	ca, err := trust.NewCA("kc-test")
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{pool: x509.NewCertPool(), nodeID: nodeID}
	p.pool.AddCert(ca.Cert)
	caKeyPEM, err := trust.EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	if p.signKey, err = credential.KeyFromCA(caKeyPEM); err != nil {
		t.Fatal(err)
	}
	id := trust.Identity{ClusterID: "kc-test", Kind: trust.KindDataPlane, NodeID: nodeID, Admitted: time.Now()}
	if p.certPEM, p.keyPEM, err = ca.IssueKeyPair(id, nil, trust.DataPlaneLifetime); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pki) state(targets ...Target) State {
	return State{Targets: targets, PublicKey: credential.PublicKey(p.signKey), CertPEM: p.certPEM, KeyPEM: p.keyPEM}
}

// cred signs a credential for ws/inst on p's node, valid for a minute.
func (p *pki) cred(t testing.TB, addr, ws, inst string) api.DataPlaneCredential {
	t.Helper()
	return p.credWith(t, p.signKey, addr, credential.Claims{WorkspaceID: ws, InstanceID: inst, NodeID: p.nodeID,
		IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Minute)})
}

func (p *pki) credWith(t testing.TB, key ed25519.PrivateKey, addr string, c credential.Claims) api.DataPlaneCredential {
	t.Helper()
	tok, err := credential.Sign(key, c)
	if err != nil {
		t.Fatal(err)
	}
	return api.DataPlaneCredential{WorkspaceID: c.WorkspaceID, NodeID: c.NodeID, InstanceID: c.InstanceID,
		Address: addr, Credential: tok, ExpiresAt: c.ExpiresAt}
}

// startGuest runs the real guest agent code behind a unix socket, as QEMU
// serves an Instance's data port: one client at a time, the next one
// accepted after the agent saw the previous one go.
func startGuest(t testing.TB, dir, name string) string {
	t.Helper()
	path, _ := startGuestAt(t, filepath.Join(dir, name+".sock"), "boot-"+name)
	return path
}

// startGuestAt is startGuest at path with a stop function (the VM ending).
func startGuestAt(t testing.TB, path, bootID string) (string, func()) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	opener := func() (io.ReadWriteCloser, error) { return ln.Accept() }
	go func() { done <- guest.Serve(ctx, opener, guest.Options{BootID: bootID}) }()
	stop := sync.OnceFunc(func() {
		cancel()
		ln.Close()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("guest agent did not stop")
		}
	})
	t.Cleanup(stop)
	return path, stop
}

// dpServer is a Server running in-process.
type dpServer struct {
	*Server
	cancel context.CancelFunc
	done   chan error
	dir    string
	gen    uint64
	logs   *testenv.Buffer
}

func startServer(t testing.TB, grace time.Duration, opts ...func(*Config)) *dpServer {
	t.Helper()
	logs := &testenv.Buffer{}
	cfg := Config{Listen: "127.0.0.1:0", SocketDir: filepath.Join(t.TempDir(), "dp"), Generation: 1, Grace: grace,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &dpServer{Server: srv, cancel: cancel, done: make(chan error, 1), dir: cfg.SocketDir, gen: cfg.Generation, logs: logs}
	go func() { s.done <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-s.done:
		t.Fatalf("server did not start: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-s.done:
			s.done <- err
		case <-time.After(grace + 15*time.Second):
			t.Error("server did not stop")
		}
		if t.Failed() {
			t.Logf("data-plane log (generation %d):\n%s", s.gen, logs.String())
		}
	})
	return s
}

// returned waits up to within for Run to return by itself.
func (s *dpServer) returned(t testing.TB, within time.Duration, what string) {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			t.Fatalf("%s: Run: %v", what, err)
		}
	case <-time.After(within):
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// running reports whether Run has not returned.
func (s *dpServer) running() bool {
	select {
	case err := <-s.done:
		s.done <- err
		return false
	default:
		return true
	}
}

func (s *dpServer) push(t testing.TB, st State) {
	t.Helper()
	if err := PushState(ctxT(t), s.dir, s.gen, st); err != nil {
		t.Fatal(err)
	}
}

func connect(t testing.TB, p *pki, cred api.DataPlaneCredential) *guestproto.Client {
	t.Helper()
	c, err := Connect(ctxT(t), cred, p.pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitClosed(t testing.TB, ch <-chan struct{}, within time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(within):
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}
