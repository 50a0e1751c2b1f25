package runtime_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/units"
)

// TestInstanceFailures boots one VM for two cases: a takeover that must be
// refused (tampered record, unit without record), then a VMM killed under
// the node.
func TestInstanceFailures(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	top := t // Runtimes opened in subtests live on: close them with the test
	const id = "vm-t"
	rt, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, MemoryMiB: 256, DiskMiB: 16})
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	// The node process ends; the VMM keeps running.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	recPath := filepath.Join(h.root, "runtime", "instances", id, runtime.LaunchRecordFile)

	t.Run("TakeoverRefusesTampered", func(t *testing.T) {
		orig, err := os.ReadFile(recPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, field := range []string{"exe_ino", "exe_dev", "start_time", "invocation_id"} {
			var rec map[string]any
			if err := json.Unmarshal(orig, &rec); err != nil {
				t.Fatal(err)
			}
			p := rec["process"].(map[string]any)
			if field == "invocation_id" {
				p[field] = strings.Repeat("0", 32)
			} else {
				p[field] = p[field].(float64) + 1
			}
			b, _ := json.Marshal(rec)
			if err := os.WriteFile(recPath, b, 0o600); err != nil {
				t.Fatal(err)
			}
			rt2, err := h.open(t)
			if err == nil {
				rt2.Close()
				t.Fatalf("Open with a record whose %s was changed succeeded", field)
			}
			if !strings.Contains(err.Error(), recPath) || !strings.Contains(err.Error(), st.Unit) {
				t.Errorf("Open with %s changed: %v; want an error naming %s and %s", field, err, recPath, st.Unit)
			}
			t.Logf("%s changed: %v", field, err)
		}
		if err := os.WriteFile(recPath, orig, 0o600); err != nil {
			t.Fatal(err)
		}

		const intruder = "kibotos-vmm-intruder.service"
		if _, err := h.m.StartVMM(ctx, units.Spec{Name: intruder, Argv: []string{"/bin/sleep", "300"}}); err != nil {
			t.Fatal(err)
		}
		rt2, err := h.open(t)
		if err == nil {
			rt2.Close()
			t.Fatal("Open with a kibotos-vmm unit without a record succeeded")
		}
		if !strings.Contains(err.Error(), intruder) {
			t.Errorf("Open with %s running: %v; want an error naming it", intruder, err)
		}
		t.Logf("intruder: %v", err)
		if err := h.m.Stop(ctx, intruder); err != nil {
			t.Fatal(err)
		}
		// Refused takeovers changed nothing: the VM is still the same run.
		u, err := h.m.Get(ctx, st.Unit)
		if err != nil || u.InvocationID != st.InvocationID || u.MainPID != st.MainPID {
			t.Errorf("unit after refused takeovers: %+v, %v; want invocation %s", u, err, st.InvocationID)
		}
	})

	// Record restored, intruder gone: the takeover succeeds.
	t0 := time.Now()
	rt = h.mustOpen(t)
	t.Logf("Open (takeover of 1 VM) took %v", time.Since(t0).Round(time.Microsecond))
	if got, _ := rt.Status(id); got.State != runtime.StateRunning || got.InvocationID != st.InvocationID || got.HostPID != st.HostPID {
		t.Fatalf("after takeover: %+v, want RUNNING with invocation %s", got, st.InvocationID)
	}
	r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo ok"}}, nil)
	if err != nil || r.stdout != "ok\n" {
		t.Fatalf("exec after takeover: %+v, %v", r, err)
	}
	t.Logf("Open → first exec answered after takeover: %v", time.Since(t0).Round(time.Millisecond))

	t.Run("TakeoverBeforeGuestAnswered", func(t *testing.T) {
		// A node that died between the unit start and the readiness check
		// left a record without a guest: the takeover waits for the guest.
		rt.Close()
		b, err := os.ReadFile(recPath)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		json.Unmarshal(b, &rec)
		delete(rec, "guest")
		b, _ = json.Marshal(rec)
		if err := os.WriteFile(recPath, b, 0o600); err != nil {
			t.Fatal(err)
		}
		rt = h.mustOpen(top)
		testenv.WaitFor(t, 30*time.Second, "RUNNING after the readiness check", func() (bool, string) {
			s, _ := rt.Status(id)
			return s.State == runtime.StateRunning, "state " + string(s.State)
		})
		if s, _ := rt.Status(id); s.InvocationID != st.InvocationID || s.Guest == nil || s.Guest.BootID == "" {
			t.Errorf("after the takeover: %+v", s)
		}
		if rec, err := runtime.ReadLaunchRecord(recPath); err != nil || rec.Guest == nil {
			t.Errorf("record after the readiness check: %+v, %v; want the guest recorded", rec, err)
		}
	})

	t.Run("VMMKilled", func(t *testing.T) {
		u, err := h.m.Get(ctx, st.Unit)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(st.HostPID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		took := testenv.WaitFor(t, 5*time.Second, "state FAILED", func() (bool, string) {
			s, _ := rt.Status(id)
			return s.State == runtime.StateFailed, "state " + string(s.State)
		})
		t.Logf("kill -9 of the VMM → FAILED in %v", took.Round(time.Millisecond))
		s, _ := rt.Status(id)
		if s.Error != runtime.ErrNoLongerRunning {
			t.Errorf("error %q, want %q", s.Error, runtime.ErrNoLongerRunning)
		}
		logs := filepath.Join(h.root, "machine-logs", id)
		if b, err := os.ReadFile(filepath.Join(logs, "console.log")); err != nil || !strings.Contains(string(b), platform.InitStartedLine) {
			t.Errorf("console tail in %s: %q, %v; want the guest's console", logs, b, err)
		}
		if _, err := os.Stat(filepath.Join(logs, "vmm.log")); err != nil {
			t.Errorf("VMM log tail: %v", err)
		}
		// The watcher logs the end right after it set FAILED.
		testenv.WaitFor(t, 5*time.Second, "the 'instance machine exited' log entry", func() (bool, string) {
			return len(h.logs.entries("instance machine exited")) > 0, ""
		})
		// Not a wait for something: three more rounds of the watcher (every
		// 500 ms), in which a second entry for the same end would show.
		time.Sleep(1500 * time.Millisecond)
		if e := h.logs.entries("instance machine exited"); len(e) != 1 || e[0]["instance_id"] != id || e[0]["unit"] != st.Unit || e[0]["exit"] == nil {
			t.Errorf("log entries 'instance machine exited': %v; want exactly one with instance_id, unit and exit", e)
		}
		if _, err := rt.Exec(ctx, id, guestproto.ExecRequest{Argv: []string{"/bin/true"}}); err == nil {
			t.Error("exec on a FAILED instance succeeded")
		}

		// A node restart keeps it FAILED, without a second log entry.
		rt.Close()
		rt = h.mustOpen(top)
		if s, _ := rt.Status(id); s.State != runtime.StateFailed || s.Error != runtime.ErrNoLongerRunning {
			t.Errorf("after a node restart: %+v, want FAILED with %q", s, runtime.ErrNoLongerRunning)
		}
		if e := h.logs.entries("instance machine exited"); len(e) != 1 {
			t.Errorf("%d 'instance machine exited' entries after a node restart, want still 1", len(e))
		}

		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		if e := h.logs.entries("instance machine exited"); len(e) != 1 || e[0]["level"] != "ERROR" {
			t.Errorf("'instance machine exited' entries after the delete: %v, want still the one error", e)
		}
		if _, err := os.Stat(h.m.CgroupPath(u)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s after Delete: %v", h.m.CgroupPath(u), err)
		}
		if _, err := os.Stat(filepath.Dir(recPath)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("instance directory after Delete: %v", err)
		}
		ended, err := runtime.ReadEndedRecord(filepath.Join(h.root, "runtime", "registry", id+".json"))
		if err != nil || ended.How != "machine exited" || ended.Error != runtime.ErrNoLongerRunning {
			t.Errorf("registry record: %+v, %v", ended, err)
		}
		if l := h.activeVMMs(t); len(l) != 0 {
			t.Errorf("VMM units after Delete: %+v", l)
		}
	})
}

// A VMM that exits as it starts (here: memory it cannot have) fails the
// start with QEMU's own words, not only that the guest never answered.
func TestStartSaysWhyTheVMMExited(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, time.Minute)
	rt := h.mustOpen(t)
	_, err := rt.Start(ctx, runtime.Spec{InstanceID: "vm-big", Installation: inst, VCPUs: 1, MemoryMiB: 1 << 30})
	if err == nil || !strings.Contains(err.Error(), "VMM log tail:") || !strings.Contains(err.Error(), "cannot set up guest memory") {
		t.Fatalf("start of a VMM that cannot have its memory: %v; want QEMU's reason from its log", err)
	}
	if err := rt.Delete(ctx, "vm-big"); err != nil {
		t.Fatal(err)
	}
}
