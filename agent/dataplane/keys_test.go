package dataplane

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/credential"
)

// TestCredentialOfEitherRotationKey: during a CA rotation the node pushes
// the credential keys of both CAs; a credential signed by either is
// accepted, by the generation the state was handed over to too, and once
// the list shrinks to the new CA's key the old one's are refused as
// forged, like any other key's.
func TestCredentialOfEitherRotationKey(t *testing.T) {
	p := newPKI(t, "node-a")
	next := newPKI(t, "node-a") // the CA the rotation moves to
	third := newPKI(t, "node-a")
	dir := t.TempDir()
	sock := startGuest(t, dir, "inst-a")
	target := Target{WorkspaceID: "ws-a", InstanceID: "inst-a", DataSocket: sock}
	oldKey, newKey := credential.PublicKey(p.signKey), credential.PublicKey(next.signKey)
	withKeys := func(keys ...ed25519.PublicKey) State {
		st := p.state(target)
		st.PublicKey, st.PublicKeys = keys[0], keys
		return st
	}
	const grace = 2 * time.Second
	g1 := startServer(t, grace)
	g1.push(t, withKeys(oldKey, newKey))

	signed := func(key ed25519.PrivateKey, addr string) error {
		now := time.Now()
		cred := p.credWith(t, key, addr, credential.Claims{WorkspaceID: "ws-a", InstanceID: "inst-a", NodeID: "node-a",
			IssuedAt: now, ExpiresAt: now.Add(time.Minute)})
		c, err := Connect(ctxT(t), cred, p.pool)
		if err != nil {
			return err
		}
		defer c.Close()
		if out, _, _ := run(t, c, nil, "echo", "ok"); out != "ok\n" {
			t.Fatalf("echo: %q", out)
		}
		return nil
	}
	refusedAsForged := func(err error, what string) {
		t.Helper()
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != CodeForged {
			t.Fatalf("%s: Connect = %v, want refusal %s", what, err, CodeForged)
		}
	}
	for name, key := range map[string]ed25519.PrivateKey{"old CA's key": p.signKey, "new CA's key": next.signKey} {
		if err := signed(key, g1.Addr()); err != nil {
			t.Fatalf("credential signed with the %s while both are held: %v", name, err)
		}
	}
	refusedAsForged(signed(third.signKey, g1.Addr()), "a third key while both are held")

	// The next generation serves with the list it was handed.
	g2 := handOverInProcess(t, g1, grace)
	for name, key := range map[string]ed25519.PrivateKey{"old CA's key": p.signKey, "new CA's key": next.signKey} {
		if err := signed(key, g2.Addr()); err != nil {
			t.Fatalf("credential signed with the %s after the hand-over: %v", name, err)
		}
	}

	// The finish: only the new CA's key.
	g2.push(t, withKeys(newKey))
	if err := signed(next.signKey, g2.Addr()); err != nil {
		t.Fatalf("credential signed with the new CA's key after the finish: %v", err)
	}
	refusedAsForged(signed(p.signKey, g2.Addr()), "the old CA's key after the finish")
	refusedAsForged(signed(third.signKey, g2.Addr()), "a third key after the finish")
}

// TestVerificationKeysBounded: a state with more keys than a rotation
// has, a key of the wrong size, or a signing key that is not the list's
// first is refused whole, and the keys applied before stay.
func TestVerificationKeysBounded(t *testing.T) {
	p := newPKI(t, "node-a")
	s := startServer(t, time.Second)
	keys := []ed25519.PublicKey{credential.PublicKey(p.signKey), credential.PublicKey(newPKI(t, "node-a").signKey), credential.PublicKey(newPKI(t, "node-a").signKey)}
	tests := []struct {
		name string
		mut  func(*State)
		says string
	}{
		{"three keys", func(st *State) { st.PublicKeys = keys }, "3 verification keys, at most 2"},
		{"short key", func(st *State) { st.PublicKeys = []ed25519.PublicKey{keys[0], keys[1][:31]} }, "verification key is 31 bytes"},
		{"signing key not first", func(st *State) { st.PublicKeys = []ed25519.PublicKey{keys[1], keys[0]} }, "public_key is not the first of public_keys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := p.state()
			tc.mut(&st)
			err := PushState(ctxT(t), s.dir, s.gen, st)
			if err == nil || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("push = %v, want a one-line refusal saying %q", err, tc.says)
			}
		})
	}
	if h, err := AskHello(ctxT(t), s.dir, s.gen); err != nil || h.StateApplied {
		t.Fatalf("hello = %+v, %v: no refused state may be applied", h, err)
	}
}
