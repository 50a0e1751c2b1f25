// Package placement chooses the node for a Workspace's next Instance from
// the registration records ctrl holds. It is a pure function of its inputs:
// the leader runs it before it proposes a placement, so the same records
// give the same node on any member. It never reads the clock or the network.
//
// Schedulable = reported capacity × overcommit multiplier. A candidate is
// admitted, READY, not drained, not isolated or retired, has a clock within
// bounds, is not memory-tight, has acknowledged its overcommit values, has
// room for the request and reaches every pool the request needs. A pinned
// request (--node) considers only that node and never falls back.
package placement

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// Request is what one Instance needs.
type Request struct {
	CPU         api.Milli
	MemoryBytes uint64
	// Pools are the pools holding the Workspace's Volumes and retained
	// layer; the node must report each one available. Empty: any node.
	Pools []string
	// Template must be built on the node ("": any node), unless Published.
	Template string
	// Published: Template is in the cluster's catalog, so a node without
	// it fetches it; nodes that hold it are still preferred.
	Published bool
	// OwnDefaultPool: the node must report its own default pool (where it
	// creates a new retained layer) available.
	OwnDefaultPool bool
	// Node pins the placement to one node (--node).
	Node string
	// Exclude are nodes that refused this placement (drained or memory
	// tight by their own account): ctrl places elsewhere at once.
	Exclude []string
	// Room, when set, is the caller's last check of a node that passed
	// every other (room in the pools the new objects would go to): the
	// reason the node cannot take the request, or "". It must be a pure
	// function of the records, like everything here. Its text up to the
	// first ": " or " (" is a metric label (see Label): keep that part one
	// of a fixed set and put names and figures after it.
	Room func(n *api.Node) string
	// What names the request in errors when it is not a Workspace's
	// Instance (a new Volume); default: its CPU and memory.
	What string
}

// Reasons a node is not a candidate, as shown in errors.
const (
	whyNotAdmitted   = "not admitted"
	whyNotReady      = "not ready (no live session)"
	whyDrained       = "drained"
	whyIsolated      = "isolated"
	whyClock         = "clock skew over 30s"
	whyMemoryTight   = "memory tight"
	whyUnacked       = "overcommit values not yet acknowledged"
	whyNoCPU         = "not enough CPU"
	whyNoMemory      = "not enough memory"
	whyNoPool        = "a needed storage pool is unavailable there"
	whyNoTemplate    = "the template is not built there"
	whyRefused       = "refused this placement"
	whyNotSchedKnown = "no report yet"
	// A refusal that passed over no node.
	whyNoNodes       = "no nodes"
	whyNotRegistered = "pinned node not registered"
)

// Free is what a node has left for new Instances.
type Free struct {
	CPU         api.Milli
	MemoryBytes uint64
}

// free computes schedulable minus allocated; ok is false without a report.
func free(n *api.Node) (Free, bool) {
	if n.Report == nil || n.Schedulable == nil {
		return Free{}, false
	}
	f := Free{}
	if n.Schedulable.CPU > n.Report.Allocated.CPU {
		f.CPU = n.Schedulable.CPU - n.Report.Allocated.CPU
	}
	if n.Schedulable.MemoryBytes > n.Report.Allocated.MemoryBytes {
		f.MemoryBytes = n.Schedulable.MemoryBytes - n.Report.Allocated.MemoryBytes
	}
	return f, true
}

// Ineligible says why a node cannot take the request, or "" if it can.
func Ineligible(n *api.Node, req Request) string {
	if why := ineligibleByRecord(n, req); why != "" || req.Room == nil {
		return why
	}
	return req.Room(n)
}

// ineligibleByRecord is Ineligible without the caller's Room check.
func ineligibleByRecord(n *api.Node, req Request) string {
	return ineligibleHolding(n, req, req.Template == "" || HasTemplate(n, req.Template))
}

// ineligibleHolding is ineligibleByRecord given whether n holds the
// request's template (Decide looks it up once per node).
func ineligibleHolding(n *api.Node, req Request, holds bool) string {
	switch {
	case n.Admission != api.Admitted || n.Retired:
		return whyNotAdmitted
	case n.Isolated:
		return whyIsolated
	case n.DrainRequested:
		return whyDrained
	case n.Session == nil || !n.Session.Alive:
		return whyNotReady
	case n.Session.Clock != nil && n.Session.Clock.Over:
		return whyClock
	case n.HostUsage != nil && n.HostUsage.MemoryTight:
		return whyMemoryTight
	case n.Overcommit == nil || !n.Overcommit.Acknowledged:
		return whyUnacked
	}
	for _, x := range req.Exclude {
		if x == n.NodeID {
			return whyRefused
		}
	}
	f, ok := free(n)
	switch {
	case !ok:
		return whyNotSchedKnown
	case f.CPU < req.CPU:
		return whyNoCPU
	case f.MemoryBytes < req.MemoryBytes:
		return whyNoMemory
	}
	if !holds && !req.Published {
		return whyNoTemplate
	}
	if req.OwnDefaultPool && !hasDefaultPool(n) {
		return whyNoPool
	}
	for _, want := range req.Pools {
		if !hasPool(n, want) {
			return whyNoPool
		}
	}
	return ""
}

// HasTemplate reports whether the node reports template name built.
func HasTemplate(n *api.Node, name string) bool {
	if n.Report == nil {
		return false
	}
	for _, t := range n.Report.Templates {
		if t == name {
			return true
		}
	}
	return false
}

