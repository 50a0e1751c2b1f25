package datadir

import (
	"crypto/tls"

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
// cert and the trusted CAs are read at every handshake, so a renewed
// certificate is served at once and a CA rotation takes effect on the
// next connection. Session tickets are off: a resumed session would skip
// the check against the CAs trusted now (no client of ours resumes).
func ServerTLS(roots *trust.Roots, cert func() *tls.Certificate) *tls.Config {
	base := &tls.Config{
		GetCertificate:         func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert(), nil },
		ClientAuth:             tls.VerifyClientCertIfGiven,
		NextProtos:             []string{ProtoRaft, ProtoSession, ProtoHTTP},
		MinVersion:             tls.VersionTLS13,
		SessionTicketsDisabled: true,
	}
	conf := base.Clone()
	conf.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = roots.Pool()
		return c, nil
	}
	return conf
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
