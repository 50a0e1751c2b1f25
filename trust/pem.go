package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// PEM block types as they are written to the data directory and sent in
// join and renewal requests; older builds read the same.
const (
	pemCertificate = "CERTIFICATE"
	pemECKey       = "EC PRIVATE KEY"
	pemPublicKey   = "PUBLIC KEY"
)

// NewKey makes a key of the kind every cluster certificate carries (ECDSA
// P-256).
func NewKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// EncodeKey encodes a private key as an "EC PRIVATE KEY" PEM block (SEC 1),
// the form of the data directory's key files.
func EncodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemEncode(pemECKey, der), nil
}

// ParseCertPEM reads the first PEM block of b as a certificate.
func ParseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != pemCertificate {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// ParseKeyPEM reads the first PEM block of b as an EC private key (SEC 1),
// whatever the block's type says.
func ParseKeyPEM(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// PublicKeyPEM encodes a public key as a "PUBLIC KEY" PEM block (PKIX), the
// form join, renewal and data-plane certificate requests carry.
func PublicKeyPEM(k any) string {
	der, _ := x509.MarshalPKIXPublicKey(k)
	return string(pemEncode(pemPublicKey, der))
}

// ParsePublicKeyPEM reads PublicKeyPEM's form back; only ECDSA keys are
// accepted, since the CA signs nothing else.
func ParsePublicKeyPEM(p string) (*ecdsa.PublicKey, error) {
	blk, _ := pem.Decode([]byte(p))
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok {
		return nil, errors.New("not an ECDSA key")
	}
	return ek, nil
}

// ReadPublicKeyOf reads a PEM private key file and returns its public key.
func ReadPublicKeyOf(path string) (*ecdsa.PublicKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := ParseKeyPEM(raw)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return &k.PublicKey, nil
}

// Fingerprint is the hex SHA-256 of a DER certificate; grants carry the CA's
// so a joining host can trust the cluster before it has the CA.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// KeyFingerprint is the SHA-256 of a public key's PKIX DER, hex: what ctrl
// records of a personal operator credential's key.
func KeyFingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("fingerprint of a public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}
