package cli

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// Timeouts through the CLI: create --timeout arms an end that get
// shows with its action and the time left, list --wide in its ENDS
// column and --json as fields; set-timeout moves it from now and 0
// removes it; bad durations and actions are usage errors (exit 2) that
// reach no member.
func TestWorkspaceTimeoutCommands(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails: no VMs
	}})
	create := []string{"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q"}
	id := strings.TrimSpace(e.mustRun(append(create, "--timeout", "30m", "--on-timeout", "stop", "--auto-resume")...))
	ws := e.wsJSON(id)
	if !ws.AutoResume {
		t.Errorf("created without auto_resume")
	}
	if ws.EndsAt == nil || ws.OnTimeout != api.TimeoutStop || ws.TimeoutSeconds != 1800 || !ws.EndsAt.Equal(ws.CreatedAt.Add(30*time.Minute)) {
		t.Fatalf("created: ends %v action %q timeout %d", ws.EndsAt, ws.OnTimeout, ws.TimeoutSeconds)
	}
	out := e.mustRun("workspace", "get", id)
	if got := lineOf(t, out, "Ends"); !regexp.MustCompile(`^Ends: \S+Z \(in (30|29)m\), then stop$`).MatchString(got) {
		t.Errorf("get: %q", got)
	}
	if got := lineOf(t, out, "Timeout"); got != "Timeout: 30m after each start and resume" {
		t.Errorf("get: %q", got)
	}
	if got := lineOf(t, out, "Auto-resume"); !strings.HasPrefix(got, "Auto-resume: yes") {
		t.Errorf("get: %q", got)
	}
	if got := e.mustRun("workspace", "list", "--all", "--wide"); !strings.Contains(got, "ENDS") || !regexp.MustCompile(id+`.* in (30|29)m \(stop\)\n`).MatchString(got) {
		t.Errorf("list --wide:\n%s", got)
	}

	if got := e.mustRun("workspace", "set-timeout", id, "2h", "--on-timeout", "pause"); !regexp.MustCompile(`^workspace ` + id + `: ends \S+Z \(in (2h|1h59m)\), then pause \(version \d+\)\n$`).MatchString(got) {
		t.Errorf("set-timeout 2h: %q", got)
	}
	if ws := e.wsJSON(id); ws.EndsAt == nil || time.Until(*ws.EndsAt) < 119*time.Minute || ws.OnTimeout != api.TimeoutPause || ws.TimeoutSeconds != 7200 {
		t.Errorf("after set-timeout 2h: ends %v action %q timeout %d", ws.EndsAt, ws.OnTimeout, ws.TimeoutSeconds)
	}
	if got := e.mustRun("workspace", "set-timeout", id, "0"); !strings.Contains(got, ": ends never ") {
		t.Errorf("set-timeout 0: %q", got)
	}
	if out := e.mustRun("workspace", "get", id); strings.Contains(out, "Ends:") {
		t.Errorf("get after set-timeout 0 still shows an end:\n%s", out)
	}
	if got := e.mustRun("workspace", "list", "--all", "--wide"); !regexp.MustCompile(id + `.* -\n`).MatchString(got) {
		t.Errorf("list --wide without an end:\n%s", got)
	}

	for _, c := range []struct {
		args []string
		msg  string
	}{
		{append(create, "--timeout", "soon"), `timeout "soon" is not a duration`},
		{append(create, "--run-timeout", "1.5s"), "not whole seconds"}, // the name of earlier builds
		{append(create, "--on-timeout", "stop"), "--on-timeout without --timeout"},
		{append(create, "--timeout", "5m", "--on-timeout", "explode"), `--on-timeout "explode": give delete, stop or pause`},
		{[]string{"workspace", "set-timeout", id, "9000h"}, "longer than"},
		{[]string{"workspace", "set-timeout", id, "0", "--on-timeout", "stop"}, "0 removes the end"},
	} {
		e.expectExit(api.ExitUsage, c.msg, c.args...)
	}
	e.expectExit(api.ExitNotFound, "ws-nope", "workspace", "set-timeout", "ws-nope", "1h")
}

// relative rounds to the second below a minute and to the minute above.
func TestRelativeTimes(t *testing.T) {
	now := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		4*time.Minute + 10*time.Second: "in 4m",
		90 * time.Minute:               "in 1h30m",
		2 * time.Hour:                  "in 2h",
		12 * time.Second:               "in 12s",
		-12 * time.Second:              "12s ago",
		-3 * time.Minute:               "3m ago",
	} {
		if got := relative(now.Add(d), now); got != want {
			t.Errorf("relative(%v): %q, want %q", d, got, want)
		}
	}
}
