package cluster_test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// BenchmarkRevocationToRefusal measures, with the production timings, the
// time from `kibo enrollment revoke` (the write acknowledged) to the
// revoked node's operator certificate being refused by every member of a
// 3-voter cluster (the ctrl members on an operator call, a node-only member
// on its status, which it confirms with ctrl at most a second old), for 3
// revoked nodes. Run it once:
//
//	go test ./cluster -run X -bench RevocationToRefusal -benchtime 1x
func BenchmarkRevocationToRefusal(b *testing.B) {
	tm := cluster.DefaultTimings()
	c := clustertest.New(b, clustertest.Options{Ctrl: 3, NodeOnly: 4, Timings: &tm})
	c.WaitLeader()
	ctrls := ctrlMembers(c)
	var took []time.Duration
	witness := c.Members[6] // a node-only member that stays
	for _, worker := range c.Members[3:6] {
		old := adminCert(b, worker)
		start := time.Now()
		if _, err := c.Client(ctrls[0]).Do(context.Background(), "POST", "/v1/enrollment/grants/"+worker.ID+"/revoke", api.NodeWriteRequest{}, nil); err != nil {
			b.Fatal(err)
		}
		written := time.Since(start)
		for _, m := range append(ctrls, witness) {
			clustertest.WaitFor(b, 10*time.Second, func() (bool, string) {
				status, _ := rawCall(b, m, old, m.Addr, "GET", "/v1/status", nil, nil)
				return status == http.StatusUnauthorized, "still accepted by " + m.ID
			})
		}
		took = append(took, time.Since(start))
		b.Logf("revoke %s: write acknowledged after %v, refused by all %d ctrl members and node-only %s after %v", worker.ID, written, len(ctrls), witness.ID, took[len(took)-1])
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "ms-median")
	b.ReportMetric(float64(took[len(took)-1].Microseconds())/1000, "ms-max")
}
