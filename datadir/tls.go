package datadir

import (
	"crypto/tls"
	"crypto/x509"

	"github.com/kibotos/kibotos/trust"
)

// ALPN protocols multiplexed on a member's one TLS port.
const (
	ProtoRaft    = "kibotos-raft/1"
	ProtoSession = "kibotos-session/1"
	ProtoHTTP    = "http/1.1"
)

// ServerTLS is the member's listener config: every protocol on one port.
// A client certificate is verified against the cluster CA (chain and
// client-auth usage) when given; only the join endpoint takes none, and
// what each identity may do is decided per channel by the cluster package.
// cert is read at every handshake, so a renewed certificate is served at
// once.
func ServerTLS(pool *x509.CertPool, cert func() *tls.Certificate) *tls.Config {
	return &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert(), nil },
		ClientAuth:     tls.VerifyClientCertIfGiven,
		ClientCAs:      pool,
		NextProtos:     []string{ProtoRaft, ProtoSession, ProtoHTTP},
		MinVersion:     tls.VersionTLS13,
	}
}

// AdminClient loads the CLI's credentials: the cluster CA and the
// operator certificate of the data directory.
func (d Dir) AdminClient() (trust.Client, error) {
	pool, err := d.CAPool()
	if err != nil {
		return trust.Client{}, err
	}
	cert, err := d.AdminCertificate()
	if err != nil {
		return trust.Client{}, err
	}
	return trust.Client{Pool: pool, Cert: trust.Static(cert)}, nil
}