// hasDefaultPool is hasPool of the node's default pool, without building
// its id for every node of every placement.
func hasDefaultPool(n *api.Node) bool {
	for _, p := range n.Report.Pools {
		if p.Available && api.IsDefaultPoolOf(p.PoolID, n.NodeID, n.Report) {
			return true
		}
	}
	return false
}

func hasPool(n *api.Node, id string) bool {
	for _, p := range n.Report.Pools {
		if p.PoolID == id && p.Available {
			return true
		}
	}
	return false
}

// score prefers the node with the most room left after the placement,
// relative to its size, on the scarcer of CPU and memory: Workspaces spread
// by free capacity instead of filling one node first.
func score(n *api.Node, req Request) float64 {
	f, _ := free(n)
	cpu := 1.0
	if n.Schedulable.CPU > 0 {
		cpu = float64(f.CPU-req.CPU) / float64(n.Schedulable.CPU)
	}
	mem := 1.0
	if n.Schedulable.MemoryBytes > 0 {
		mem = float64(f.MemoryBytes-req.MemoryBytes) / float64(n.Schedulable.MemoryBytes)
	}
	return min(cpu, mem)
}

// Choose returns the node for req, or an error: not_found for an unknown
// pinned node, failed_precondition when the pinned node cannot take it,
// resource_exhausted when no node can. Ties go to the smallest node id, so
// the choice depends only on the records.
func Choose(nodes []api.Node, req Request) (string, error) {
	d := Decide(nodes, req)
	return d.Node, d.Err
}

// Decision is Choose's answer with, for a refusal, why.
type Decision struct {
	Node string
	Err  error
	// Why, when Err is set, are the labels (see Label) of the reasons
	// nodes were passed over, each once, sorted: every node was checked.
	// A refusal that passed over none says "no nodes" or, pinned to an
	// unknown node, "pinned node not registered".
	Why []string
}

// Label is the part of a reason a metric may carry as a label: its text
// up to the first ": " or " (" (the rest names objects or gives figures).
func Label(reason string) string {
	for _, sep := range []string{": ", " ("} {
		if i := strings.Index(reason, sep); i >= 0 {
			reason = reason[:i]
		}
	}
	return reason
}

// Decide is Choose, saying why it refused.
func Decide(nodes []api.Node, req Request) Decision {
	if req.Node != "" {
		for i := range nodes {
			n := &nodes[i]
			if n.NodeID != req.Node {
				continue
			}
			if why := Ineligible(n, req); why != "" {
				return Decision{Err: api.Errorf(api.CodeFailedPrecondition, "node %s cannot take this Workspace: %s; --node never places elsewhere", n.NodeID, why),
					Why: []string{Label(why)}}
			}
			return Decision{Node: n.NodeID}
		}
		return Decision{Err: api.Errorf(api.CodeNotFound, "node %s is not registered: check the id with kibo node list", req.Node),
			Why: []string{whyNotRegistered}}
	}
	// The caller's Room check reads more than the node record, so it runs
	// only on the best candidates, in order, until one passes (usually the
	// first): the choice is the same as checking every node first.
	type candidate struct {
		n     *api.Node
		holds bool // holds the template: no fetch before the start
		score float64
	}
	eligible := make([]candidate, 0, len(nodes))
	why := map[string]int{}
	for i := range nodes {
		n := &nodes[i]
		holds := req.Template == "" || HasTemplate(n, req.Template)
		if r := ineligibleHolding(n, req, holds); r != "" {
			why[r]++
			continue
		}
		eligible = append(eligible, candidate{n, holds, score(n, req)})
	}
	better := func(a, b candidate) bool {
		if a.holds != b.holds {
			return a.holds
		}
		return a.score > b.score || (a.score == b.score && a.n.NodeID < b.n.NodeID)
	}
	best := ""
	if len(eligible) > 0 {
		// The best one first (one pass); the rest in order only when its
		// Room check fails.
		top := 0
		for i := range eligible {
			if better(eligible[i], eligible[top]) {
				top = i
			}
		}
		eligible[0], eligible[top] = eligible[top], eligible[0]
		for i := 0; i < len(eligible); i++ {
			c := eligible[i]
			if req.Room != nil {
				if r := req.Room(c.n); r != "" {
					why[r]++
					if i == 0 {
						rest := eligible[1:]
						sort.Slice(rest, func(i, j int) bool { return better(rest[i], rest[j]) })
					}
					continue
				}
			}
			best = c.n.NodeID
			break
		}
	}
	if best == "" {
		what := req.What
		if what == "" {
			what = fmt.Sprintf("room for %s CPU and %s memory", req.CPU, api.FormatBytes(req.MemoryBytes))
		}
		return Decision{Err: api.Errorf(api.CodeResourceExhausted, "no admitted node is ready with %s%s; retry later or free capacity", what, summarize(why)),
			Why: labels(why)}
	}
	return Decision{Node: best}
}

// labels are the labels of the reasons in why, each once, sorted.
func labels(why map[string]int) []string {
	if len(why) == 0 {
		return []string{whyNoNodes}
	}
	out := make([]string, 0, len(why))
	for r := range why {
		if l := Label(r); !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

func summarize(why map[string]int) string {
	if len(why) == 0 {
		return " (no nodes)"
	}
	parts := make([]string, 0, len(why))
	for r, n := range why {
		parts = append(parts, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}
