package placement

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

const gib = 1 << 30

// ready is a READY node with 8 schedulable cores and 16 GiB, nothing used.
func ready(id string) api.Node {
	return api.Node{
		NodeID: id, Admission: api.Admitted, Status: api.NodeReady,
		Session:     &api.Session{Alive: true, Clock: &api.Clock{}},
		Report:      &api.Report{Capacity: api.Resources{CPU: 8000, MemoryBytes: 16 * gib}, Pools: []api.Pool{{PoolID: "default", Available: true}}},
		Schedulable: &api.Resources{CPU: 8000, MemoryBytes: 16 * gib},
		Overcommit:  &api.Overcommit{CPU: 1000, Memory: 1000, Acknowledged: true},
		HostUsage:   &api.HostUsage{},
	}
}

func with(id string, f func(n *api.Node)) api.Node {
	n := ready(id)
	f(&n)
	return n
}

var small = Request{CPU: 1000, MemoryBytes: 1 * gib}

func TestEveryRuleExcludesANode(t *testing.T) {
	cases := []struct {
		name string
		node api.Node
		req  Request
		why  string
	}{
		{"revoked", with("n", func(n *api.Node) { n.Admission = api.Revoked }), small, whyNotAdmitted},
		{"retired", with("n", func(n *api.Node) { n.Retired = true }), small, whyNotAdmitted},
		{"isolated", with("n", func(n *api.Node) { n.Isolated = true }), small, whyIsolated},
		{"drained", with("n", func(n *api.Node) { n.DrainRequested = true }), small, whyDrained},
		{"no session", with("n", func(n *api.Node) { n.Session.Alive = false }), small, whyNotReady},
		{"clock over", with("n", func(n *api.Node) { n.Session.Clock.Over = true }), small, whyClock},
		{"memory tight", with("n", func(n *api.Node) { n.HostUsage.MemoryTight = true }), small, whyMemoryTight},
		{"overcommit not acknowledged", with("n", func(n *api.Node) { n.Overcommit.Acknowledged = false }), small, whyUnacked},
		{"refused before", ready("n"), Request{CPU: 1000, MemoryBytes: gib, Exclude: []string{"n"}}, whyRefused},
		{"no report", with("n", func(n *api.Node) { n.Report, n.Schedulable = nil, nil }), small, whyNotSchedKnown},
		{"cpu full", with("n", func(n *api.Node) { n.Report.Allocated.CPU = 7500 }), small, whyNoCPU},
		{"memory full", with("n", func(n *api.Node) { n.Report.Allocated.MemoryBytes = 15*gib + 1 }), small, whyNoMemory},
		{"pool missing", ready("n"), Request{CPU: 1000, MemoryBytes: gib, Pools: []string{"shared-nfs"}}, whyNoPool},
		{"pool unavailable", with("n", func(n *api.Node) { n.Report.Pools[0].Available = false }), Request{CPU: 1000, MemoryBytes: gib, Pools: []string{"default"}}, whyNoPool},
		{"fits exactly", with("n", func(n *api.Node) { n.Report.Allocated = api.Resources{CPU: 7000, MemoryBytes: 15 * gib} }), small, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Ineligible(&c.node, c.req); got != c.why {
				t.Fatalf("Ineligible = %q, want %q", got, c.why)
			}
			_, err := Choose([]api.Node{c.node}, c.req)
			if c.why == "" && err != nil {
				t.Fatalf("Choose: %v", err)
			}
			if c.why != "" && (api.CodeOf(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), c.why)) {
				t.Fatalf("Choose: %v, want resource_exhausted naming %q", err, c.why)
			}
		})
	}
}

// Overcommit raises what a node can take: schedulable = reported × multiplier.
func TestOvercommitCountsInSchedulable(t *testing.T) {
	n := with("n", func(n *api.Node) {
		n.Report.Allocated.CPU = 8000
		n.Overcommit.CPU = 2000
		n.Schedulable.CPU = 16000
	})
	if _, err := Choose([]api.Node{n}, small); err != nil {
		t.Fatalf("node at 8 of 16 schedulable cores: %v", err)
	}
}

