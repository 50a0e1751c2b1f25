package cluster_test

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// An operator certificate signed with the cluster's own CA key (as with
// a leaked one) for ten years is refused by every member, ctrl or not:
// no member issues one that long. The same certificate for as long as a
// member issues is accepted, so the lifetime alone is what is refused.
func TestForgedLongLivedCertificateIsRefused(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 2, NodeOnly: 1})
	first := c.Members[0]
	ca, err := trust.LoadCA(first.Dir.CACert(), first.Dir.CAKey())
	if err != nil {
		t.Fatal(err)
	}
	real := adminCert(t, first)
	id, err := trust.FromCert(real.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	forge := func(validity time.Duration) tls.Certificate {
		now := time.Now()
		return forgeLike(t, ca, real.Leaf, now.Add(-trust.Backdate), now.Add(validity-trust.Backdate))
	}
	longest, tenYears := forge(trust.AdminLifetime+trust.Backdate), forge(10*365*24*time.Hour)
	for _, m := range c.Members {
		// A node-only member sends the caller on to ctrl (421), once it
		// accepted the certificate.
		if status, e := rawCall(t, m, longest, m.Addr, "GET", "/v1/nodes", nil, nil); status != http.StatusOK && status != http.StatusMisdirectedRequest {
			t.Fatalf("GET /v1/nodes on %s with %s for %v: %d %v, want 200 or 421", m.ID, id.Name(), trust.AdminLifetime, status, e)
		}
		status, e := rawCall(t, m, tenYears, m.Addr, "GET", "/v1/nodes", nil, nil)
		if status != http.StatusUnauthorized || e == nil || e.Code != api.CodeUnauthenticated {
			t.Fatalf("GET /v1/nodes on %s with %s for ten years: %d %v, want 401 unauthenticated", m.ID, id.Name(), status, e)
		}
	}
}
