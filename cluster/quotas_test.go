package cluster_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// Creates racing on every ctrl member for the last room of a namespace's
// quota: as many pass as the quota holds, the others are refused with
// resource_exhausted, and the namespace is never over its quota.
func TestQuotaUnderConcurrentCreates(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3})
	leader := c.WaitLeader()
	c.WaitAllReady()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := c.Client(leader)
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces", api.NamespaceCreateRequest{Name: "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	// Volumes: a Workspace's start fails at once on the in-process nodes
	// (they run no VMs) and frees its share, a Volume keeps its bytes.
	limit := uint64(3 * 64 << 20)
	if _, err := cl.Do(ctx, "POST", "/v1/namespaces/acme/quota", api.NamespaceQuotaRequest{Set: api.NamespaceQuota{VolumeBytes: &limit}}, nil); err != nil {
		t.Fatal(err)
	}
	const tries = 12
	var wg sync.WaitGroup
	errs := make([]error, tries)
	for i := range tries {
		m := c.Members[i%len(c.Members)]
		wg.Go(func() {
			in := c.Client(m)
			in.Namespace = "acme"
			create := api.VolumeCreateRequest{WriteMeta: api.WriteMeta{CommandID: fmt.Sprintf("race-%d", i)}, Name: fmt.Sprintf("v%d", i), SizeBytes: 64 << 20}
			_, errs[i] = in.Do(ctx, "POST", "/v1/volumes", create, nil)
		})
	}
	wg.Wait()
	passed := 0
	for i, err := range errs {
		switch {
		case err == nil:
			passed++
		case api.CodeOf(err) != api.CodeResourceExhausted:
			t.Errorf("create %d: %v, want a pass or resource_exhausted", i, err)
		}
	}
	var ns api.Namespace
	if _, err := cl.Do(ctx, "GET", "/v1/namespaces/acme?consistent=true", nil, &ns); err != nil {
		t.Fatal(err)
	}
	if passed != 3 || ns.Usage.Volumes != 3 || ns.Usage.VolumeBytes != limit {
		t.Fatalf("%d of %d racing creates passed, usage %+v: want exactly the 3 the quota holds, never over it", passed, tries, ns.Usage)
	}
}
