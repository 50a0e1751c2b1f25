package metrics

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
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

// A node's warm guests, by template: ready and wanted, and the starts
// that adopted one.
func TestWarmCollector(t *testing.T) {
	reg := Registry(Sources{Warm: func() []api.WarmGuests {
		return []api.WarmGuests{{Template: "kibotos-coding", Wanted: 2, Ready: 1, Starts: 5}}
	}})
	want := `
# HELP kibotos_node_warm_guests The node's warm guests of a template ([templates.NAME] warm): ready (paused, waiting for a create) and wanted.
# TYPE kibotos_node_warm_guests gauge
kibotos_node_warm_guests{state="ready",template="kibotos-coding"} 1
kibotos_node_warm_guests{state="wanted",template="kibotos-coding"} 2
# HELP kibotos_node_warm_starts_total Workspace starts that adopted a warm guest of the template instead of booting, since the node started.
# TYPE kibotos_node_warm_starts_total counter
kibotos_node_warm_starts_total{template="kibotos-coding"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kibotos_node_warm_guests", "kibotos_node_warm_starts_total"); err != nil {
		t.Error(err)
	}
}

// The placement counts of a ctrl member's replica: the creates of the
// replica placed; of two creates no node can take, only the one whose
// entry counts placements is counted, once for each reason that kept a
// node out.
func TestCtrlCollectorPlacements(t *testing.T) {
	f := replica(t, 4, 2, 3)
	huge, err := json.Marshal(fsm.WorkspaceCreateArgs{Template: "kibotos-base", CPU: 64000, MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 0, 1, 0, 0, time.UTC)
	for i, r := range f.Apply([]fsm.Entry{
		{Op: fsm.OpWorkspaceCreate, CommandID: "huge-counted", IssuedAt: at, Args: huge, CountPlacements: true},
		{Op: fsm.OpWorkspaceCreate, CommandID: "huge-not-counted", IssuedAt: at, Args: huge},
	}) {
		if r.Error == nil || r.Error.Code != api.CodeResourceExhausted {
			t.Fatalf("huge create %d: %+v, want resource_exhausted", i, r)
		}
	}
	want := `
# HELP kibotos_placements_total Placements of Workspace Instances (create, start, resume, a re-placement after a node refused) counted in the replicated state, so equal on every ctrl member: placed, or refused (no node could take it).
# TYPE kibotos_placements_total counter
kibotos_placements_total{outcome="placed"} 3
kibotos_placements_total{outcome="refused"} 1
# HELP kibotos_placement_refusals_total Refused placements by each reason that kept a node out (once per refused placement and reason, so the reasons add up to at least the refusals).
# TYPE kibotos_placement_refusals_total counter
kibotos_placement_refusals_total{reason="not enough CPU"} 1
kibotos_placement_refusals_total{reason="not ready"} 1
`
	if err := testutil.GatherAndCompare(Registry(Sources{FSM: f}), strings.NewReader(want), "kibotos_placements_total", "kibotos_placement_refusals_total"); err != nil {
		t.Error(err)
	}
}

// Each entry a replica applies is timed under its op, an op no handler
// knows under "unknown" (bounded labels whatever the log holds).
func TestFSMApplySeconds(t *testing.T) {
	f := replica(t, 1, 0, 0)
	reg := Registry(Sources{FSM: f})
	args, err := json.Marshal(fsm.WorkspaceCreateArgs{Template: "kibotos-base", CPU: 64000, MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 0, 1, 0, 0, time.UTC)
	f.Apply([]fsm.Entry{
		{Op: fsm.OpWorkspaceCreate, CommandID: "a", IssuedAt: at, Args: args},
		{Op: fsm.OpWorkspaceCreate, CommandID: "b", IssuedAt: at, Args: args},
		{Op: "no.such.op", IssuedAt: at, IgnoreUnknown: true},
	})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "kibotos_fsm_apply_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	if counts[fsm.OpWorkspaceCreate] != 2 || counts["unknown"] != 1 || len(counts) != 2 {
		t.Fatalf("applies counted %v; want 2 %s and 1 unknown", counts, fsm.OpWorkspaceCreate)
	}
}

// An Instance's egress connections by outcome, for the Instances the
// egress process routes (an ended one is not in the map, so its series
// ends).
func TestEgressByInstance(t *testing.T) {
	by := func(context.Context) (map[string]egress.GuestStats, bool) {
		return map[string]egress.GuestStats{"inst-a": {Accepted: 5, Refused: 1, Failed: 2}}, true
	}
	want := `
# HELP kibotos_node_egress_instance_connections_total An Instance's guest connections through the egress process, by outcome as kibotos_node_egress_connections_total, while the Instance runs (its series ends with it; a guest not yet counted by an egress process of an earlier build shows none).
# TYPE kibotos_node_egress_instance_connections_total counter
kibotos_node_egress_instance_connections_total{instance_id="inst-a",outcome="accepted"} 5
kibotos_node_egress_instance_connections_total{instance_id="inst-a",outcome="closed"} 0
kibotos_node_egress_instance_connections_total{instance_id="inst-a",outcome="failed"} 2
kibotos_node_egress_instance_connections_total{instance_id="inst-a",outcome="refused"} 1
`
	if err := testutil.GatherAndCompare(Registry(Sources{EgressByInstance: by}), strings.NewReader(want), "kibotos_node_egress_instance_connections_total"); err != nil {
		t.Error(err)
	}
}

// The warm pools' connections are a gauge of the egress process's now.
func TestEgressWarmConnections(t *testing.T) {
	src := func(context.Context) (egress.Stats, bool) { return egress.Stats{Active: 1, Warm: 3}, true }
	want := `
# HELP kibotos_node_egress_warm_connections Connections to Egress SOCKS5 servers the egress process holds greeted and authenticated for the next guest connections ([network] egress_warm_connections per revision in use).
# TYPE kibotos_node_egress_warm_connections gauge
kibotos_node_egress_warm_connections 3
`
	if err := testutil.GatherAndCompare(Registry(Sources{Egress: src}), strings.NewReader(want), "kibotos_node_egress_warm_connections"); err != nil {
		t.Error(err)
	}
}

// Every step a start is timed by (the Instance's and the Workspace's) is a
// series of the step histogram of its own and has its line in the
// metrics reference.
func TestStartStepsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/reference/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	steps := NewSteps()
	names := append(runtime.StartSteps(), runtime.StepBoot, runtime.StepTakeover)
	names = append(names, agent.WorkspaceStartSteps()...)
	seen := map[string]bool{}
	for _, s := range names {
		if seen[s] {
			t.Errorf("step %s is named twice: its series would mix two steps", s)
		}
		seen[s] = true
		steps.Observe(s, 3*time.Millisecond)
		if !strings.Contains(string(doc), "`"+s+"`") {
			t.Errorf("step %s is not in docs/reference/metrics.md", s)
		}
	}
	mfs, err := Registry(Sources{Steps: steps}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() == "kibotos_node_step_seconds" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	for _, s := range names {
		if counts[s] != 1 {
			t.Errorf("kibotos_node_step_seconds{step=%q} has %d samples, want 1", s, counts[s])
		}
	}
}

// A namespace's objects, usage and quota are shown from the replica, and
// the quota refusals from the member's count.
func TestNamespaceMetrics(t *testing.T) {
	f := replica(t, 4, 2, 3)
	at := time.Date(2026, 12, 2, 0, 1, 0, 0, time.UTC)
	limit := uint64(4000)
	entries := []fsm.Entry{
		{Op: fsm.OpNamespaceCreate, IssuedAt: at, Args: mustJSON(t, fsm.NamespaceArgs{Name: "acme"})},
		{Op: fsm.OpNamespaceQuota, IssuedAt: at, Args: mustJSON(t, fsm.NamespaceQuotaArgs{Name: "acme", Set: api.NamespaceQuota{CPU: &limit}})},
		{Op: fsm.OpWorkspaceCreate, CommandID: "w1", IssuedAt: at, Args: mustJSON(t, fsm.WorkspaceCreateArgs{Namespace: "acme", Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30})},
	}
	for i, r := range f.Apply(entries) {
		if r.Error != nil {
			t.Fatalf("entry %d: %v", i, r.Error)
		}
	}
	want := `
# HELP kibotos_namespace_quota A namespace's quota, by resource (absent: not bounded).
# TYPE kibotos_namespace_quota gauge
kibotos_namespace_quota{namespace="acme",resource="cpu"} 4
# HELP kibotos_namespace_quota_refusals_total Writes this member led that a namespace's quota refused, by quota.
# TYPE kibotos_namespace_quota_refusals_total counter
kibotos_namespace_quota_refusals_total{namespace="acme",quota="vCPU"} 2
`
	refusals := func() map[[2]string]uint64 { return map[[2]string]uint64{{"acme", "vCPU"}: 2} }
	reg := Registry(Sources{FSM: f, QuotaRefusals: refusals})
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kibotos_namespace_quota", "kibotos_namespace_quota_refusals_total"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "kibotos_namespace_used")
	if err != nil || n != 5 {
		t.Errorf("kibotos_namespace_used has %d series (%v), want acme's 5", n, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
