package trust

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Want is what a client expects of the server it dialled, or a server of
// the client on one channel. Empty fields are not checked.
type Want struct {
	Kind string
	// NodeID is the node the caller meant to reach.
	NodeID string
	// Role the member must have been admitted with (ctrl for Raft,
	// sessions and forwarded writes).
	Role string
}

// Verify checks the chain of the peer's certificates against the cluster CA
// and returns the identity of the leaf. usage is the extended key usage
// the leaf must allow (client or server authentication).
func Verify(pool *x509.CertPool, certs []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	if len(certs) == 0 {
		return Identity{}, errors.New("the peer presented no certificate")
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("certificate %q is not valid for this cluster: %w", leaf.Subject.CommonName, err)
	}
	return Identify(leaf)
}

// Identify reads the identity of a certificate whose chain was verified
// (by Verify, or by a TLS server's ClientCAs), refusing one valid for
// longer than its kind may be (MaxValidity).
func Identify(leaf *x509.Certificate) (Identity, error) {
	id, err := FromCert(leaf)
	if err != nil {
		return Identity{}, err
	}
	if v, most := leaf.NotAfter.Sub(leaf.NotBefore), MaxValidity(id.Kind); v > most {
		return Identity{}, fmt.Errorf("certificate %q is valid for %v, longer than %s certificates may be (%v): no member issued it; issue a new one", leaf.Subject.CommonName, v.Round(time.Minute), id.Kind, most)
	}
	return id, nil
}

// Check compares an identity with what was wanted.
func (w Want) Check(id Identity) error {
	if w.Kind != "" && id.Kind != w.Kind {
		return fmt.Errorf("%s presented a %s certificate where a %s certificate was expected", id.Name(), id.Kind, w.Kind)
	}
	if w.NodeID != "" && id.NodeID != w.NodeID {
		return fmt.Errorf("the address belongs to node %s, not to node %s: check the address", id.NodeID, w.NodeID)
	}
	if w.Role != "" && !id.HasRole(w.Role) {
		return fmt.Errorf("member %s is not a %s member (roles %v): it cannot be trusted as one", id.NodeID, w.Role, id.Roles)
	}
	return nil
}

// ServerCheck is a tls.Config VerifyConnection for clients: the server's
// chain, its identity against want and, when host is not empty, the host
// dialled against the certificate's addresses (IP or DNS SANs).
func ServerCheck(pool *x509.CertPool, want Want, host string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		id, err := Verify(pool, cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
		if err != nil {
			return err
		}
		if err := want.Check(id); err != nil {
			return err
		}
		if host != "" {
			if err := cs.PeerCertificates[0].VerifyHostname(host); err != nil {
				return fmt.Errorf("%s %s does not hold address %s: %w", id.Kind, id.NodeID, host, err)
			}
		}
		return nil
	}
}

// Client is the TLS side of a caller: the CAs it trusts and the
// certificate it presents (a getter, so a renewed certificate is used
// without a restart). A member sets Roots, read at every dial, so a CA
// rotation reaches its connections without a restart; the CLI, which
// runs once, sets a fixed Pool.
type Client struct {
	Pool  *x509.CertPool
	Roots *Roots
	Cert  func() *tls.Certificate
}

// pool is the set a dial verifies the server against now.
func (c Client) pool() *x509.CertPool {
	if c.Roots != nil {
		return c.Roots.Pool()
	}
	return c.Pool
}

// Config is a client config for one address (HOST:PORT) that accepts only
// a server matching want whose certificate holds that host.
func (c Client) Config(proto string, want Want, addr string) *tls.Config {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	conf := &tls.Config{
		InsecureSkipVerify: true, // replaced by ServerCheck: chain, identity and address
		VerifyConnection:   ServerCheck(c.pool(), want, host),
		NextProtos:         []string{proto},
		MinVersion:         tls.VersionTLS13,
	}
	if c.Cert != nil {
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.Cert(), nil }
	}
	return conf
}

// Dial opens a TLS connection to addr that passes Config's checks.
func (c Client) Dial(ctx context.Context, proto string, want Want, addr string, timeout time.Duration) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout) // connect and handshake
	defer cancel()
	d := &tls.Dialer{Config: c.Config(proto, want, addr)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn := nc.(*tls.Conn)
	if got := conn.ConnectionState().NegotiatedProtocol; got != proto {
		conn.Close()
		return nil, fmt.Errorf("%s does not speak %s (it answered %q): check the address", addr, proto, got)
	}
	return conn, nil
}

// HTTPTransport is an HTTP/1.1 transport whose every connection is made by
// Dial with want, so a redirect or a new leader address is checked too.
func (c Client) HTTPTransport(want Want, dialTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return c.Dial(ctx, "http/1.1", want, addr, dialTimeout)
		},
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// Static returns a getter for a certificate that does not change.
func Static(c tls.Certificate) func() *tls.Certificate { return func() *tls.Certificate { return &c } }
