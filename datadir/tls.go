package datadir

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// Certificate kinds, carried in the subject's OrganizationalUnit: a member
// cert is a host's identity (CN = node id), an admin cert is the CLI's.
const (
	OUMember = "member"
	OUAdmin  = "admin"
)

// ALPN protocols multiplexed on a member's one TLS port.
const (
	ProtoRaft    = "kibotos-raft/1"
	ProtoSession = "kibotos-session/1"
	ProtoHTTP    = "http/1.1"
)

// VerifyChain checks that the peer's leaf is signed by the cluster CA and,
// when wantOU is set, is of that kind. Host names are not checked: only
// cluster members hold CA-signed member certs, and members change address.
func VerifyChain(pool *x509.CertPool, wantOU string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			if wantOU == "" {
				return nil // server side: a client without a cert reaches only the join endpoint
			}
			return errors.New("peer presented no certificate")
		}
		leaf := cs.PeerCertificates[0]
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return fmt.Errorf("peer certificate %q is not from this cluster's CA: %w", leaf.Subject.CommonName, err)
		}
		if wantOU != "" && CertOU(leaf) != wantOU {
			return fmt.Errorf("peer certificate %q is a %s certificate, not a %s certificate", leaf.Subject.CommonName, CertOU(leaf), wantOU)
		}
		return nil
	}
}

// CertOU is the kind of a certificate (member or admin).
func CertOU(c *x509.Certificate) string {
	if len(c.Subject.OrganizationalUnit) == 0 {
		return ""
	}
	return c.Subject.OrganizationalUnit[0]
}

// ClientTLS is a client config that presents cert and accepts only a
// member of the cluster as the server.
func ClientTLS(pool *x509.CertPool, cert tls.Certificate, proto string) *tls.Config {
	return &tls.Config{
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true, // the chain is checked by VerifyConnection, host names are not
		VerifyConnection:   VerifyChain(pool, OUMember),
		NextProtos:         []string{proto},
		MinVersion:         tls.VersionTLS13,
	}
}

// ServerTLS is the member's listener config: every protocol on one port,
// client certs verified when given (only the join endpoint takes none).
func ServerTLS(pool *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates:     []tls.Certificate{cert},
		ClientAuth:       tls.VerifyClientCertIfGiven,
		ClientCAs:        pool,
		NextProtos:       []string{ProtoRaft, ProtoSession, ProtoHTTP},
		MinVersion:       tls.VersionTLS13,
		VerifyConnection: VerifyChain(pool, ""),
	}
}

// AdminClientTLS loads the CLI's TLS config from the data directory.
func (d Dir) AdminClientTLS() (*tls.Config, error) {
	pool, err := d.CAPool()
	if err != nil {
		return nil, err
	}
	cert, err := d.AdminCertificate()
	if err != nil {
		return nil, err
	}
	return ClientTLS(pool, cert, ProtoHTTP), nil
}
