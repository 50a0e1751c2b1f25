package member

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// A data-plane certificate the signing CA did not issue is replaced at
// the next update, long before its half-life: a CA rotation reaches the
// data plane without waiting 12 hours.
func TestDataPlaneCertificateFollowsTheSigningCA(t *testing.T) {
	oldCA, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	var signer atomic.Pointer[trust.CA]
	signer.Store(oldCA)
	issued := 0
	issue := func(_ context.Context, pub *ecdsa.PublicKey, hosts []string) (api.DataPlaneCertResponse, error) {
		issued++
		ca := signer.Load()
		id := trust.Identity{ClusterID: "c1", Kind: trust.KindDataPlane, NodeID: "node-1"}
		cert, err := ca.Issue(id, hosts, pub, trust.DataPlaneLifetime)
		return api.DataPlaneCertResponse{Cert: string(cert) + string(ca.CertPEM), NotAfter: time.Now().Add(trust.DataPlaneLifetime)}, err
	}
	l := &dataPlaneLink{issue: issue, hosts: []string{"127.0.0.1"}, log: slog.New(slog.DiscardHandler),
		signing: func() *x509.Certificate { return signer.Load().Cert }}
	ctx := context.Background()
	for range 2 {
		if err := l.credentials(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if issued != 1 || !trust.IssuedBy(l.Leaf(), oldCA.Cert) {
		t.Fatalf("before the rotation: %d certificates issued, want 1 of the old CA", issued)
	}
	signer.Store(newCA)
	if err := l.credentials(ctx); err != nil {
		t.Fatal(err)
	}
	if issued != 2 || !trust.IssuedBy(l.Leaf(), newCA.Cert) {
		t.Fatalf("after ctrl signs with the new CA: %d certificates issued, want a second one of the new CA", issued)
	}
}
