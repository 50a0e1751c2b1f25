package runtime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
)

// workspaceConfigure mounts the Workspace's filesystem as the node does.
func workspaceConfigure(ws string) func(guestproto.GuestInfo) guestproto.ConfigureRequest {
	return func(g guestproto.GuestInfo) guestproto.ConfigureRequest { return agent.WorkspaceConfigure(ws, g) }
}

func warmSpec(tpl *template.Template, inst *platform.Installation, mib int) runtime.WarmSpec {
	return runtime.WarmSpec{WarmKey: runtime.WarmKey{Template: tpl.Name, TemplateID: tpl.ID, InstallationID: inst.ID, VCPUs: 1, MemoryMiB: mib},
		Image: tpl.Image(), Installation: inst, Mounts: agent.TemplateMounts}
}

// BenchmarkWarmCreate measures on one node, with the same Platform,
// template and a 512 MiB, 1-vCPU guest, what a node does for the first
// start of a Workspace, to the first exec answer in its filesystem: a
// cold boot (a new layer, boot, mount) against the adoption of a
// resident warm guest (its layer linked, its policy, its vCPUs started,
// a new identity and machine id). The warm guest is booted before each
// iteration's timings and is not in them; it waits a few seconds with
// its vCPUs stopped, as one does between creates. It reports the
// medians in ms and warm/cold, the ratio the issue sets at ≤ 0.15. What
// ctrl adds to a create (the write, placement, the session) is the same
// for both.
//
//	go test ./agent/runtime -run X -bench WarmCreate -benchtime 3x
func BenchmarkWarmCreate(b *testing.B) {
	h, inst, rt, ctx := benchRuntime(b)
	tpl := busyboxTemplate(ctx, b, h, "sh", "true")
	layers := filepath.Join(h.root, "pools", "default", "layers")
	os.MkdirAll(layers, 0o700)
	ws := warmSpec(tpl, inst, 512)
	exec := func(id string) {
		b.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: agent.WorkspaceRoot, Argv: []string{"true"}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			b.Fatalf("true in %s: %+v, %v", id, r, err)
		}
	}
	var cold, warm []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		r, err := rt.BootResident(ctx, ws)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		spec := func(id string) runtime.Spec {
			return runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 512, Network: true, RootImage: tpl.Image(), LayerPath: filepath.Join(layers, id+".qcow2")}
		}
		c := spec(fmt.Sprintf("c-%d", i))
		c.Configure = workspaceConfigure(c.InstanceID)
		t0 := time.Now()
		if _, err := rt.Start(ctx, c); err != nil {
			b.Fatal(err)
		}
		exec(c.InstanceID)
		cold = append(cold, time.Since(t0))
		// Each runs alone: a TCG guest just booted still takes CPU.
		b.StopTimer()
		if err := rt.Delete(ctx, c.InstanceID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		w := spec(fmt.Sprintf("w-%d", i))
		t0 = time.Now()
		if err := adoptResident(ctx, rt, r, w, w.InstanceID); err != nil {
			b.Fatal(err)
		}
		exec(w.InstanceID)
		warm = append(warm, time.Since(t0))

		b.StopTimer()
		if err := rt.Delete(ctx, w.InstanceID); err != nil {
			b.Fatal(err)
		}
		os.Remove(c.LayerPath)
		os.Remove(w.LayerPath)
		b.StartTimer()
	}
	if os.Getenv("KB_DUMP") != "" {
		b.Logf("%s", h.logs.String())
	}
	c, w := median(cold), median(warm)
	b.ReportMetric(c, "cold-ms")
	b.ReportMetric(w, "warm-ms")
	b.ReportMetric(w/c, "warm/cold")
}
