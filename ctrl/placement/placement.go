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
	"unique"

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
	c := NewCandidate(n)
	if why := c.ineligible(req, c.holds(templateHandle(req.Template))); why != "" || req.Room == nil {
		return why
	}
	return req.Room(n)
}

// Candidate is a node as Decide reads it, computed once per node record:
// Decide runs for every create over every node, and reading a flat list
// of these instead of following each record's pointers took its share of
// a leader's CPU from about a fifth to under a tenth at 1,000 nodes.
type Candidate struct {
	node *api.Node
	// always is the reason the node can take no request at all, or "".
	always      string
	known       bool // it has a report and schedulable values
	free, sched Free
	// The templates it holds, as handles: comparing one is comparing a
	// pointer, where comparing the names read each node's own copy.
	template0   unique.Handle[string]
	templates   []unique.Handle[string] // after the first
	defaultPool bool
}

// NewCandidate reads n, which must not change while the Candidate is used.
func NewCandidate(n *api.Node) Candidate {
	c := Candidate{node: n}
	switch {
	case n.Admission != api.Admitted || n.Retired:
		c.always = whyNotAdmitted
	case n.Isolated:
		c.always = whyIsolated
	case n.DrainRequested:
		c.always = whyDrained
	case n.Session == nil || !n.Session.Alive:
		c.always = whyNotReady
	case n.Session.Clock != nil && n.Session.Clock.Over:
		c.always = whyClock
	case n.HostUsage != nil && n.HostUsage.MemoryTight:
		c.always = whyMemoryTight
	case n.Overcommit == nil || !n.Overcommit.Acknowledged:
		c.always = whyUnacked
	}
	c.free, c.known = free(n)
	if c.known {
		c.sched = Free{CPU: n.Schedulable.CPU, MemoryBytes: n.Schedulable.MemoryBytes}
		for i, t := range n.Report.Templates {
			if i == 0 {
				c.template0 = unique.Make(t)
			} else {
				c.templates = append(c.templates, unique.Make(t))
			}
		}
		c.defaultPool = hasDefaultPool(n)
	}
	return c
}

// Candidates are NewCandidate of every node.
func Candidates(nodes []api.Node) []Candidate {
	out := make([]Candidate, len(nodes))
	for i := range nodes {
		out[i] = NewCandidate(&nodes[i])
	}
	return out
}

// holds says whether the node holds the template; the zero handle (no
// template asked for) is held everywhere.
func (c *Candidate) holds(template unique.Handle[string]) bool {
	return template == unique.Handle[string]{} || (c.known && (template == c.template0 || slices.Contains(c.templates, template)))
}

// templateHandle is the handle of a request's template, zero for none.
func templateHandle(name string) unique.Handle[string] {
	if name == "" {
		return unique.Handle[string]{}
	}
	return unique.Make(name)
}

func (c *Candidate) ineligible(req Request, holds bool) string {
	if c.always != "" {
		return c.always
	}
	for _, x := range req.Exclude {
		if x == c.node.NodeID {
			return whyRefused
		}
	}
	switch {
	case !c.known:
		return whyNotSchedKnown
	case c.free.CPU < req.CPU:
		return whyNoCPU
	case c.free.MemoryBytes < req.MemoryBytes:
		return whyNoMemory
	}
	if !holds && !req.Published {
		return whyNoTemplate
	}
	if req.OwnDefaultPool && !c.defaultPool {
		return whyNoPool
	}
	for _, want := range req.Pools {
		if !hasPool(c.node, want) {
			return whyNoPool
		}
	}
	return ""
}

// score prefers the node with the most room left after the placement,
// relative to its size, on the scarcer of CPU and memory: Workspaces spread
// by free capacity instead of filling one node first.
func (c *Candidate) score(req Request) float64 {
	cpu := 1.0
	if c.sched.CPU > 0 {
		cpu = float64(c.free.CPU-req.CPU) / float64(c.sched.CPU)
	}
	mem := 1.0
	if c.sched.MemoryBytes > 0 {
		mem = float64(c.free.MemoryBytes-req.MemoryBytes) / float64(c.sched.MemoryBytes)
	}
	return min(cpu, mem)
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

// ForRoom says whether a reason (or its label) is a lack of room on the
// node: it passes when Workspaces there stop, unlike a node that is away.
func ForRoom(reason string) bool {
	switch Label(reason) {
	case whyNoCPU, whyNoMemory, whyMemoryTight:
		return true
	}
	return false
}

// Refused says whether a reason (or its label) is the node's own refusal
// of this placement (Request.Exclude).
func Refused(reason string) bool { return Label(reason) == whyRefused }

// Decide is Choose, saying why it refused.
func Decide(nodes []api.Node, req Request) Decision {
	cands := Candidates(nodes)
	byID := func(a, b Candidate) int { return strings.Compare(a.node.NodeID, b.node.NodeID) }
	if !slices.IsSortedFunc(cands, byID) {
		slices.SortFunc(cands, byID)
	}
	return DecideAmong(cands, req)
}

// DecideAmong is Decide over the nodes' Candidates in node id order (a
// caller that places often keeps them while the records do not change;
// the state lists nodes in that order). Of equal candidates the first
// wins: the order makes ties go to the smallest node id without comparing
// ids, which was most of a pass over a thousand equal nodes.
func DecideAmong(cands []Candidate, req Request) Decision {
	if req.Node != "" {
		for i := range cands {
			n := cands[i].node
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
	better := func(a, b candidate) bool {
		if a.holds != b.holds {
			return a.holds
		}
		return a.score > b.score || (a.score == b.score && a.n.NodeID < b.n.NodeID)
	}
	var why map[string]int
	passed := func(r string) bool {
		if r == "" {
			return true
		}
		if why == nil {
			why = map[string]int{}
		}
		why[r]++
		return false
	}
	// The best one in one pass, without a list: usually it is the answer.
	template := templateHandle(req.Template)
	var top candidate
	for i := range cands {
		c := &cands[i]
		holds := c.holds(template)
		if !passed(c.ineligible(req, holds)) {
			continue
		}
		e := candidate{c.node, holds, c.score(req)}
		if top.n == nil || e.holds != top.holds && e.holds || e.holds == top.holds && e.score > top.score {
			top = e
		}
	}
	best := ""
	switch {
	case top.n == nil:
	case req.Room == nil || passed(req.Room(top.n)):
		best = top.n.NodeID
	default:
		// The rest in order, until one passes the Room check.
		var rest []candidate
		for i := range cands {
			c := &cands[i]
			holds := c.holds(template)
			if c.node != top.n && c.ineligible(req, holds) == "" {
				rest = append(rest, candidate{c.node, holds, c.score(req)})
			}
		}
		sort.Slice(rest, func(i, j int) bool { return better(rest[i], rest[j]) })
		for _, c := range rest {
			if passed(req.Room(c.n)) {
				best = c.n.NodeID
				break
			}
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
