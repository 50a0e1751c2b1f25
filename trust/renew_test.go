package trust

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"
)

func TestDueForRenewal(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	c := &x509.Certificate{NotBefore: t0, NotAfter: t0.Add(10 * time.Hour)}
	odd := &x509.Certificate{NotBefore: t0, NotAfter: t0.Add(3)} // 3 ns: half is 1 ns
	tests := []struct {
		name string
		c    *x509.Certificate
		now  time.Time
		due  bool
	}{
		{"before it is valid", c, t0.Add(-time.Hour), false},
		{"at NotBefore", c, t0, false},
		{"just before half-life", c, t0.Add(5*time.Hour - 1), false},
		{"at half-life", c, t0.Add(5 * time.Hour), false},
		{"just past half-life", c, t0.Add(5*time.Hour + 1), true},
		{"at NotAfter", c, t0.Add(10 * time.Hour), true},
		{"expired", c, t0.Add(24 * time.Hour), true},
		{"odd lifetime at the rounded-down half", odd, t0.Add(1), false},
		{"odd lifetime past it", odd, t0.Add(2), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DueForRenewal(tt.c, tt.now); got != tt.due {
				t.Fatalf("DueForRenewal at %v = %v, want %v", tt.now.Sub(t0), got, tt.due)
			}
		})
	}
}

func TestStore(t *testing.T) {
	ca := newTestCA(t)
	pair := func(id Identity) tls.Certificate {
		certPEM, keyPEM, err := ca.IssueKeyPair(id, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Leaf = nil // as a loader that does not parse it hands it over
		return c
	}
	admin := Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}
	s, err := NewStore(pair(memberID("n1", RoleNode)), pair(admin))
	if err != nil {
		t.Fatal(err)
	}
	if s.Member().Leaf == nil || s.Member().Leaf.Subject.OrganizationalUnit[0] != KindMember || s.Admin().Leaf.Subject.CommonName != "admin@n1" {
		t.Fatal("the store does not hold the parsed member and admin certificates")
	}
	held := s.Member()
	if err := s.Set(pair(memberID("n1", RoleNode, RoleCtrl)), pair(admin)); err != nil {
		t.Fatal(err)
	}
	id, err := FromCert(s.Member().Leaf)
	if err != nil || !id.HasRole(RoleCtrl) {
		t.Fatalf("after Set the member certificate is %+v, %v; want the renewed one", id, err)
	}
	if _, err := FromCert(held.Leaf); err != nil || held.Leaf.Equal(s.Member().Leaf) {
		t.Fatal("a certificate taken before Set changed under its holder")
	}

	cur := s.Member()
	bad := pair(admin)
	bad.Certificate = [][]byte{[]byte("junk")}
	if err := s.Set(pair(memberID("n1", RoleNode)), bad); err == nil {
		t.Fatal("Set accepted an unparsable certificate")
	}
	if s.Member() != cur {
		t.Fatal("a failed Set replaced the member certificate")
	}
	if _, err := NewStore(tls.Certificate{}, pair(admin)); err == nil || !strings.Contains(err.Error(), "without a chain") {
		t.Fatalf("NewStore of an empty certificate: %v", err)
	}
}
