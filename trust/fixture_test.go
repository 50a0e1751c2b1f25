package trust

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// admitted is a fixed admission time for identities in tests.
var admitted = time.Date(2026, 11, 1, 12, 0, 0, 123456789, time.UTC)

func memberID(node string, roles ...string) Identity {
	return Identity{ClusterID: "c1", Kind: KindMember, NodeID: node, Roles: roles, Admitted: admitted}
}

func newTestCA(t testing.TB) *CA {
	t.Helper()
	ca, err := NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// signed is a certificate the CA signs from tmpl as it is (validity, usages
// and URIs included), for the cases Issue never makes: expired ones,
// foreign URIs.
func signed(t testing.TB, ca *CA, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber == nil {
		tmpl.SerialNumber = big.NewInt(1)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withURIs is an unsigned certificate carrying uris, all FromCert reads.
func withURIs(t testing.TB, uris ...string) *x509.Certificate {
	t.Helper()
	c := &x509.Certificate{Subject: pkix.Name{CommonName: "test"}}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

func issued(t testing.TB, ca *CA, id Identity, hosts []string) *x509.Certificate {
	t.Helper()
	certPEM, _, err := ca.IssueKeyPair(id, hosts, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
