package cli

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// cleanupRow returns the ITEM row of cleanup-status's table as fields.
func cleanupRow(t *testing.T, out, item string) []string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == item {
			return f
		}
	}
	t.Fatalf("no %s row in:\n%s", item, out)
	return nil
}

// endedEnv is a cluster whose node-1 reports the Instances and ended
// records a test gives it (it runs no VMs): two Workspaces that ran there
// and were ended by stop --force, the record of one kept, the other's
// deleted by hand.
type endedEnv struct {
	*cliEnv
	mu      sync.Mutex
	running []string            // Instances the node reports holding
	records []api.EndedInstance // the node's ended records: all of them

	kept, keptInst, lost, lostInst string
	endedAt                        time.Time
}

func newEndedEnv(t *testing.T, levels map[string]int) *endedEnv {
	e := &endedEnv{}
	e.cliEnv = newCLIEnv(t, clustertest.Options{Ctrl: 1, FeatureLevels: levels,
		AdjustReport: func(_ string, r *api.Report) {
			r.Templates = append(r.Templates, "kibotos-coding")
			e.mu.Lock()
			defer e.mu.Unlock()
			for _, id := range e.running {
				r.InstanceStates = append(r.InstanceStates, api.InstanceState{InstanceID: id, State: "RUNNING"})
			}
			r.Ended, r.EndedComplete = slices.Clone(e.records), true
		},
		// The node never answers a start: as far as ctrl knows, the
		// Instances run until stop --force ends them.
		HoldTask: func(_ string, t api.WorkspaceTask) bool { return t.Command.Kind == api.WSCmdStart },
	})
	create := func() (ws, instance string) {
		ws = strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q"))
		return ws, e.wsJSON(ws).InstanceID
	}
	e.kept, e.keptInst = create()
	e.lost, e.lostInst = create()
	e.mu.Lock()
	e.running = []string{e.keptInst, e.lostInst}
	e.mu.Unlock()
	node := e.c.Members[0]
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		node.Agent.PushReport()
		n, err := e.c.Node(node, "node-1")
		return err == nil && n.Report != nil && len(n.Report.InstanceStates) == 2, "the report of both Instances not stored"
	})
	for _, ws := range []string{e.kept, e.lost} {
		e.mustRun("workspace", "stop", "--force", ws)
	}
	e.endedAt = time.Now().UTC().Truncate(time.Second)
	e.mu.Lock()
	e.running, e.records = nil, []api.EndedInstance{{InstanceID: e.keptInst, EndedAt: e.endedAt, How: "forced"}}
	e.mu.Unlock()
	return e
}

// checkItems checks every item row of ws's cleanup-status: state,
// source, observed, since.
func (e *endedEnv) checkItems(ws string, want ...string) {
	e.t.Helper()
	out := e.mustRun("workspace", "cleanup-status", ws)
	for _, item := range []string{"RUNTIME", "VOLUME_ATTACHMENT", "RESIDUAL"} {
		if row := cleanupRow(e.t, out, item); !slices.Equal(row[1:], want) {
			e.t.Errorf("%s of %s: %v, want %v\n%s", item, ws, row[1:], want, out)
		}
	}
}

// cleanup-status after ctrl's round over the node's ended-Instance
// records: the release the node observed for a Workspace whose record
// ctrl concluded, and UNKNOWN for the runtime items of one whose record
// was deleted before ctrl stored its conclusion. ctrl checks a node's
// records once a minute, so this test waits about that long.
func TestWorkspaceCleanupStatusEndedRecords(t *testing.T) {
	e := newEndedEnv(t, nil)
	// Before the round: ctrl's own view, the node's conclusion not stored.
	if row := cleanupRow(t, e.mustRun("workspace", "cleanup-status", e.kept), "RUNTIME"); row[1] != api.CleanupReleased || row[2] != "control-plane" {
		t.Fatalf("RUNTIME before the round: %v", row)
	}
	clustertest.WaitFor(t, 2*time.Minute, func() (bool, string) {
		out := e.mustRun("workspace", "cleanup-status", e.lost)
		return cleanupRow(t, out, "RUNTIME")[1] == api.CleanupUnknown, "no round yet:\n" + out
	})
	if out := e.mustRun("workspace", "cleanup-status", e.lost); !strings.Contains(out, "Instance "+e.lostInst+", node node-1") {
		t.Errorf("cleanup-status does not name the Instance and node:\n%s", out)
	}
	e.checkItems(e.lost, api.CleanupUnknown, "node", "-", "-")
	// The same round stored the conclusion of the record the node kept.
	e.checkItems(e.kept, api.CleanupReleased, "node", e.endedAt.Format(time.RFC3339), "-")
}

// While a ctrl voter is below the level of rounds (a rolling upgrade),
// ctrl concludes every record a report carries at once, as before, and
// never takes a missing record as deleted.
func TestWorkspaceCleanupStatusEndedRecordsBelowLevel(t *testing.T) {
	e := newEndedEnv(t, map[string]int{"node-1": 3})
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		e.c.Members[0].Agent.PushReport()
		row := cleanupRow(t, e.mustRun("workspace", "cleanup-status", e.kept), "RUNTIME")
		return row[2] == "node", "conclusion not stored: " + strings.Join(row, " ")
	})
	e.checkItems(e.kept, api.CleanupReleased, "node", e.endedAt.Format(time.RFC3339), "-")
	if row := cleanupRow(t, e.mustRun("workspace", "cleanup-status", e.lost), "RUNTIME"); row[1] != api.CleanupReleased || row[2] != "control-plane" {
		t.Errorf("RUNTIME of the Workspace whose record is missing: %v", row)
	}
}
