// Package credential signs and verifies the short-lived session credentials
// ctrl hands out for the data plane (exec, terminal, files, port forward).
//
// A credential names one Workspace, the Instance that is its current
// execution and the node that runs it, and when it expires:
//
//	kdp1.<base64url(JSON claims)>.<base64url(ed25519 signature)>
//
// The signature covers "kdp1.<payload>", so the version prefix cannot be
// swapped. The signing key is derived from the cluster CA key (KeyFromCA):
// every ctrl voter holds that key, so any leader signs with the same key and
// no extra secret has to be replicated or rotated with it.
package credential

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Prefix is the version tag of a credential token.
const Prefix = "kdp1"

// hkdfInfo separates this use of the CA key from any other derivation.
const hkdfInfo = "kibotos data-plane credentials v1"

// DefaultLifetime is a sensible validity for a credential: long enough to
// open a connection after fetching it, short enough that a leaked one is
// soon useless. An open connection is not cut when its credential expires.
const DefaultLifetime = 5 * time.Minute

// Claims is what a credential grants.
type Claims struct {
	WorkspaceID string    `json:"workspace_id"`
	InstanceID  string    `json:"instance_id"`
	NodeID      string    `json:"node_id"`
	IssuedAt    time.Time `json:"issued_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Errors of Verify, for errors.Is; the returned errors carry details.
var (
	ErrMalformed = errors.New("malformed data-plane credential")
	ErrForged    = errors.New("data-plane credential has a bad signature")
	ErrExpired   = errors.New("data-plane credential expired")
)

// KeyFromCA derives the signing key from the cluster CA's private key (PEM,
// as in tls/ca.key). The key is first re-encoded as PKCS#8 DER, so the same
// CA key gives the same signing key however its file is encoded.
func KeyFromCA(caKeyPEM []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(caKeyPEM)
	if blk == nil {
		return nil, errors.New("credential: CA key: no PEM block: pass the contents of tls/ca.key")
	}
	var key any
	var err error
	switch blk.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(blk.Bytes)
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(blk.Bytes)
	default:
		return nil, fmt.Errorf("credential: CA key: PEM block %q is not a private key: pass the contents of tls/ca.key", blk.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("credential: CA key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("credential: CA key: %w", err)
	}
	seed, err := hkdf.Key(sha256.New, der, nil, hkdfInfo, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("credential: derive signing key: %w", err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// PublicKey is the verification key of key, what the node pushes to its
// data-plane process.
func PublicKey(key ed25519.PrivateKey) ed25519.PublicKey {
	return key.Public().(ed25519.PublicKey)
}

func (c Claims) validate() error {
	switch {
	case c.WorkspaceID == "":
		return errors.New("no workspace_id")
	case c.InstanceID == "":
		return errors.New("no instance_id")
	case c.NodeID == "":
		return errors.New("no node_id")
	case c.IssuedAt.IsZero() || c.ExpiresAt.IsZero():
		return errors.New("no issued_at or expires_at")
	case !c.ExpiresAt.After(c.IssuedAt):
		return fmt.Errorf("expires_at %s is not after issued_at %s", c.ExpiresAt.Format(time.RFC3339), c.IssuedAt.Format(time.RFC3339))
	}
	return nil
}

// Sign makes a token for c.
func Sign(key ed25519.PrivateKey, c Claims) (string, error) {
	if len(key) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("credential: sign: key is %d bytes, want an ed25519 private key (KeyFromCA)", len(key))
	}
	if err := c.validate(); err != nil {
		return "", fmt.Errorf("credential: sign for workspace %q: %w", c.WorkspaceID, err)
	}
	c.IssuedAt, c.ExpiresAt = c.IssuedAt.UTC(), c.ExpiresAt.UTC()
	j, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("credential: sign: %w", err)
	}
	signed := Prefix + "." + base64.RawURLEncoding.EncodeToString(j)
	sig := ed25519.Sign(key, []byte(signed))
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig), nil
}

// Verify checks token's signature with pub and that it has not expired at
// now, and returns its claims. Errors wrap ErrMalformed, ErrForged or
// ErrExpired.
func Verify(pub ed25519.PublicKey, token string, now time.Time) (Claims, error) {
	var c Claims
	if len(pub) != ed25519.PublicKeySize {
		return c, fmt.Errorf("credential: verify: no verification key (got %d bytes): the node has not delivered the public key yet", len(pub))
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != Prefix {
		return c, fmt.Errorf("%w: want %s.<payload>.<signature>: pass the credential string exactly as ctrl issued it", ErrMalformed, Prefix)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, fmt.Errorf("%w: payload is not base64url: pass the credential string exactly as ctrl issued it", ErrMalformed)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return c, fmt.Errorf("%w: signature is not a base64url ed25519 signature: pass the credential string exactly as ctrl issued it", ErrMalformed)
	}
	// The signature is checked before the payload is parsed: nothing an
	// attacker wrote is interpreted.
	if !ed25519.Verify(pub, []byte(parts[0]+"."+parts[1]), sig) {
		return c, fmt.Errorf("%w: it was not signed by this cluster's ctrl (or was altered): request a new one from ctrl", ErrForged)
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return Claims{}, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	if err := c.validate(); err != nil {
		return Claims{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if !now.Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w at %s (%s ago) for workspace %s: request a new one from ctrl",
			ErrExpired, c.ExpiresAt.UTC().Format(time.RFC3339), now.Sub(c.ExpiresAt).Round(time.Second), c.WorkspaceID)
	}
	return c, nil
}
