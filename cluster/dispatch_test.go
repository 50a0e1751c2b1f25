package cluster

import (
	"reflect"
	"testing"

	"github.com/kibotos/kibotos/api"
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
