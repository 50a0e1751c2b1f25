package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
)

var resumeCompat = api.SnapshotCompat{InstallationID: "sha256-a", QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", MemoryMiB: 256, VCPUs: 1}

// A data-plane credential asked for a PAUSED Workspace with auto-resume
// resumes it, waits until it is AVAILABLE and is issued for the resumed
// Instance, with one log line; without auto-resume it is refused as
// before. The node is played by the test: it holds every task, and the
// test answers them as a node with VMs would.
func TestCredentialResumesOnConnect(t *testing.T) {
	logs := &testenv.Buffer{}
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Logs: logs,
		AdjustReport: func(_ string, r *api.Report) {
			r.Templates = append(r.Templates, "kibotos-coding")
			r.DataPlaneAddress = "127.0.0.1:9"
			r.Resume = &api.ResumeInfo{QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}}
		},
		HoldTask: func(string, api.WorkspaceTask) bool { return true }})
	m := c.Members[0]
	cl := c.Client(m)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := playNode(t, ctx, c, m)
	get, answer := p.get, p.answer
	paused := func(autoResume bool) api.Workspace {
		t.Helper()
		var ws api.Workspace
		if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, AutoResume: autoResume}, &ws); err != nil {
			t.Fatal(err)
		}
		answer(ws.WorkspaceID, nil)
		if _, err := cl.Do(ctx, "POST", "/v1/workspaces/"+ws.WorkspaceID+"/pause", api.WorkspaceWriteRequest{}, nil); err != nil {
			t.Fatal(err)
		}
		answer(ws.WorkspaceID, &api.SnapshotReport{SizeBytes: 100 << 20, Compat: resumeCompat})
		if ws = get(ws.WorkspaceID); ws.State != api.WorkspacePaused || ws.AutoResume != autoResume {
			t.Fatalf("paused: %s auto-resume %v", ws.State, ws.AutoResume)
		}
		return ws
	}

	plain := paused(false)
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces/"+plain.WorkspaceID+"/credentials", struct{}{}, nil); api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "resume it with kibo workspace resume") {
		t.Fatalf("credential of a PAUSED Workspace without auto-resume: %v", err)
	}

	ws := paused(true)
	type issued struct {
		cred api.DataPlaneCredential
		err  error
	}
	got := make(chan issued, 1)
	go func() {
		var cred api.DataPlaneCredential
		_, err := cl.Do(ctx, "POST", "/v1/workspaces/"+ws.WorkspaceID+"/credentials", struct{}{}, &cred)
		got <- issued{cred, err}
	}()
	var resuming api.Workspace
	testenv.WaitFor(t, 15*time.Second, "the resume on connect", func() (bool, string) {
		resuming = get(ws.WorkspaceID)
		return resuming.State == api.WorkspaceStarting && resuming.Pending != nil && resuming.Snapshot != nil, resuming.State
	})
	select {
	case r := <-got:
		t.Fatalf("credential issued before the Workspace was AVAILABLE: %+v %v", r.cred, r.err)
	default:
	}
	answer(ws.WorkspaceID, nil)
	r := <-got
	if r.err != nil {
		t.Fatalf("credential after the resume: %v", r.err)
	}
	if after := get(ws.WorkspaceID); after.State != api.WorkspaceAvailable || r.cred.InstanceID != after.InstanceID || r.cred.InstanceID == "" || r.cred.Credential == "" {
		t.Fatalf("credential %+v for %+v", r.cred, after)
	}
	if n := strings.Count(logs.String(), "workspace resumed on connect"); n != 1 || !strings.Contains(logs.String(), "workspace_id="+ws.WorkspaceID) {
		t.Fatalf("%d log lines 'workspace resumed on connect'", n)
	}
}
