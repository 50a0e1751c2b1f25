package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// keysRecorder is a DataPlane seam that keeps the keys of each update.
type keysRecorder struct{ got chan [][]byte }

func (k *keysRecorder) Address() string            { return "127.0.0.1:1" }
func (k *keysRecorder) Alive(context.Context) bool { return true }
func (k *keysRecorder) Update(_ context.Context, _ []DataTarget, keys [][]byte) error {
	k.got <- keys
	return nil
}

// fakeLeader answers a control session's hello with welcome over TLS and
// then keeps the session open until the node closes it.
func fakeLeader(t *testing.T, welcome api.SessionMsg) func(context.Context, string) (*tls.Conn, error) {
	ca, err := trust.NewCA("kc-test")
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := trust.EncodeKey(ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(ca.CertPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	return func(ctx context.Context, _ string) (*tls.Conn, error) {
		nodeEnd, ctrlEnd := net.Pipe()
		wg.Go(func() {
			srv := tls.Server(ctrlEnd, &tls.Config{Certificates: []tls.Certificate{cert}})
			defer srv.Close()
			var hello api.SessionMsg
			if err := json.NewDecoder(srv).Decode(&hello); err != nil || hello.Type != api.MsgHello {
				return
			}
			welcome.Type = api.MsgWelcome
			if json.NewEncoder(srv).Encode(welcome) == nil {
				io.Copy(io.Discard, srv) // until the node ends the session
			}
		})
		// The welcome is what is judged here, not the fake leader's certificate.
		c := tls.Client(nodeEnd, &tls.Config{InsecureSkipVerify: true})
		if err := c.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
}

// The credential keys of the welcome are what the node hands its data
// plane: both CAs' during a rotation, the one key of a leader of an
// earlier build; a welcome with more keys than a rotation has, or a key
// that is not an ed25519 public key, ends the session before anything is
// handed over.
func TestWelcomeKeysReachTheDataPlane(t *testing.T) {
	k1, k2, k3 := bytes.Repeat([]byte{1}, ed25519.PublicKeySize), bytes.Repeat([]byte{2}, ed25519.PublicKeySize), bytes.Repeat([]byte{3}, ed25519.PublicKeySize)
	tests := []struct {
		name    string
		welcome api.SessionMsg
		want    [][]byte
		refused string
	}{
		{"during a rotation", api.SessionMsg{SessionID: "s", CredentialKey: k1, CredentialKeys: [][]byte{k1, k2}}, [][]byte{k1, k2}, ""},
		{"after the finish", api.SessionMsg{SessionID: "s", CredentialKey: k2, CredentialKeys: [][]byte{k2}}, [][]byte{k2}, ""},
		{"leader of an earlier build", api.SessionMsg{SessionID: "s", CredentialKey: k1}, [][]byte{k1}, ""},
		{"three keys", api.SessionMsg{SessionID: "s", CredentialKey: k1, CredentialKeys: [][]byte{k1, k2, k3}}, nil, "3 credential keys, at most 2"},
		{"short key", api.SessionMsg{SessionID: "s", CredentialKey: k1, CredentialKeys: [][]byte{k1, k2[:16]}}, nil, "a credential key of 16 bytes, want 32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dp := &keysRecorder{got: make(chan [][]byte, 4)}
			a := &Agent{cfg: Config{NodeID: "node-x", DataPlane: dp, Dial: fakeLeader(t, tc.welcome), SessionTimeout: 10 * time.Second},
				log: slog.New(slog.DiscardHandler)}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { _, err := a.session(ctx, "ctrl-1"); done <- err }()
			defer func() {
				cancel()
				<-done
				a.bg.end()
			}()
			if tc.refused != "" {
				select {
				case err := <-done:
					done <- err
					if err == nil || !strings.Contains(err.Error(), tc.refused) || strings.Contains(err.Error(), "\n") {
						t.Fatalf("session = %v, want a one-line refusal saying %q", err, tc.refused)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the session with a bad welcome did not end")
				}
				a.bg.end()
				if len(dp.got) != 0 {
					t.Fatalf("the data plane got keys %x from a refused welcome", <-dp.got)
				}
				return
			}
			select {
			case got := <-dp.got:
				if len(got) != len(tc.want) {
					t.Fatalf("data plane keys %x, want %x", got, tc.want)
				}
				for i := range got {
					if !bytes.Equal(got[i], tc.want[i]) {
						t.Fatalf("data plane keys %x, want %x", got, tc.want)
					}
				}
			case err := <-done:
				t.Fatalf("session ended before the data plane got the keys: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the data plane got no keys")
			}
		})
	}
}
