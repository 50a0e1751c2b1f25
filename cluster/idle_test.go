package cluster_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// A Workspace with an idle timeout whose node reports its Instance idle
// is paused by the leader once it has been idle that long, not before,
// with one log line; while the node reports it in use nothing happens.
// The node is played by the test: its reports carry the Instance's idle
// seconds as a node measuring them would.
func TestIdleWorkspacePaused(t *testing.T) {
	t.Parallel()
	logs := &testenv.Buffer{}
	var mu sync.Mutex
	var inst string
	var idleFrom time.Time // zero: in use
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Logs: logs,
		AdjustReport: func(_ string, r *api.Report) {
			r.Templates = append(r.Templates, "kibotos-coding")
			r.Resume = &api.ResumeInfo{QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}}
			mu.Lock()
			defer mu.Unlock()
			if inst == "" {
				return
			}
			st := api.InstanceState{InstanceID: inst, State: "RUNNING"}
			if !idleFrom.IsZero() {
				st.IdleSeconds = int64(time.Since(idleFrom) / time.Second)
			}
			r.InstanceStates = append(r.InstanceStates, st)
		},
		HoldTask: func(string, api.WorkspaceTask) bool { return true }})
	m := c.Members[0]
	cl := c.Client(m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := playNode(t, ctx, c, m)
	get, answer := p.get, p.answer
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20,
		IdleTimeout: "8s", AutoResume: true}, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.IdleTimeoutSeconds != 8 {
		t.Fatalf("created with idle timeout 8s: %d s", ws.IdleTimeoutSeconds)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20,
		IdleTimeout: "soon"}, nil); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "idle_timeout") {
		t.Fatalf("create with idle timeout %q: %v", "soon", err)
	}
	answer(ws.WorkspaceID, nil)
	ws = get(ws.WorkspaceID)
	mu.Lock()
	inst = ws.InstanceID
	mu.Unlock()
	// In use for longer than the idle timeout: it keeps running.
	testenv.WaitFor(t, 20*time.Second, "a report of the Instance in use", func() (bool, string) {
		n, err := c.Node(m, ws.NodeID)
		if err != nil || n.Report == nil {
			return false, "no report"
		}
		for _, st := range n.Report.InstanceStates {
			if st.InstanceID == inst {
				return true, ""
			}
		}
		return false, "not reported yet"
	})
	inUse := time.Now()
	testenv.WaitFor(t, 30*time.Second, "idle timeout plus a tick in use", func() (bool, string) {
		cur := get(ws.WorkspaceID)
		if cur.State != api.WorkspaceAvailable || cur.Idle != nil {
			t.Fatalf("in use: %s idle %+v", cur.State, cur.Idle)
		}
		return time.Since(inUse) > 14*time.Second, cur.State
	})

	mu.Lock()
	idleFrom = time.Now()
	mu.Unlock()
	var pausedAt time.Time
	testenv.WaitFor(t, 30*time.Second, "the idle pause", func() (bool, string) {
		cur := get(ws.WorkspaceID)
		if cur.State == api.WorkspacePausing {
			pausedAt = time.Now()
			return true, ""
		}
		return false, cur.State
	})
	if early := idleFrom.Add(8 * time.Second); pausedAt.Before(early) {
		t.Fatalf("paused at %s, before it was idle 8s (%s)", pausedAt, early)
	}
	t.Logf("paused %s after it became idle (idle timeout 8s)", pausedAt.Sub(idleFrom).Round(time.Millisecond))
	mu.Lock()
	inst = ""
	mu.Unlock()
	answer(ws.WorkspaceID, &api.SnapshotReport{SizeBytes: 100 << 20, Compat: resumeCompat})
	if cur := get(ws.WorkspaceID); cur.State != api.WorkspacePaused {
		t.Fatalf("after the node's answer: %s", cur.State)
	}
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "workspace idle, pausing") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "workspace_id="+ws.WorkspaceID) || !strings.Contains(lines[0], "idle_since=") {
		t.Fatalf("log lines 'workspace idle, pausing': %q", lines)
	}
}
