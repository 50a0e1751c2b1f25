package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/testenv"
)

// withCodingTemplate makes every node offer the template the tests
// create from (the start then fails: the in-process nodes run no VMs).
func withCodingTemplate(_ string, r *api.Report) {
	r.Templates = append(r.Templates, "kibotos-coding")
}

// A Workspace's timeout fires after the leader that armed it was killed:
// the new leader reads the end from the replicated state, deletes the
// Workspace not before its end and at most a few seconds after, and says
// so in one log line.
func TestWorkspaceTimeoutFiresAcrossLeaderKill(t *testing.T) {
	t.Parallel()
	logs := &testenv.Buffer{}
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, Logs: logs, AdjustReport: withCodingTemplate})
	old := c.WaitLeader()
	survivor := follower(c)
	cl := c.Client(survivor)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// On the survivor's node: the delete of its layer goes there.
	create := api.WorkspaceCreateRequest{WriteMeta: api.WriteMeta{CommandID: "life-1"}, Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20,
		NodeID: survivor.ID, Timeout: "10s"}
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", create, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.EndsAt == nil || ws.OnTimeout != api.TimeoutDelete || ws.TimeoutSeconds != 10 || !ws.EndsAt.Equal(ws.CreatedAt.Add(10*time.Second)) {
		t.Fatalf("created: ends %v, action %q, timeout %ds, created %s", ws.EndsAt, ws.OnTimeout, ws.TimeoutSeconds, ws.CreatedAt)
	}
	end := *ws.EndsAt
	old.Kill()
	testenv.WaitFor(t, 15*time.Second, "a new leader", func() (bool, string) {
		l := c.Leader()
		return l != nil && l != old, "none yet"
	})
	var gone time.Time
	var early string
	testenv.WaitFor(t, 40*time.Second, "the timed-out delete", func() (bool, string) {
		now := time.Now()
		var cur api.Workspace
		_, err := cl.Do(ctx, "GET", "/v1/workspaces/"+ws.WorkspaceID, nil, &cur)
		switch {
		case api.CodeOf(err) == api.CodeNotFound:
			gone = now
			return true, ""
		case err != nil:
			return false, err.Error()
		case now.Before(end) && (cur.State == api.WorkspaceDeleting || cur.EndsAt == nil):
			early = cur.State
		}
		return false, cur.State
	})
	if early != "" || gone.Before(end) {
		t.Fatalf("deleted early: %q before its end %s (gone at %s)", early, end, gone)
	}
	late := gone.Sub(end)
	if late > 5*time.Second {
		t.Fatalf("deleted %s after its end, want at most 5s", late)
	}
	t.Logf("deleted %s after its end, across a leader kill", late)
	var lines []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "workspace timed out") && strings.Contains(l, ws.WorkspaceID) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "action=delete") || !strings.Contains(lines[0], "ends_at=") {
		t.Fatalf("log lines of the timeout: %q, want one with action=delete and ends_at", lines)
	}
}

// set-timeout over the API: from now, shorter or longer, 0 clears it;
// bad durations are refused before the log. A voter below the level of
// lifetimes refuses a create with a timeout and set-timeout (it would
// drop them), and a create without one still works.
func TestWorkspaceSetTimeoutOverHTTP(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, AdjustReport: withCodingTemplate})
	cl := c.Client(c.Members[0])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20}, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.EndsAt != nil {
		t.Fatalf("a create without a timeout has an end: %s", ws.EndsAt)
	}
	path := "/v1/workspaces/" + ws.WorkspaceID + "/timeout"
	before := time.Now()
	var set api.Workspace
	if _, err := cl.Do(ctx, "POST", path, api.WorkspaceTimeoutRequest{Timeout: "2h", OnTimeout: api.TimeoutStop}, &set); err != nil {
		t.Fatal(err)
	}
	if set.EndsAt == nil || set.EndsAt.Before(before.Add(2*time.Hour-time.Second)) || set.EndsAt.After(time.Now().Add(2*time.Hour)) || set.OnTimeout != api.TimeoutStop {
		t.Fatalf("set-timeout 2h at %s: ends %v, action %q", before, set.EndsAt, set.OnTimeout)
	}
	var cleared api.Workspace // fresh: absent fields must read as empty
	if _, err := cl.Do(ctx, "POST", path, api.WorkspaceTimeoutRequest{Timeout: "0"}, &cleared); err != nil || cleared.EndsAt != nil || cleared.TimeoutSeconds != 0 {
		t.Fatalf("set-timeout 0: %v, ends %v", err, cleared.EndsAt)
	}
	for _, bad := range []string{"soon", "-5m", "1.5s", "9000h"} {
		if _, err := cl.Do(ctx, "POST", path, api.WorkspaceTimeoutRequest{Timeout: bad}, nil); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Errorf("set-timeout %q: %v, want invalid_argument", bad, err)
		}
	}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, OnTimeout: api.TimeoutPause}, nil); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("create with on_timeout and no timeout: %v, want invalid_argument", err)
	}

	older := clustertest.New(t, clustertest.Options{Ctrl: 2, AdjustReport: withCodingTemplate, FeatureLevels: map[string]int{"node-2": fsm.LevelLifetimes - 1}})
	ocl := older.Client(older.WaitLeader())
	_, err := ocl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, Timeout: "30m"}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "feature level 15") {
		t.Fatalf("create with a timeout below the level: %v", err)
	}
	_, err = ocl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, AutoResume: true}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("create with auto-resume below the level: %v", err)
	}
	var plain api.Workspace
	if _, err := ocl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20}, &plain); err != nil {
		t.Fatalf("create without a timeout below the level: %v", err)
	}
	if _, err := ocl.Do(ctx, "POST", "/v1/workspaces/"+plain.WorkspaceID+"/timeout", api.WorkspaceTimeoutRequest{Timeout: "1h"}, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("set-timeout below the level: %v", err)
	}
}
