package nemesis

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/kibotos/kibotos/api"
)

// Anomaly is one thing the checker found wrong, with the history of the
// Workspace it concerns.
type Anomaly struct {
	Kind      string `json:"kind"`
	Workspace string `json:"workspace,omitempty"`
	Volume    string `json:"volume,omitempty"`
	Detail    string `json:"detail"`
	History   []Op   `json:"history,omitempty"`
}

func (a Anomaly) String() string {
	s := a.Kind
	for _, id := range []string{a.Workspace, a.Volume} {
		if id != "" {
			s += " " + id
		}
	}
	s += ": " + a.Detail
	if len(a.History) > 0 {
		s += "\n" + formatOps(a.History)
	}
	return s
}

// ---- Versions: a monotonic register per Workspace ----

// A Workspace's version only grows, and ctrl changes it on its own too
// (an Instance reported up, a node gone), so the model keeps the least
// version the Workspace can be at. A consistent read must see at least
// that; a write with --expected-version that succeeded found exactly its
// expected version, so that too is at least the bound. (It need not move
// the version: a start of an AVAILABLE Workspace succeeds and changes
// nothing.) Writes whose outcome is unknown, and refusals, bound nothing:
// they are left out.

type versionInput struct {
	write    bool
	expected uint64
}

var versionModel = porcupine.Model{
	Init: func() interface{} { return uint64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		least, in := state.(uint64), input.(versionInput)
		if in.write {
			return in.expected >= least, in.expected
		}
		v := output.(uint64)
		return v >= least, v
	},
	DescribeOperation: func(input, output interface{}) string {
		if in := input.(versionInput); in.write {
			return fmt.Sprintf("write at version %d", in.expected)
		}
		return fmt.Sprintf("read → %d", output.(uint64))
	},
}

// versionOps are the operations of ops the version model takes.
func versionOps(ops []Op) []porcupine.Operation {
	var out []porcupine.Operation
	for _, o := range ops {
		switch {
		case o.Outcome != OK:
		case o.Kind == "read":
			out = append(out, porcupine.Operation{ClientId: o.Client, Input: versionInput{}, Call: o.Call, Output: o.Version, Return: o.Return})
		case o.Expected != 0:
			out = append(out, porcupine.Operation{ClientId: o.Client, Input: versionInput{write: true, expected: o.Expected}, Call: o.Call, Output: uint64(0), Return: o.Return})
		}
	}
	return out
}

// checkVersions checks the versions of every Workspace of the history.
func checkVersions(ops []Op) []Anomaly {
	var out []Anomaly
	for _, ws := range workspacesOf(ops) {
		mine := of(ops, ws)
		res := porcupine.CheckOperationsTimeout(versionModel, versionOps(mine), time.Minute)
		switch res {
		case porcupine.Illegal:
			out = append(out, Anomaly{Kind: "not-linearizable", Workspace: ws, Detail: "the versions that reads and expected-version writes saw have no order consistent with real time", History: mine})
		case porcupine.Unknown:
			out = append(out, Anomaly{Kind: "check-timeout", Workspace: ws, Detail: "the linearizability check did not finish within a minute", History: mine})
		}
	}
	return out
}

func workspacesOf(ops []Op) []string {
	seen := map[string]bool{}
	var out []string
	for _, o := range ops {
		if o.Workspace != "" && !seen[o.Workspace] {
			seen[o.Workspace] = true
			out = append(out, o.Workspace)
		}
	}
	sort.Strings(out)
	return out
}

// ---- Appends: acknowledged after sync means there after any fault ----

