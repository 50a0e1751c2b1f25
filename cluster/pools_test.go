package cluster_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// Storage pools over the API: an operator reads and sets them; a member
// certificate (a node's own) calls none of them; bad input is refused
// before it enters the log.
func TestStoragePoolEndpoints(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	ctrl, worker := c.Members[0], c.Members[1]
	cl := c.Client(ctrl)
	ctx := context.Background()
	var l api.StoragePoolList
	if _, err := cl.Do(ctx, "GET", "/v1/storage-pools", nil, &l); err != nil || len(l.Pools) != 2 {
		t.Fatalf("pools %+v %v", l, err)
	}
	var p api.StoragePool
	if _, err := cl.Do(ctx, "POST", "/v1/storage-pools/node-2:default/capacity", api.PoolCapacityRequest{CapacityBytes: 5 << 30}, &p); err != nil || *p.CapacityBytes != 5<<30 {
		t.Fatalf("set-capacity %+v %v", p, err)
	}
	for _, call := range []struct{ method, path string }{
		{"GET", "/v1/storage-pools"}, {"GET", "/v1/storage-pools/node-2:default"},
		{"POST", "/v1/storage-pools/node-2:default/capacity"}, {"POST", "/v1/storage-pools/node-2:default/declare-lost"},
	} {
		if status, e := rawCall(t, ctrl, memberCert(t, worker), ctrl.Addr, call.method, call.path, struct{}{}, nil); status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not an operator") {
			t.Errorf("member certificate on %s %s: %d %v, want 403", call.method, call.path, status, e)
		}
	}
	for path, want := range map[string]string{
		"/v1/storage-pools/Bad%20Pool/capacity":     `storage pool id "Bad Pool" is not valid`,
		"/v1/storage-pools/node-2:default/capacity": "capacity 0 is out of range",
	} {
		if _, err := cl.Do(ctx, "POST", path, api.PoolCapacityRequest{}, nil); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("POST %s: %v, want invalid_argument %q", path, err, want)
		}
	}
	if _, err := cl.Do(ctx, "POST", "/v1/storage-pools/node-2:default/declare-lost", api.PoolDeclareLostRequest{ConfirmDataLost: true}, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Errorf("declare-lost of a pool its node still declares: %v", err)
	}
}