func TestSpreadsByFreeCapacity(t *testing.T) {
	nodes := []api.Node{
		with("a", func(n *api.Node) { n.Report.Allocated = api.Resources{CPU: 6000, MemoryBytes: 4 * gib} }),
		with("b", func(n *api.Node) { n.Report.Allocated = api.Resources{CPU: 2000, MemoryBytes: 12 * gib} }),
		with("c", func(n *api.Node) { n.Report.Allocated = api.Resources{CPU: 3000, MemoryBytes: 3 * gib} }),
	}
	if got, err := Choose(nodes, small); err != nil || got != "c" {
		t.Fatalf("Choose = %q, %v; want c (most room on its scarcer resource)", got, err)
	}
	// Equal room: the smallest id, whatever the order.
	if got, _ := Choose([]api.Node{ready("z"), ready("m"), ready("q")}, small); got != "m" {
		t.Fatalf("tie: %q, want m", got)
	}
}

func TestPinnedNeverFallsBack(t *testing.T) {
	nodes := []api.Node{ready("a"), with("b", func(n *api.Node) { n.DrainRequested = true })}
	_, err := Choose(nodes, Request{CPU: 1000, MemoryBytes: gib, Node: "b"})
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "node b cannot take this Workspace: drained") {
		t.Fatalf("pinned to a drained node: %v, want failed_precondition", err)
	}
	if _, err := Choose(nodes, Request{CPU: 1000, MemoryBytes: gib, Node: "nope"}); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("pinned to an unknown node: %v, want not_found", err)
	}
	if got, err := Choose(nodes, Request{CPU: 1000, MemoryBytes: gib, Node: "a"}); err != nil || got != "a" {
		t.Fatalf("pinned to a: %q, %v", got, err)
	}
}

func TestExhaustedSaysWhy(t *testing.T) {
	nodes := []api.Node{with("a", func(n *api.Node) { n.DrainRequested = true }), with("b", func(n *api.Node) { n.Report.Allocated.CPU = 8000 })}
	_, err := Choose(nodes, small)
	if api.CodeOf(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "1 drained") || !strings.Contains(err.Error(), "1 not enough CPU") {
		t.Fatalf("%v", err)
	}
}

// TestDecideSaysWhyByLabel: a refusal names each reason once, cut to its
// label, whatever the number of nodes it kept out; a placement names none.
func TestDecideSaysWhyByLabel(t *testing.T) {
	room := func(n *api.Node) string { return "it cannot resume the snapshot: " + n.NodeID + " has QEMU 8.2" }
	nodes := []api.Node{with("a", func(n *api.Node) { n.DrainRequested = true }), with("b", func(n *api.Node) { n.DrainRequested = true }),
		with("c", func(n *api.Node) { n.HostUsage.MemoryTight = true }), ready("d"), ready("e")}
	cases := []struct {
		name  string
		nodes []api.Node
		req   Request
		node  string
		why   []string
	}{
		{"placed", nodes, small, "d", nil},
		{"room refuses the rest", nodes, Request{CPU: 1000, MemoryBytes: gib, Room: room}, "", []string{"drained", "it cannot resume the snapshot", "memory tight"}},
		{"no nodes", nil, small, "", []string{"no nodes"}},
		{"pinned", nodes, Request{CPU: 1000, MemoryBytes: gib, Node: "c"}, "", []string{"memory tight"}},
		{"pinned unknown", nodes, Request{CPU: 1000, MemoryBytes: gib, Node: "z"}, "", []string{"pinned node not registered"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.nodes, c.req)
			if d.Node != c.node || (d.Err != nil) != (c.node == "") || !slices.Equal(d.Why, c.why) {
				t.Fatalf("Decide = %q, %v, why %q; want %q, why %q", d.Node, d.Err, d.Why, c.node, c.why)
			}
		})
	}
}

