package nemesis

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Outcome is what a client knows about an operation once it returned.
type Outcome string

const (
	OK      Outcome = "ok"      // done, acknowledged
	Fail    Outcome = "fail"    // refused: nothing changed (a definite error)
	Unknown Outcome = "unknown" // timed out or unreachable: it may have happened
)

// Op is one operation of the history: who did what to which Workspace,
// when (nanoseconds since the run began) and what came back.
type Op struct {
	Client    int    `json:"client"`
	Kind      string `json:"kind"`
	Workspace string `json:"workspace,omitempty"`
	// Volume is the Volume of a Volume operation (an append to one goes
	// through the Workspace it is attached to).
	Volume  string  `json:"volume,omitempty"`
	Host    string  `json:"host"`
	Call    int64   `json:"call_ns"`
	Return  int64   `json:"return_ns"`
	Outcome Outcome `json:"outcome"`
	Code    int     `json:"exit_code"`
	// Expected is the version a write required (--expected-version);
	// Version the one a read returned.
	Expected uint64 `json:"expected_version,omitempty"`
	Version  uint64 `json:"version,omitempty"`
	State    string `json:"state,omitempty"`
	// Seq is the number an append wrote.
	Seq int `json:"seq,omitempty"`
	// From is a fork's source.
	From   string `json:"from,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func (o Op) String() string {
	obj := o.Workspace
	if o.Volume != "" {
		obj = strings.TrimPrefix(obj+" "+o.Volume, " ")
	}
	s := fmt.Sprintf("%8.3fs..%8.3fs c%d %-9s %s via %s: %s", float64(o.Call)/1e9, float64(o.Return)/1e9, o.Client, o.Kind, obj, o.Host, o.Outcome)
	if o.Code != 0 {
		s += fmt.Sprintf(" (exit %d)", o.Code)
	}
	if o.Expected != 0 {
		s += fmt.Sprintf(" expected=%d", o.Expected)
	}
	if o.Version != 0 {
		s += fmt.Sprintf(" version=%d state=%s", o.Version, o.State)
	}
	if o.Seq != 0 {
		s += fmt.Sprintf(" seq=%d", o.Seq)
	}
	if o.From != "" {
		s += " from " + o.From
	}
	if o.Detail != "" {
		s += " " + o.Detail
	}
	return s
}

// History is the run's record, shared by the clients.
type History struct {
	start time.Time

	mu  sync.Mutex
	ops []Op
}

func newHistory() *History { return &History{start: time.Now()} }

// now is the time since the run began, the clock of every Op.
func (h *History) now() int64 { return int64(time.Since(h.start)) }

func (h *History) add(o Op) {
	h.mu.Lock()
	h.ops = append(h.ops, o)
	h.mu.Unlock()
}

// Ops is a copy of the history, ordered by call time.
func (h *History) Ops() []Op {
	h.mu.Lock()
	out := append([]Op(nil), h.ops...)
	h.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Call < out[j].Call })
	return out
}

// of is the part of ops that concerns object id: a Workspace, or a Volume.
func of(ops []Op, id string) []Op {
	var out []Op
	for _, o := range ops {
		if o.Workspace == id || o.Volume == id {
			out = append(out, o)
		}
	}
	return out
}

func formatOps(ops []Op) string {
	lines := make([]string, len(ops))
	for i, o := range ops {
		lines[i] = o.String()
	}
	return strings.Join(lines, "\n")
}
