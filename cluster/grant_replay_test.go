package cluster_test

import (
	"context"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
)

// A grant asked again with the same command id and inputs (a retry after
// a lost answer) returns the same grant, token included, and that grant
// admits one host; other inputs under the same command id are refused.
func TestGrantReplayReturnsTheSameGrant(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	ctx := context.Background()
	req := api.GrantRequest{WriteMeta: api.WriteMeta{CommandID: "grant-replay-1"}, NodeID: "node-r", Roles: []string{api.RoleNode}, TTL: "30m"}
	var first, again api.GrantResponse
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/enrollment/grants", req, &first); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/enrollment/grants", req, &again); err != nil {
		t.Fatalf("the same grant asked again: %v; want the same grant", err)
	}
	if first.Token == "" || again.Token != first.Token || !again.Grant.ExpiresAt.Equal(first.Grant.ExpiresAt) {
		t.Fatalf("replayed grant %+v; want the first %+v", again, first)
	}
	other := req
	other.Roles = []string{api.RoleCtrl, api.RoleNode}
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/enrollment/grants", other, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the command id with other roles: %v; want failed_precondition", err)
	}
	join := func(dir string) error {
		_, err := cluster.Join(ctx, cluster.JoinOptions{DataDir: datadir.Dir(dir), Advertise: clustertest.FreeAddr(t), Grant: again.Token, Member: m.Addr})
		return err
	}
	if err := join(t.TempDir() + "/a"); err != nil {
		t.Fatalf("join with the replayed grant: %v", err)
	}
	if err := join(t.TempDir() + "/b"); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a second join with it: %v; want failed_precondition (used)", err)
	}
}
