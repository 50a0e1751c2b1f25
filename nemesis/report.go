package nemesis

import (
	"fmt"
	"sort"
	"strings"
)

// Report is the outcome of one run.
type Report struct {
	Seed    uint64 `json:"seed"`
	Seconds int    `json:"seconds"`
	Hosts   int    `json:"hosts"`
	// Operations by kind and outcome; faults by kind.
	Operations map[string]map[Outcome]int `json:"operations"`
	Faults     map[string]int             `json:"faults"`
	FaultLog   []Fault                    `json:"fault_log"`
	Anomalies  []Anomaly                  `json:"anomalies"`
}

func (r *Report) tally(ops []Op, faults []Fault) {
	r.Operations = map[string]map[Outcome]int{}
	for _, o := range ops {
		if r.Operations[o.Kind] == nil {
			r.Operations[o.Kind] = map[Outcome]int{}
		}
		r.Operations[o.Kind][o.Outcome]++
	}
	r.Faults = map[string]int{}
	for _, f := range faults {
		if !strings.HasSuffix(f.Detail, "skipped") {
			r.Faults[f.Kind]++
		}
	}
	r.FaultLog = faults
}

// FaultCount is how many faults were injected (skipped ones left out).
func (r *Report) FaultCount() int {
	n := 0
	for _, c := range r.Faults {
		n += c
	}
	return n
}

// Summary is the report for a reader: operations by kind and outcome,
// faults by kind, and every anomaly with its history.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, %d s, %d hosts\n\noperations       ok   fail unknown\n", r.Seed, r.Seconds, r.Hosts)
	for _, k := range sortedKeys(r.Operations) {
		m := r.Operations[k]
		fmt.Fprintf(&b, "%-14s %5d %6d %7d\n", k, m[OK], m[Fail], m[Unknown])
	}
	fmt.Fprintf(&b, "\nfaults injected: %d\n", r.FaultCount())
	for _, k := range sortedKeys(r.Faults) {
		fmt.Fprintf(&b, "%-16s %5d\n", k, r.Faults[k])
	}
	fmt.Fprintf(&b, "\nanomalies: %d\n", len(r.Anomalies))
	for _, a := range r.Anomalies {
		fmt.Fprintf(&b, "\n%s\n", a)
	}
	if len(r.Anomalies) > 0 {
		fmt.Fprintf(&b, "\nto run this schedule again: bash bench/nemesis.sh %d %d\n", r.Seconds, r.Seed)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