// BenchmarkPlace10kOn1k places 10,000 Workspaces onto 1,000 nodes, each
// placement seeing the allocations of the ones before (target ≥ 5,000/s),
// keeping the Candidates and renewing the chosen node's, as the FSM does.
func BenchmarkPlace10kOn1k(b *testing.B) {
	for i := 0; i < b.N; i++ {
		nodes := make([]api.Node, 1000)
		for j := range nodes {
			nodes[j] = ready(fmt.Sprintf("node-%04d", j))
			nodes[j].Schedulable = &api.Resources{CPU: 64000, MemoryBytes: 256 * gib}
		}
		index := make(map[string]int, len(nodes))
		for j := range nodes {
			index[nodes[j].NodeID] = j
		}
		req := Request{CPU: 2000, MemoryBytes: 4 * gib}
		cands := Candidates(nodes)
		for w := 0; w < 10000; w++ {
			d := DecideAmong(cands, req)
			if d.Err != nil {
				b.Fatal(d.Err)
			}
			j := index[d.Node]
			r := nodes[j].Report
			r.Allocated.CPU += req.CPU
			r.Allocated.MemoryBytes += req.MemoryBytes
			cands[j] = NewCandidate(&nodes[j])
		}
	}
	b.ReportMetric(float64(b.N)*10000/b.Elapsed().Seconds(), "placements/s")
}

// The caller's Room check decides among the eligible nodes in score order
// and is asked only as far as needed: the emptiest node first; when its
// pool is full the next one; when every pool is full, exhausted with the
// reason counted per node.
func TestRoomInScoreOrder(t *testing.T) {
	busy := func(id string, cpu api.Milli) api.Node {
		return with(id, func(n *api.Node) { n.Report.Allocated.CPU = cpu })
	}
	nodes := []api.Node{busy("a", 6000), busy("b", 0), busy("c", 3000)}
	var asked []string
	full := map[string]bool{}
	req := small
	req.Room = func(n *api.Node) string {
		asked = append(asked, n.NodeID)
		if full[n.NodeID] {
			return "its default storage pool is full"
		}
		return ""
	}
	if got, err := Choose(nodes, req); got != "b" || err != nil || strings.Join(asked, ",") != "b" {
		t.Fatalf("all pools with room: %q %v, asked %v", got, err, asked)
	}
	asked, full["b"] = nil, true
	if got, err := Choose(nodes, req); got != "c" || err != nil || strings.Join(asked, ",") != "b,c" {
		t.Fatalf("the emptiest node's pool full: %q %v, asked %v", got, err, asked)
	}
	full["a"], full["c"] = true, true
	_, err := Choose(nodes, req)
	if api.CodeOf(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "3 its default storage pool is full") {
		t.Fatalf("every pool full: %v", err)
	}
}

// A published template may go to a node without it (which fetches it),
// but a node that holds it wins over one with more room.
func TestPublishedTemplatePrefersHolders(t *testing.T) {
	holder := with("b", func(n *api.Node) {
		n.Report.Templates = []string{"kibotos-coding"}
		n.Report.Allocated = api.Resources{CPU: 6000, MemoryBytes: 12 * gib}
	})
	lacking := ready("a")
	req := Request{CPU: 1000, MemoryBytes: gib, Template: "kibotos-coding"}
	if why := Ineligible(&lacking, req); why != whyNoTemplate {
		t.Fatalf("unpublished template on a node without it: %q, want %q", why, whyNoTemplate)
	}
	req.Published = true
	if got, err := Choose([]api.Node{lacking, holder}, req); err != nil || got != "b" {
		t.Fatalf("Choose = %q, %v; want b, which holds the template", got, err)
	}
	if got, err := Choose([]api.Node{lacking, with("b", func(n *api.Node) { n.DrainRequested = true })}, req); err != nil || got != "a" {
		t.Fatalf("Choose without an eligible holder = %q, %v; want a, which fetches it", got, err)
	}
}
