package trust

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"os"
	"time"
)

// caValidity is long: the CA is the cluster's root of trust, replaced
// only by a rotation (kibo ca rotate); the certificates it signs are the
// short-lived ones.
const caValidity = 10 * 365 * 24 * time.Hour

// CA is the cluster certificate authority. Key is nil on a member that
// holds only the certificate (node-only members verify, never sign).
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     *ecdsa.PrivateKey
}

// serial is a random 127-bit serial number, so two signers of the same CA
// (every ctrl voter holds the key) never issue the same one.
func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// NewCA creates a CA for a new cluster.
func NewCA(clusterID string) (*CA, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kibotos cluster " + clusterID + " CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, CertPEM: pemEncode(pemCertificate, der), Key: key}, nil
}

// LoadCA reads the CA certificate and, when keyPath exists, its key. A
// missing key file is not an error: only ctrl members hold the key.
// certPath may hold several CAs (the trusted set during a rotation): the
// CA is the one whose key keyPath holds, else the first. A ctrl member
// that crashed between the renames of a rotation's finish (ca.key already
// the new key, ca.crt still both) loads so, and repairs ca.crt.
func LoadCA(certPath, keyPath string) (*CA, error) {
	bundle, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCertsPEM(bundle)
	if err != nil {
		return nil, fmt.Errorf("CA certificate %s: %w", certPath, err)
	}
	cert := certs[0]
	ca := &CA{Cert: cert, CertPEM: pemEncode(pemCertificate, cert.Raw)}
	if keyPath == "" {
		return ca, nil
	}
	keyPEM, err := os.ReadFile(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		return ca, nil
	}
	if err != nil {
		return nil, err
	}
	ca.Key, err = ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key %s: %w", keyPath, err)
	}
	for _, c := range certs {
		if ca.Key.PublicKey.Equal(c.PublicKey) {
			ca.Cert, ca.CertPEM = c, pemEncode(pemCertificate, c.Raw)
		}
	}
	// A foreign key would sign certificates no member accepts.
	if !ca.Key.PublicKey.Equal(ca.Cert.PublicKey) {
		return nil, fmt.Errorf("CA key %s is not the key of the CA certificate %s: put back this cluster's ca.key (or remove it on a member without the ctrl role)", keyPath, certPath)
	}
	return ca, nil
}
