package cli

import (
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Idle timeouts through the CLI: create --idle-timeout stores it, get
// shows it and, once the node reports the Instance idle, for how long;
// --json carries both; set-timeout --idle changes it with or without the
// timeout; bad durations are usage errors (exit 2).
func TestWorkspaceIdleTimeout(t *testing.T) {
	var mu sync.Mutex
	var idleInst string
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding")
		mu.Lock()
		defer mu.Unlock()
		if idleInst != "" { // as a node would: idle 200 s
			r.InstanceStates = append(r.InstanceStates, api.InstanceState{InstanceID: idleInst, State: "RUNNING", IdleSeconds: 200})
		}
	}, HoldTask: func(string, api.WorkspaceTask) bool { return true }})
	create := []string{"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q"}
	id := strings.TrimSpace(e.mustRun(append(create, "--idle-timeout", "10m", "--auto-resume")...))
	ws := e.wsJSON(id)
	if ws.IdleTimeoutSeconds != 600 || ws.Idle != nil {
		t.Fatalf("created: idle timeout %d s, idle %+v", ws.IdleTimeoutSeconds, ws.Idle)
	}
	out := e.mustRun("workspace", "get", id)
	if got := lineOf(t, out, "Idle timeout"); got != "Idle timeout: 10m without a connection and with a quiet guest, then pause" {
		t.Errorf("get: %q", got)
	}
	if strings.Contains(out, "\nIdle:") {
		t.Errorf("get shows idleness before any report of it:\n%s", out)
	}

	mu.Lock()
	idleInst = ws.InstanceID
	mu.Unlock()
	testenv.WaitFor(t, 20*time.Second, "the node's report of the idle Instance", func() (bool, string) {
		ws = e.wsJSON(id)
		return ws.Idle != nil, "not yet"
	})
	if ws.Idle.Seconds != 200 {
		t.Errorf("--json idle: %+v", ws.Idle)
	}
	if got := lineOf(t, e.mustRun("workspace", "get", id), "Idle"); !regexp.MustCompile(`^Idle: (3|4)m$`).MatchString(got) {
		t.Errorf("get: %q", got)
	}

	// set-timeout --idle changes it alone (the Workspace still has no
	// end), and 0 removes it.
	if got := e.mustRun("workspace", "set-timeout", id, "--idle", "5m"); !regexp.MustCompile(`^workspace ` + id + `: ends never, paused when idle 5m \(version \d+\)\n$`).MatchString(got) {
		t.Errorf("set-timeout --idle 5m: %q", got)
	}
	if ws := e.wsJSON(id); ws.IdleTimeoutSeconds != 300 || ws.EndsAt != nil || ws.TimeoutSeconds != 0 {
		t.Errorf("after set-timeout --idle 5m: idle %d s, ends %v, timeout %d s", ws.IdleTimeoutSeconds, ws.EndsAt, ws.TimeoutSeconds)
	}
	if got := e.mustRun("workspace", "set-timeout", id, "1h", "--idle", "0"); !strings.Contains(got, "), then delete, no idle timeout (version") {
		t.Errorf("set-timeout 1h --idle 0: %q", got)
	}
	if ws := e.wsJSON(id); ws.IdleTimeoutSeconds != 0 || ws.TimeoutSeconds != 3600 {
		t.Errorf("after set-timeout 1h --idle 0: idle %d s, timeout %d s", ws.IdleTimeoutSeconds, ws.TimeoutSeconds)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"workspace", "set-timeout", id}, "give a timeout, --idle, or both"},
		{[]string{"workspace", "set-timeout", id, "--idle", "soon"}, `--idle: timeout "soon" is not a duration`},
		{[]string{"workspace", "set-timeout", id, "--idle", "5m", "--on-timeout", "stop"}, "--on-timeout without a timeout"},
		{append(create, "--idle-timeout", "soon"), `--idle-timeout: timeout "soon" is not a duration`},
		{append(create, "--idle-timeout", "1.5s"), "not whole seconds"},
		{append(create, "--idle-timeout", "0"), "--idle-timeout 0: leave it out"},
	} {
		e.expectExit(api.ExitUsage, c.msg, c.args...)
	}
}

func TestShownDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		40*time.Second + 400*time.Millisecond: "40s",
		3*time.Minute + 29*time.Second:        "3m",
		3*time.Minute + 31*time.Second:        "4m",
		2*time.Hour + 10*time.Second:          "2h",
	} {
		if got := api.FormatTimeout(shownDuration(d)); got != want {
			t.Errorf("shownDuration(%v): %q, want %q", d, got, want)
		}
	}
}
