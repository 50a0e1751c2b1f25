package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kibotos/kibotos/agent/runtime"
)

// The node's figures from a list of Instances (the e2e dev test scrapes a
// real member): every state is exposed, zeros included, and a stopped
// Instance has no denied counter any more.
func TestNodeCollector(t *testing.T) {
	list := func() []runtime.InstanceStatus {
		return []runtime.InstanceStatus{
			{ID: "a", State: runtime.StateRunning, DeniedPackets: 7},
			{ID: "b", State: runtime.StateRunning},
			{ID: "c", State: runtime.StateStopped, DeniedPackets: 3},
			{ID: "d", State: runtime.StateFailed},
		}
	}
	reg := Registry(Sources{Instances: list, Destroyed: func() int { return 4 }})
	want := `
# HELP kibotos_node_instances Instances the node holds, by state.
# TYPE kibotos_node_instances gauge
kibotos_node_instances{state="destroyed"} 4
kibotos_node_instances{state="failed"} 1
kibotos_node_instances{state="running"} 2
kibotos_node_instances{state="starting"} 0
kibotos_node_instances{state="stopped"} 1
kibotos_node_instances{state="stopping"} 0
# HELP kibotos_node_guest_denied_packets_total Packets of an Instance's guest its rule table dropped, since the Instance started.
# TYPE kibotos_node_guest_denied_packets_total counter
kibotos_node_guest_denied_packets_total{instance_id="a"} 7
kibotos_node_guest_denied_packets_total{instance_id="b"} 0
kibotos_node_guest_denied_packets_total{instance_id="d"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kibotos_node_instances", "kibotos_node_guest_denied_packets_total"); err != nil {
		t.Error(err)
	}
}
