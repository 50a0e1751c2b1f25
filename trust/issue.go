package trust

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// Issue signs a certificate for pub asserting id, valid for lifetime.
// Member certificates are server and client certificates, operator
// certificates (both kinds) client only, data-plane and API-server certificates server only; hosts
// (IPs or DNS names) are the addresses a server certificate answers for.
func (ca *CA) Issue(id Identity, hosts []string, pub crypto.PublicKey, lifetime time.Duration) ([]byte, error) {
	if ca.Key == nil {
		return nil, errors.New("this member holds no CA key: only ctrl members sign certificates")
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: id.Name(), OrganizationalUnit: []string{id.Kind}, Organization: []string{id.ClusterID}},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		URIs:         []*url.URL{id.URI()},
	}
	switch id.Kind {
	case KindMember:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	case KindAdmin, KindOperator:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case KindDataPlane, KindAPIServer:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	default:
		return nil, fmt.Errorf("certificate kind %q is unknown", id.Kind)
	}
	if id.Kind != KindAdmin && id.Kind != KindOperator {
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
	return pemEncode(pemCertificate, der), nil
}

// IssueKeyPair makes a key and a certificate for it, both PEM.
func (ca *CA) IssueKeyPair(id Identity, hosts []string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := NewKey()
	if err != nil {
		return nil, nil, err
	}
	certPEM, err = ca.Issue(id, hosts, &key.PublicKey, lifetime)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = EncodeKey(key)
	return certPEM, keyPEM, err
}

// IssueTLS makes a key and a certificate for it, ready to serve: the
// chain holds the certificate and this CA's, the key stays in memory.
func (ca *CA) IssueTLS(id Identity, hosts []string, lifetime time.Duration) (tls.Certificate, error) {
	certPEM, keyPEM, err := ca.IssueKeyPair(id, hosts, lifetime)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(append(certPEM, ca.CertPEM...), keyPEM)
}

// Hosts are the addresses a certificate answers for (IPs first, then DNS
// names), to carry them over into its renewal.
func Hosts(c *x509.Certificate) []string {
	var out []string
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return append(out, c.DNSNames...)
}
