package trust

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIssueKeyPair(t *testing.T) {
	ca := newTestCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	hosts := []string{"10.0.0.1", "node1.example", "", "::1"}
	tests := []struct {
		name  string
		id    Identity
		usage []x509.ExtKeyUsage
		ips   []string
		dns   []string
	}{
		{name: "member: server and client, with its addresses", id: memberID("n1", RoleCtrl, RoleNode),
			usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, ips: []string{"10.0.0.1", "::1"}, dns: []string{"node1.example"}},
		{name: "admin: client only, no addresses", id: Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted},
			usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{name: "operator: client only, no addresses", id: Identity{ClusterID: "c1", Kind: KindOperator, NodeID: "alice", Admitted: admitted},
			usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{name: "data plane: server only, with its addresses", id: Identity{ClusterID: "c1", Kind: KindDataPlane, NodeID: "n1", Admitted: admitted},
			usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, ips: []string{"10.0.0.1", "::1"}, dns: []string{"node1.example"}},
	}
	const lifetime = 3 * time.Hour
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := time.Now()
			certPEM, keyPEM, err := ca.IssueKeyPair(tt.id, hosts, lifetime)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(certPEM), "-----BEGIN CERTIFICATE-----\n") || !strings.HasPrefix(string(keyPEM), "-----BEGIN EC PRIVATE KEY-----\n") {
				t.Fatalf("PEM types changed:\n%s\n%s", certPEM, keyPEM)
			}
			if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
				t.Fatalf("the key does not belong to the certificate: %v", err)
			}
			c, err := ParseCertPEM(certPEM)
			if err != nil {
				t.Fatal(err)
			}
			id, err := FromCert(c)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(id, tt.id) {
				t.Fatalf("identity %+v, want %+v", id, tt.id)
			}
			if c.Subject.CommonName != tt.id.Name() || !slices.Equal(c.Subject.OrganizationalUnit, []string{tt.id.Kind}) || !slices.Equal(c.Subject.Organization, []string{"c1"}) {
				t.Fatalf("subject %v", c.Subject)
			}
			if !slices.Equal(c.ExtKeyUsage, tt.usage) || c.KeyUsage != x509.KeyUsageDigitalSignature || c.IsCA {
				t.Fatalf("usages %v / %v / CA %v, want %v / digital signature / not a CA", c.ExtKeyUsage, c.KeyUsage, c.IsCA, tt.usage)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tt.ips) || !slices.Equal(c.DNSNames, tt.dns) {
				t.Fatalf("addresses %v %v, want %v %v", ips, c.DNSNames, tt.ips, tt.dns)
			}
			if got := Hosts(c); !slices.Equal(got, append(slices.Clone(tt.ips), tt.dns...)) {
				t.Fatalf("Hosts = %v", got)
			}
			// x509 keeps whole seconds.
			if nb := before.Add(-Backdate).Truncate(time.Second); c.NotBefore.Before(nb.Add(-time.Second)) || c.NotBefore.After(nb.Add(2*time.Second)) {
				t.Fatalf("NotBefore %v, want about %v (backdated by %v)", c.NotBefore, nb, Backdate)
			}
			if got := c.NotAfter.Sub(c.NotBefore); got < lifetime+Backdate-time.Second || got > lifetime+Backdate+time.Second {
				t.Fatalf("valid for %v, want %v", got, lifetime+Backdate)
			}
			usage := tt.usage[0]
			if _, err := Verify(pool, []*x509.Certificate{c}, usage); err != nil {
				t.Fatalf("the CA does not accept what it issued: %v", err)
			}
		})
	}
}

func TestIssueRefuses(t *testing.T) {
	ca := newTestCA(t)
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ca.Issue(Identity{ClusterID: "c1", Kind: "robot", NodeID: "n1"}, nil, &key.PublicKey, time.Hour)
	if err == nil || !strings.Contains(err.Error(), `certificate kind "robot" is unknown`) {
		t.Fatalf("Issue of an unknown kind: %v", err)
	}
	verifier := &CA{Cert: ca.Cert, CertPEM: ca.CertPEM}
	_, _, err = verifier.IssueKeyPair(memberID("n1", RoleNode), nil, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "holds no CA key") {
		t.Fatalf("IssueKeyPair without the CA key: %v", err)
	}
}

// A renewal carries over the addresses of the certificate it replaces.
func TestIssueKeepsHostsAcrossRenewal(t *testing.T) {
	ca := newTestCA(t)
	old := issued(t, ca, memberID("n1", RoleNode), []string{"192.0.2.7", "n1.example"})
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := ca.Issue(memberID("n1", RoleNode), Hosts(old), &key.PublicKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCertPEM(renewed)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.IPAddresses) != 1 || !c.IPAddresses[0].Equal(net.ParseIP("192.0.2.7")) || !slices.Equal(c.DNSNames, []string{"n1.example"}) {
		t.Fatalf("renewed addresses %v %v", c.IPAddresses, c.DNSNames)
	}
	if c.SerialNumber.Cmp(old.SerialNumber) == 0 {
		t.Fatal("the renewal has the serial number of the certificate it replaces")
	}
}
