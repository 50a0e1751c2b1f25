package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/agent/hostusage"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// The node refuses a start by its own view, fresher than ctrl's, while
// host memory is tight (below 10% available, until back above 15%) or it
// is draining: the refusal makes ctrl place the Workspace elsewhere, or
// end it resource_exhausted when nowhere fits. Otherwise the start goes
// on (here it fails: the node does not have the template).
func TestStartRefusedWhenMemoryTightOrDraining(t *testing.T) {
	proc := t.TempDir()
	sampler := hostusage.NewSampler(hostusage.Config{ProcRoot: proc})
	a := &Agent{cfg: Config{NodeID: "node-x", Runtime: &runtime.Runtime{}}, sampler: sampler, log: slog.New(slog.DiscardHandler)}
	task := api.WorkspaceTask{WorkspaceID: "ws-1", Template: "tiny",
		Command: api.WorkspaceCommand{Kind: api.WSCmdStart, CommandID: "ws-1/1", NodeID: "node-x", InstanceID: "inst-1"}}
	for i, step := range []struct {
		availPct int
		draining bool
		refusal  string // "": not refused
	}{
		{availPct: 50},
		{availPct: 5, refusal: "host memory is tight"},
		{availPct: 12, refusal: "host memory is tight"}, // not yet above 15%
		{availPct: 20},
		{availPct: 50, draining: true, refusal: "node node-x is draining"},
		{availPct: 50},
	} {
		meminfo := fmt.Sprintf("MemTotal: 1000000 kB\nMemAvailable: %d kB\n", step.availPct*10000)
		if err := os.WriteFile(filepath.Join(proc, "meminfo"), []byte(meminfo), 0o644); err != nil {
			t.Fatal(err)
		}
		sampler.Sample()
		a.mu.Lock()
		a.draining = step.draining
		a.mu.Unlock()
		r := a.execute(context.Background(), task)
		if r.WorkspaceID != "ws-1" || r.CommandID != "ws-1/1" {
			t.Fatalf("step %d: result %+v", i, r)
		}
		switch {
		case step.refusal != "" && (r.Outcome != fsm.OutcomeRefused || r.Error != step.refusal):
			t.Errorf("step %d (%d%% available, draining %v): %s %q, want refused %q", i, step.availPct, step.draining, r.Outcome, r.Error, step.refusal)
		case step.refusal == "" && (r.Outcome != fsm.OutcomeFailed || !strings.Contains(r.Error, "template tiny is not on node node-x")):
			t.Errorf("step %d (%d%% available, draining %v): %s %q, want the start to go on and fail on the template", i, step.availPct, step.draining, r.Outcome, r.Error)
		}
	}
}
