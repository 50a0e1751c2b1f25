package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/kibotos/kibotos/trust"
)

const caValidity = 10 * 365 * 24 * time.Hour

// CA is the cluster certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     *ecdsa.PrivateKey
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// NewCA creates a CA for a new cluster.
func NewCA(clusterID string) (*CA, error) {
	key, err := newKey()
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
	return &CA{Cert: cert, CertPEM: pemEncode("CERTIFICATE", der), Key: key}, nil
}

// Issue signs a certificate for pub asserting id, valid for lifetime.
// Member certificates are server and client certificates, operator
// certificates client only, data-plane certificates server only; hosts
// (IPs or DNS names) are the addresses a server certificate answers for.
func (ca *CA) Issue(id trust.Identity, hosts []string, pub crypto.PublicKey, lifetime time.Duration) ([]byte, error) {
	if ca.Key == nil {
		return nil, errors.New("this member holds no CA key: only ctrl members sign certificates")
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id.Name(), OrganizationalUnit: []string{id.Kind}, Organization: []string{id.ClusterID}},
		NotBefore:    now.Add(-trust.Backdate),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		URIs:         []*url.URL{id.URI()},
	}
	switch id.Kind {
	case trust.KindMember:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	case trust.KindAdmin:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case trust.KindDataPlane:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	default:
		return nil, fmt.Errorf("certificate kind %q is unknown", id.Kind)
	}
	if id.Kind != trust.KindAdmin {
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return pemEncode("CERTIFICATE", der), nil
}

// IssueKeyPair makes a key and a certificate for it, both PEM.
func (ca *CA) IssueKeyPair(id trust.Identity, hosts []string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	certPEM, err = ca.Issue(id, hosts, &key.PublicKey, lifetime)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = encodeKey(key)
	return certPEM, keyPEM, err
}

// certHosts are the addresses a certificate answers for, to carry them
// over into its renewal.
func certHosts(c *x509.Certificate) []string {
	var out []string
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return append(out, c.DNSNames...)
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pemEncode("EC PRIVATE KEY", der), nil
}

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// LoadCA reads the CA certificate and, when keyPath exists, its key.
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate %s: %w", certPath, err)
	}
	ca := &CA{Cert: cert, CertPEM: certPEM}
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
	ca.Key, err = parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key %s: %w", keyPath, err)
	}
	return ca, nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKeyPEM(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// Fingerprint is the hex SHA-256 of a DER certificate; grants carry the CA's
// so a joining host can trust the cluster before it has the CA.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// publicKeyPEM encodes a public key as PEM (PKIX).
func publicKeyPEM(k any) string {
	der, _ := x509.MarshalPKIXPublicKey(k)
	return string(pemEncode("PUBLIC KEY", der))
}

// readPublicKeyOf reads a PEM private key file and returns its public key.
func readPublicKeyOf(path string) (*ecdsa.PublicKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := parseKeyPEM(raw)
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", path, err)
	}
	return &k.PublicKey, nil
}
