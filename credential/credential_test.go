package credential

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"
)

func caKeyPEM(t *testing.T, pkcs8 bool) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if pkcs8 {
		der, _ := x509.MarshalPKCS8PrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), k
	}
	der, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), k
}

func TestKeyFromCADeterministic(t *testing.T) {
	sec1, k := caKeyPEM(t, false)
	a, err := KeyFromCA(sec1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := KeyFromCA(append([]byte(nil), sec1...))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Equal(b) {
		t.Fatal("two ctrl members with the same CA key derived different signing keys")
	}
	// The same CA key stored as PKCS#8 gives the same signing key.
	der, _ := x509.MarshalPKCS8PrivateKey(k)
	c, err := KeyFromCA(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	if !a.Equal(c) {
		t.Fatal("the PKCS#8 encoding of the same CA key derived another signing key")
	}
	other, _ := caKeyPEM(t, false)
	d, err := KeyFromCA(other)
	if err != nil {
		t.Fatal(err)
	}
	if a.Equal(d) {
		t.Fatal("two CA keys derived the same signing key")
	}
	for _, bad := range [][]byte{nil, []byte("not pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})} {
		if _, err := KeyFromCA(bad); err == nil {
			t.Errorf("KeyFromCA(%q) accepted a non-key", bad)
		}
	}
}

func TestSignVerify(t *testing.T) {
	ca, _ := caKeyPEM(t, false)
	key, err := KeyFromCA(ca)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, _ := caKeyPEM(t, true)
	otherKey, _ := KeyFromCA(otherCA)
	pub := PublicKey(key)
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	claims := Claims{WorkspaceID: "ws-a", InstanceID: "inst-1", NodeID: "node-a", IssuedAt: now, ExpiresAt: now.Add(5 * time.Minute)}
	good, err := Sign(key, claims)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := Sign(otherKey, claims)
	parts := strings.Split(good, ".")
	// A payload naming another workspace, with the original signature.
	other := claims
	other.WorkspaceID = "ws-b"
	otherTok, _ := Sign(key, other)
	tampered := parts[0] + "." + strings.Split(otherTok, ".")[1] + "." + parts[2]
	// A signature over the payload alone (without the prefix) is refused.
	payloadOnly := parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(signRaw(key, parts[1]))

	tests := []struct {
		name  string
		token string
		now   time.Time
		want  error // nil: accepted
		says  string
	}{
		{"valid", good, now.Add(time.Minute), nil, ""},
		{"valid at issue time", good, now, nil, ""},
		{"forged: signed by another key", forged, now, ErrForged, "not signed by this cluster's ctrl"},
		{"tampered payload", tampered, now, ErrForged, "request a new one"},
		{"signature without the prefix", payloadOnly, now, ErrForged, ""},
		{"expired", good, now.Add(6 * time.Minute), ErrExpired, "expired at 2026-12-01T10:05:00Z (1m0s ago) for workspace ws-a: request a new one"},
		{"expired exactly at expiry", good, now.Add(5 * time.Minute), ErrExpired, ""},
		{"malformed: empty", "", now, ErrMalformed, ""},
		{"malformed: two parts", parts[0] + "." + parts[1], now, ErrMalformed, "kdp1.<payload>.<signature>"},
		{"malformed: other version", "kdp2." + parts[1] + "." + parts[2], now, ErrMalformed, ""},
		{"malformed: bad base64 payload", parts[0] + ".!!!." + parts[2], now, ErrMalformed, "base64url"},
		{"malformed: short signature", parts[0] + "." + parts[1] + ".AAAA", now, ErrMalformed, "signature"},
		{"malformed: JSON signed but empty claims", signToken(key, `{}`), now, ErrMalformed, "no workspace_id"},
		{"malformed: JSON signed but not JSON", signToken(key, `nope`), now, ErrMalformed, "payload"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Verify(pub, tc.token, tc.now)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if got.WorkspaceID != claims.WorkspaceID || got.InstanceID != claims.InstanceID || got.NodeID != claims.NodeID ||
					!got.IssuedAt.Equal(claims.IssuedAt) || !got.ExpiresAt.Equal(claims.ExpiresAt) {
					t.Fatalf("claims %+v, want %+v", got, claims)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
			for _, other := range []error{ErrMalformed, ErrForged, ErrExpired} {
				if other != tc.want && errors.Is(err, other) {
					t.Fatalf("error %q is also %v", err, other)
				}
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func TestVerifyWithoutKey(t *testing.T) {
	if _, err := Verify(nil, "kdp1.a.b", time.Now()); err == nil || !strings.Contains(err.Error(), "no verification key") {
		t.Fatalf("Verify without a key = %v", err)
	}
}

func TestSignRefusesIncompleteClaims(t *testing.T) {
	ca, _ := caKeyPEM(t, false)
	key, _ := KeyFromCA(ca)
	now := time.Now()
	full := Claims{WorkspaceID: "w", InstanceID: "i", NodeID: "n", IssuedAt: now, ExpiresAt: now.Add(time.Minute)}
	for name, mut := range map[string]func(*Claims){
		"no workspace":          func(c *Claims) { c.WorkspaceID = "" },
		"no instance":           func(c *Claims) { c.InstanceID = "" },
		"no node":               func(c *Claims) { c.NodeID = "" },
		"no expiry":             func(c *Claims) { c.ExpiresAt = time.Time{} },
		"expiry before issuing": func(c *Claims) { c.ExpiresAt = now.Add(-time.Second) },
	} {
		c := full
		mut(&c)
		if _, err := Sign(key, c); err == nil {
			t.Errorf("%s: Sign accepted %+v", name, c)
		}
	}
	if _, err := Sign(nil, full); err == nil {
		t.Error("Sign accepted a nil key")
	}
}

// signToken signs an arbitrary payload, as a ctrl with a bug would.
func signToken(key []byte, payload string) string {
	p := base64.RawURLEncoding.EncodeToString([]byte(payload))
	return Prefix + "." + p + "." + base64.RawURLEncoding.EncodeToString(signRaw(key, Prefix+"."+p))
}

func signRaw(key []byte, msg string) []byte {
	return ed25519.Sign(ed25519.PrivateKey(key), []byte(msg))
}
