package trust

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestWantCheck(t *testing.T) {
	member := memberID("n1", RoleNode)
	admin := Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}
	tests := []struct {
		name string
		want Want
		id   Identity
		err  string
	}{
		{name: "nothing wanted", want: Want{}, id: admin},
		{name: "all match", want: Want{Kind: KindMember, NodeID: "n1", Role: RoleNode}, id: member},
		{name: "one of the roles", want: Want{Role: RoleCtrl}, id: memberID("n1", RoleNode, RoleCtrl)},
		{name: "wrong kind", want: Want{Kind: KindMember}, id: admin, err: "admin@n1 presented a admin certificate where a member certificate was expected"},
		{name: "wrong node", want: Want{NodeID: "n2"}, id: member, err: "the address belongs to node n1, not to node n2"},
		{name: "missing role", want: Want{Role: RoleCtrl}, id: member, err: "member n1 is not a ctrl member (roles [node])"},
		{name: "role on a certificate without roles", want: Want{Role: RoleNode}, id: admin, err: "is not a node member"},
		{name: "kind before node", want: Want{Kind: KindDataPlane, NodeID: "n2"}, id: member, err: "where a dataplane certificate was expected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.want.Check(tt.id)
			if tt.err == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Check = %v, want an error containing %q", err, tt.err)
			}
		})
	}
}

func TestVerify(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	member := issued(t, ca, memberID("n1", RoleCtrl), []string{"127.0.0.1"})
	admin := issued(t, ca, Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}, nil)
	dataplane := issued(t, ca, Identity{ClusterID: "c1", Kind: KindDataPlane, NodeID: "n1", Admitted: admitted}, []string{"127.0.0.1"})
	now := time.Now()
	uri := memberID("n1", RoleCtrl).URI()
	expired := signed(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, URIs: []*url.URL{uri}})
	early := signed(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: "n1"}, NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, URIs: []*url.URL{uri}})
	bare := signed(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: "old"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	foreign := issued(t, other, memberID("n1", RoleCtrl), []string{"127.0.0.1"})
	// Signed with the cluster's own key, as with a leaked one.
	longLived := func(id Identity, usage x509.ExtKeyUsage, validity time.Duration) *x509.Certificate {
		return signed(t, ca, &x509.Certificate{Subject: pkix.Name{CommonName: id.Name()}, NotBefore: now.Add(-Backdate), NotAfter: now.Add(validity - Backdate),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, URIs: []*url.URL{id.URI()}})
	}
	adminID := Identity{ClusterID: "c1", Kind: KindAdmin, NodeID: "n1", Admitted: admitted}
	dataplaneID := Identity{ClusterID: "c1", Kind: KindDataPlane, NodeID: "n1", Admitted: admitted}
	adminLongest := longLived(adminID, x509.ExtKeyUsageClientAuth, AdminLifetime+Backdate)
	adminForged := longLived(adminID, x509.ExtKeyUsageClientAuth, 10*365*24*time.Hour)
	memberForged := longLived(memberID("n1", RoleCtrl), x509.ExtKeyUsageServerAuth, MemberLifetime+Backdate+time.Minute)
	dataplaneForged := longLived(dataplaneID, x509.ExtKeyUsageServerAuth, 2*DataPlaneLifetime)

	tests := []struct {
		name  string
		certs []*x509.Certificate
		usage x509.ExtKeyUsage
		kind  string
		err   string
	}{
		{name: "member as server", certs: []*x509.Certificate{member}, usage: x509.ExtKeyUsageServerAuth, kind: KindMember},
		{name: "member as client", certs: []*x509.Certificate{member}, usage: x509.ExtKeyUsageClientAuth, kind: KindMember},
		{name: "admin as client", certs: []*x509.Certificate{admin}, usage: x509.ExtKeyUsageClientAuth, kind: KindAdmin},
		{name: "data plane as server", certs: []*x509.Certificate{dataplane}, usage: x509.ExtKeyUsageServerAuth, kind: KindDataPlane},
		{name: "leaf with its CA", certs: []*x509.Certificate{member, ca.Cert}, usage: x509.ExtKeyUsageServerAuth, kind: KindMember},
		{name: "no certificate", certs: nil, usage: x509.ExtKeyUsageServerAuth, err: "presented no certificate"},
		{name: "admin as server", certs: []*x509.Certificate{admin}, usage: x509.ExtKeyUsageServerAuth, err: `certificate "admin@n1" is not valid for this cluster`},
		{name: "data plane as client", certs: []*x509.Certificate{dataplane}, usage: x509.ExtKeyUsageClientAuth, err: `certificate "n1" is not valid for this cluster`},
		{name: "another cluster's CA", certs: []*x509.Certificate{foreign}, usage: x509.ExtKeyUsageServerAuth, err: "unknown authority"},
		{name: "another CA in the chain", certs: []*x509.Certificate{foreign, other.Cert}, usage: x509.ExtKeyUsageServerAuth, err: "unknown authority"},
		{name: "expired", certs: []*x509.Certificate{expired}, usage: x509.ExtKeyUsageServerAuth, err: "expired"},
		{name: "not yet valid", certs: []*x509.Certificate{early}, usage: x509.ExtKeyUsageServerAuth, err: "not yet valid"},
		{name: "as long as a member issues", certs: []*x509.Certificate{adminLongest}, usage: x509.ExtKeyUsageClientAuth, kind: KindAdmin},
		{name: "operator for ten years", certs: []*x509.Certificate{adminForged}, usage: x509.ExtKeyUsageClientAuth, err: `certificate "admin@n1" is valid for 87600h0m0s, longer than admin certificates may be (720h10m0s)`},
		{name: "member a minute too long", certs: []*x509.Certificate{memberForged}, usage: x509.ExtKeyUsageServerAuth, err: "longer than member certificates may be"},
		{name: "data plane for two days", certs: []*x509.Certificate{dataplaneForged}, usage: x509.ExtKeyUsageServerAuth, err: "longer than dataplane certificates may be (24h10m0s)"},
		{name: "valid but no identity", certs: []*x509.Certificate{bare}, usage: x509.ExtKeyUsageServerAuth, err: "carries no kibotos identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := Verify(pool, tt.certs, tt.usage)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("Verify = %+v, %v; want an error containing %q", id, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id.Kind != tt.kind || id.NodeID != "n1" || id.ClusterID != "c1" {
				t.Fatalf("Verify = %+v, want a %s of node n1 in c1", id, tt.kind)
			}
		})
	}
}
