package nemesis

import (
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// CI runs a short schedule with the fixed seed below; bench/nemesis.sh
// sets a longer one and a seed of its choice.
var (
	seconds = flag.Int("nemesis.seconds", 60, "seconds of workload under faults")
	seed    = flag.Uint64("nemesis.seed", 1, "seed of the workload and the fault schedule")
	hosts   = flag.Int("nemesis.hosts", 3, "hosts: 3 ctrl,node members, node-only ones past them")
	every   = flag.Duration("nemesis.fault-every", 8*time.Second, "mean pause between two faults")
	hold    = flag.Duration("nemesis.hold", 10*time.Second, "the longest a fault is held (the shortest: 30% of it)")
	report  = flag.String("nemesis.report", "", "write the report as JSON to this file")
	keep    = flag.String("nemesis.keep", "", "copy the lab's logs to this directory when an anomaly is found")
	faults  = flag.String("nemesis.faults", "", "comma-separated fault kinds to pick from (default: all of FaultKinds)")
)

// TestNemesis runs the harness: a real cluster, real guests, the
// workload and the faults of the seed, then the checks. Any anomaly fails
// it, with the seed and the history that shows it.
func TestNemesis(t *testing.T) {
	runtimetest.RequireVMHost(t)
	testenv.LookPath(t, "qemu-img", "qemu-utils")
	kinds := FaultKinds
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
		for _, k := range kinds {
			if !slices.Contains(FaultKinds, k) {
				t.Fatalf("-nemesis.faults: %q is not a fault kind (%s)", k, strings.Join(FaultKinds, ", "))
			}
		}
	}
	rep := Run(t, Options{
		Seed: *seed, Duration: time.Duration(*seconds) * time.Second, Hosts: *hosts,
		Workspaces: 3, Clients: 3, FaultEvery: *every, FaultHold: *hold, Faults: kinds, Settle: 3 * time.Minute, KeepDir: *keep, Logf: t.Logf,
	})
	t.Logf("report:\n%s", rep.Summary())
	if *report != "" {
		raw, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*report, raw, 0o644); err != nil {
			t.Error(err)
		}
	}
	if rep.FaultCount() == 0 {
		t.Errorf("no fault was injected in %d s: the run checked nothing under faults", *seconds)
	}
	if len(rep.Anomalies) > 0 {
		t.Errorf("%d anomalies (seed %d): see the report above", len(rep.Anomalies), *seed)
	}
}
