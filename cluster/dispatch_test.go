package cluster

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// The node executes a task without asking back: a start carries the
// Workspace's policy (egress none for a record written before policies),
// a network command the policy it asks for, not the one in force.
func TestWorkspaceTaskCarriesNetwork(t *testing.T) {
	public := &api.NetworkPolicy{Egress: api.EgressPublic, Allow: []string{"10.0.0.0/8"}}
	requested := &api.NetworkPolicy{Egress: api.EgressPublic, Deny: []string{"192.0.2.7/32"}}
	ws := func(kind string, network *api.NetworkPolicy, cmdNetwork *api.NetworkPolicy) *api.Workspace {
		return &api.Workspace{WorkspaceID: "ws-1", Template: "tiny", CPU: 1000, MemoryBytes: 256 << 20, Network: network,
			Layer:   &api.LayerRight{NodeID: "node-a", PoolID: "default", Held: true},
			Pending: &api.WorkspaceCommand{Kind: kind, CommandID: "ws-1/3", NodeID: "node-a", InstanceID: "inst-1", Network: cmdNetwork}}
	}
	for _, c := range []struct {
		name string
		w    *api.Workspace
		want *api.NetworkPolicy
	}{
		{"start", ws(api.WSCmdStart, public, nil), public},
		{"start of an old record", ws(api.WSCmdStart, nil, nil), &api.NetworkPolicy{Egress: api.EgressNone}},
		{"network", ws(api.WSCmdNetwork, public, requested), requested},
		{"stop", ws(api.WSCmdStop, public, nil), nil},
		{"delete", ws(api.WSCmdDelete, public, nil), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			task := taskFor(c.w)
			if !reflect.DeepEqual(task.Network, c.want) {
				t.Errorf("task network %+v, want %+v", task.Network, c.want)
			}
			if !reflect.DeepEqual(task.Command, *c.w.Pending) || task.WorkspaceID != "ws-1" || task.Template != "tiny" || task.LayerPool != "default" ||
				task.CPU != 1000 || task.MemoryBytes != 256<<20 {
				t.Errorf("task %+v", task)
			}
		})
	}
}

// A task names the Egress revision its policy records with that
// revision's SOCKS5 address (never its credentials), and the Resolver's
// upstreams; a policy whose objects ctrl cannot find sends no task.
func TestWorkspaceTaskCarriesNetworkObjects(t *testing.T) {
	f, err := fsm.Open(t.TempDir() + "/state.db")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	entry := func(op string, args any) fsm.Entry {
		raw, _ := json.Marshal(args)
		return fsm.Entry{Op: op, Args: raw, IssuedAt: now}
	}
	for _, r := range f.Apply([]fsm.Entry{
		entry(fsm.OpBootstrap, fsm.BootstrapArgs{ClusterID: "c", NodeID: "node-a", Roles: []string{"ctrl", "node"}, Address: "127.0.0.1:1"}),
		entry(fsm.OpEgressCreate, fsm.EgressCreateArgs{Name: "corp", SOCKS5: "proxy:1080", Username: "u", Password: "secret-pw"}),
		entry(fsm.OpEgressUpdate, fsm.EgressUpdateArgs{Name: "corp", SOCKS5: ptr("proxy2:1080")}),
		entry(fsm.OpResolverCreate, fsm.ResolverCreateArgs{Name: "corp-dns", Upstreams: []string{"192.0.2.53", "dns.corp.example:5353"}}),
	}) {
		if r.Error != nil {
			t.Fatal(r.Error)
		}
	}
	pol := &api.NetworkPolicy{Egress: "corp", EgressRevision: 2, Resolver: "corp-dns"}
	w := &api.Workspace{WorkspaceID: "ws-1", Network: pol, Pending: &api.WorkspaceCommand{Kind: api.WSCmdStart, CommandID: "ws-1/1", NodeID: "node-a"}}
	task := taskFor(w)
	if err := f.View(func(tx *bolt.Tx) error { return withNetworkObjects(tx, task) }); err != nil {
		t.Fatal(err)
	}
	if want := (&api.TaskEgress{Name: "corp", Revision: 2, SOCKS5: "proxy2:1080", Credentials: true}); !reflect.DeepEqual(task.Egress, want) {
		t.Errorf("task egress %+v, want %+v", task.Egress, want)
	}
	if want := (&api.TaskResolver{Name: "corp-dns", Upstreams: []string{"192.0.2.53:53", "dns.corp.example:5353"}}); !reflect.DeepEqual(task.Resolver, want) {
		t.Errorf("task resolver %+v, want %+v", task.Resolver, want)
	}
	if raw, _ := json.Marshal(task); strings.Contains(string(raw), "secret-pw") {
		t.Errorf("task carries the password: %s", raw)
	}
	// Revision 1 is no longer kept (nothing uses it): no task.
	w.Network = &api.NetworkPolicy{Egress: "corp", EgressRevision: 1}
	if err := f.View(func(tx *bolt.Tx) error { return withNetworkObjects(tx, taskFor(w)) }); err == nil {
		t.Error("a task for a revision ctrl does not keep")
	}
	// None and public name no objects.
	w.Network = &api.NetworkPolicy{Egress: api.EgressPublic}
	task = taskFor(w)
	if err := f.View(func(tx *bolt.Tx) error { return withNetworkObjects(tx, task) }); err != nil || task.Egress != nil || task.Resolver != nil {
		t.Errorf("public egress: %v %+v %+v", err, task.Egress, task.Resolver)
	}
}

func ptr[T any](v T) *T { return &v }
