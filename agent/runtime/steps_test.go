package runtime_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// stepTimes counts what Config.Observe was told, as the node's
// kibotos_node_step_seconds histogram counts its samples.
type stepTimes struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *stepTimes) observe(step string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n[step]++
}

func (s *stepTimes) take() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.n
	s.n = map[string]int{}
	return n
}

// A start times each step it ran; a start whose last step fails stops the
// VMM and removes the network it made, keeping only the Instance's
// directory and record for Delete.
func TestStartStepsTimedAndUndone(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	times := &stepTimes{n: map[string]int{}}
	cfg := h.config()
	cfg.Observe = times.observe
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	times.take() // the takeover

	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: "st-ok", Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 16, Network: true}); err != nil {
		t.Fatal(err)
	}
	got := times.take()
	want := []string{runtime.StepPrepareDirs, runtime.StepComposeLaunch, runtime.StepReserveNetwork, runtime.StepWriteRecord,
		runtime.StepCreateDisk, runtime.StepGrantFiles, runtime.StepCreateNetwork, runtime.StepLaunchUnit, runtime.StepIdentifyVMM,
		runtime.StepRecordProcess, runtime.StepAwaitGuest, runtime.StepTellGuest, runtime.StepFinish, runtime.StepBoot}
	for _, s := range want {
		if got[s] != 1 {
			t.Errorf("step %s timed %d times in a start with a disk and a network, want 1 (all: %v)", s, got[s], got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("steps timed %v, want exactly %v", got, want)
	}
	if err := rt.Delete(ctx, "st-ok"); err != nil {
		t.Fatal(err)
	}

	// tell-guest fails: the guest refuses the configure.
	const id = "st-bad"
	_, err = rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true,
		Configure: func(guestproto.GuestInfo) guestproto.ConfigureRequest {
			return guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "tmpfs", Target: "/mnt/x", FSType: "tmpfs", Options: []string{guestproto.MountOptGrow}}}}
		}})
	if err == nil || !strings.Contains(err.Error(), "configure the guest") {
		t.Fatalf("start whose configure the guest refuses: %v; want it to say the configure failed", err)
	}
	got = times.take()
	if got[runtime.StepAwaitGuest] != 1 || got[runtime.StepTellGuest] != 0 || got[runtime.StepBoot] != 0 {
		t.Errorf("steps timed in the failed start: %v; want await-guest and not the failed tell-guest nor boot", got)
	}
	st, err := rt.Status(id)
	if err != nil || st.State != runtime.StateFailed {
		t.Fatalf("after the failed start: %+v, %v; want FAILED", st, err)
	}
	if l := h.activeVMMs(t); len(l) != 0 {
		t.Errorf("VMM units after the failed start: %+v; want its unit stopped", l)
	}
	if _, err := os.Stat(filepath.Join(h.sd.NetNSDir, runtime.NetNSName(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("network namespace after the failed start: %v; want it removed", err)
	}
	if _, err := runtime.ReadLaunchRecord(filepath.Join(h.root, "runtime", "instances", id, runtime.LaunchRecordFile)); err != nil {
		t.Errorf("launch record after the failed start: %v; want it kept for Delete", err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}