// checkAppends compares the numbers read back from the file of object id
// (a Workspace's own disk, or a Volume) with its appends (ops of kind
// kind): every acknowledged one must be there, once; nothing may be there
// that no append wrote. An append that failed may be there: exec's exit
// code is the command's own once it started, and one cut off by a pause
// goes on after the resume. A fork's disk starts as its source's was
// when the fork began: the source's appends acknowledged before then must
// be there too, and those that began before the fork returned may.
//
// forkedFrom is the source ctrl names for a Workspace ("" none): a fork
// whose create had an unknown outcome has no fork in the history, and then
// any number its source's appends wrote may be in it.
func checkAppends(id, kind, forkedFrom string, ops []Op, content string) []Anomaly {
	mine := of(ops, id)
	must, may := map[int]bool{}, map[int]bool{}
	appendsOf(id, kind, ops, int64(math.MaxInt64), int64(math.MaxInt64), must, may, 0)
	if forkedFrom != "" && !slices.ContainsFunc(mine, func(o Op) bool { return o.Kind == "fork" && o.Outcome == OK }) {
		appendsOf(forkedFrom, kind, ops, 0, int64(math.MaxInt64), must, may, 1)
	}
	count := map[int]int{}
	var bad []string
	for _, line := range strings.Fields(content) {
		// An append whose write the disk failed (unacknowledged: its
		// file's sync said so) may leave zeros where its bytes were: the
		// file grew, the data never reached the disk. They come before
		// the next number, or alone at the end.
		if line = strings.TrimLeft(line, "\x00"); line == "" {
			continue
		}
		n, err := strconv.Atoi(line)
		if err != nil {
			bad = append(bad, strconv.Quote(line))
			continue
		}
		count[n]++
	}
	var lost, twice, phantom []string
	for seq := range must {
		if count[seq] == 0 {
			lost = append(lost, strconv.Itoa(seq))
		}
	}
	for seq, c := range count {
		switch {
		case !must[seq] && !may[seq]:
			phantom = append(phantom, strconv.Itoa(seq))
		case c > 1:
			twice = append(twice, strconv.Itoa(seq))
		}
	}
	var out []Anomaly
	add := func(anomaly, what string, seqs []string) {
		if len(seqs) == 0 {
			return
		}
		sort.Strings(seqs)
		a := objectAnomaly(anomaly, id, what+strings.Join(seqs, " "))
		a.History = mine
		out = append(out, a)
	}
	add("lost-append", "acknowledged appends not read back: ", lost)
	add("duplicate-append", "appends read back more than once: ", twice)
	add("phantom-append", "numbers read back that no append wrote: ", phantom)
	add("corrupt-append", "lines that are not numbers: ", bad)
	return out
}

// appendsOf sorts the appends (of kind) to object id into those that must
// be in its file and those that may: of its own, those acknowledged before
// acked and those begun before begun; and, for a fork, its source's before
// the fork, the same way (depth bounds a chain of forks).
func appendsOf(id, kind string, ops []Op, acked, begun int64, must, may map[int]bool, depth int) {
	for _, o := range ops {
		switch {
		case o.Kind == kind && appendTarget(o) == id:
			if o.Outcome == OK && o.Return < acked {
				must[o.Seq] = true
			} else if o.Call < begun {
				may[o.Seq] = true
			}
		case o.Kind == "fork" && o.Workspace == id && o.Outcome == OK && depth < 16:
			appendsOf(o.From, kind, ops, min(acked, o.Call), min(begun, o.Return), must, may, depth+1)
		}
	}
}

// appendTarget is the object an append wrote to: a Volume, or else the
// Workspace's own disk.
func appendTarget(o Op) string {
	if o.Kind == "volume-append" {
		return o.Volume
	}
	return o.Workspace
}

// ---- Definite answers must be true ----

// checkNotFound reports a refusal that said a Workspace does not exist
// (exit 12) while it did: a consistent read that began after the refusal
// returned found it, and no delete of it had succeeded before. A client
// that believes the answer loses track of a live Workspace.
func checkNotFound(ops []Op) []Anomaly {
	var out []Anomaly
	for _, ws := range workspacesOf(ops) {
		mine := of(ops, ws)
		for i, o := range mine {
			if o.Outcome != Fail || o.Code != api.ExitNotFound || deletedBefore(mine, o.Call) {
				continue
			}
			for _, later := range mine[i+1:] {
				if later.Kind == "read" && later.Outcome == OK && later.Call > o.Return {
					out = append(out, Anomaly{Kind: "false-not-found", Workspace: ws, Detail: fmt.Sprintf("%s via %s at %.3fs answered that the Workspace does not exist; a read at %.3fs found it", o.Kind, o.Host, float64(o.Call)/1e9, float64(later.Call)/1e9), History: mine})
					break
				}
			}
		}
	}
	return out
}

// deletedBefore reports whether a delete of the Workspace was called
// before t (it may have happened, whatever its answer).
func deletedBefore(ops []Op, t int64) bool {
	for _, o := range ops {
		if o.Kind == "delete" && o.Call < t && o.Outcome != Fail {
			return true
		}
	}
	return false
}
