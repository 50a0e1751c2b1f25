package cluster_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// A Workspace's network policy over the API: create stores it
// normalized, set-network is refused while the Workspace is FAILED and
// stored at once once it is STOPPED, changing only the items given; bad
// policies are refused with the code that names what is wrong and change
// nothing.
func TestWorkspaceNetworkOverHTTP(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails (no VMs)
	}})
	cl := c.Client(c.Members[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	create := api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "net-1"}, Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20,
		Network: &api.NetworkPolicy{Egress: "public", Allow: []string{"10.1.2.3", "10.0.0.0/8"}}}
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", create, &ws); err != nil {
		t.Fatal(err)
	}
	if want := (api.NetworkPolicy{Egress: "public", Allow: []string{"10.1.2.3/32", "10.0.0.0/8"}}); ws.Network == nil || !reflect.DeepEqual(*ws.Network, want) {
		t.Fatalf("created with %+v, want %+v", ws.Network, want)
	}
	get := func() api.Workspace {
		t.Helper()
		var now api.Workspace
		if _, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID, nil, &now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		ws = get()
		return ws.State == api.WorkspaceFailed, "state " + ws.State
	})
	path := "/v1/workspaces/" + ws.WorkspaceID + "/network"
	str := func(s string) *string { return &s }
	list := func(r ...string) *[]string { r = append([]string{}, r...); return &r }
	refused := func(code api.Code, msg string, req api.WorkspaceNetworkRequest) {
		t.Helper()
		before := get()
		_, err := cl.Do(ctx, "POST", path, req, nil)
		if api.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
			t.Fatalf("set-network %+v: %v, want %s saying %q", req.NetworkChange, err, code, msg)
		}
		if after := get(); after.Version != before.Version {
			t.Fatalf("refused set-network moved the version %d → %d", before.Version, after.Version)
		}
	}
	refused(api.CodeFailedPrecondition, "workspace "+ws.WorkspaceID+" is FAILED: set-network needs STOPPED", api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Deny: list("192.0.2.1")}})

	if _, err := cl.Do(ctx, "POST", "/v1/workspaces/"+ws.WorkspaceID+"/stop", api.WorkspaceWriteRequest{}, &ws); err != nil || ws.State != api.WorkspaceStopped {
		t.Fatalf("stop: %v %+v", err, ws)
	}
	var set api.Workspace
	req := api.WorkspaceNetworkRequest{WriteMeta: api.WriteMeta{CommandID: "net-2", ExpectedVersion: &ws.Version}, NetworkChange: api.NetworkChange{Deny: list("192.0.2.7")}}
	if _, err := cl.Do(ctx, "POST", path, req, &set); err != nil {
		t.Fatal(err)
	}
	want := api.NetworkPolicy{Egress: "public", Allow: []string{"10.1.2.3/32", "10.0.0.0/8"}, Deny: []string{"192.0.2.7/32"}}
	if !reflect.DeepEqual(*set.Network, want) || set.Pending != nil || set.Version != ws.Version+1 {
		t.Fatalf("set-network of a STOPPED Workspace: %+v network %+v", set, set.Network)
	}
	// A retry replays the result.
	if raw, err := cl.Do(ctx, "POST", path, req, nil); err != nil || get().Version != set.Version {
		t.Fatalf("retry: %v %s", err, raw)
	}
	refused(api.CodeVersionMismatch, "not the expected", api.WorkspaceNetworkRequest{WriteMeta: api.WriteMeta{ExpectedVersion: &ws.Version}, NetworkChange: api.NetworkChange{Allow: list()}})
	refused(api.CodeNotFound, "egress corp does not exist: create it with kibo egress create corp --socks5 HOST:PORT", api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Egress: str("corp"), Allow: list(), Deny: list()}})
	refused(api.CodeNotFound, "resolver corp-dns does not exist", api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Resolver: str("corp-dns")}})
	refused(api.CodeInvalidArgument, `allow rule "*.com" is not a CIDR, an IP address or a domain`, api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Allow: list("*.com")}})
	refused(api.CodeInvalidArgument, `allow rule "10.0.0.0/33" is not a CIDR`, api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Allow: list("10.0.0.0/33")}})
	refused(api.CodeInvalidArgument, "apply to public egress only", api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Egress: str("none")}})
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces/ws-nope/network", api.WorkspaceNetworkRequest{}, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("set-network of an unknown Workspace: %v", err)
	}
	// Back to none: the lists go with it.
	var none api.Workspace // fresh: absent fields must read as empty
	if _, err := cl.Do(ctx, "POST", path, api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Egress: str("none"), Allow: list(), Deny: list()}}, &none); err != nil ||
		!reflect.DeepEqual(*none.Network, api.NetworkPolicy{Egress: "none"}) {
		t.Fatalf("back to none: %v %+v", err, none.Network)
	}
}
