package runtime_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
)

// BenchmarkPauseResume measures on one node, with the same Platform and a
// 512 MiB, 1-vCPU guest, each iteration: a cold start to the first exec
// answer, the pause (memory and devices saved beside the layer, fsynced
// and checksummed, the VMM ended), and the resume to the first exec
// answer. Before the pause the guest fills 128 MiB of its page cache, so
// the snapshot holds written memory and not only zero pages. It reports
// the medians in ms and resume/cold, the ratio the issue sets at ≤ 0.1.
// What ctrl adds to a create or a resume (the write, placement, the
// session) is the same for both and not in these figures.
//
//	go test ./agent/runtime -run X -bench PauseResume -benchtime 3x
func BenchmarkPauseResume(b *testing.B) {
	h, inst, rt, ctx := benchRuntime(b)
	exec := func(id, script string) {
		b.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			b.Fatalf("%s in %s: %+v, %v", script, id, r, err)
		}
	}
	var cold, pause, resume []time.Duration
	var state uint64
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("b-%d", i)
		spec := runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 512, Network: true}
		t0 := time.Now()
		if _, err := rt.Start(ctx, spec); err != nil {
			b.Fatal(err)
		}
		exec(id, "true")
		cold = append(cold, time.Since(t0))

		exec(id, "dd if=/dev/urandom of=/root/fill bs=1M count=128 2>/dev/null")
		dir := filepath.Join(h.scratch, "pool", "snapshots", id)
		t0 = time.Now()
		meta, err := rt.Pause(ctx, id, dir)
		if err != nil {
			b.Fatal(err)
		}
		pause = append(pause, time.Since(t0))
		state = meta.StateBytes
		// As a node does after a pause (agent/pause.go), outside the
		// timings: the paused Instance goes, and its address is free for
		// the resume.
		if err := rt.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}

		restored := spec
		restored.InstanceID, restored.Restore = id+"-r", &runtime.RestoreSpec{Dir: dir}
		t0 = time.Now()
		if _, err := rt.Start(ctx, restored); err != nil {
			b.Fatal(err)
		}
		exec(restored.InstanceID, "true")
		resume = append(resume, time.Since(t0))

		b.StopTimer()
		if err := rt.Delete(ctx, restored.InstanceID); err != nil {
			b.Fatal(err)
		}
		os.RemoveAll(dir)
		b.StartTimer()
	}
	c, p, r := median(cold), median(pause), median(resume)
	b.ReportMetric(c, "cold-ms")
	b.ReportMetric(p, "pause-ms")
	b.ReportMetric(r, "resume-ms")
	b.ReportMetric(r/c, "resume/cold")
	b.ReportMetric(float64(state)/(1<<20), "state-MiB")
}

// median of durations, in ms.
func median(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2]) / float64(time.Millisecond)
}

// benchRuntime is a node runtime of its own for a VM benchmark, with the
// Platform fixture and a context for the whole run.
func benchRuntime(b *testing.B) (*harness, *platform.Installation, *runtime.Runtime, context.Context) {
	h := newHarness(b)
	inst := platformFixture(b)
	rt, err := runtime.Open(testCtx(b, time.Minute), h.config())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rt.Close() })
	return h, inst, rt, testCtx(b, 30*time.Minute)
}
