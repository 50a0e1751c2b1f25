package runtime_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
)

// An upgraded node keeps driving an Instance started on an earlier
// Platform only when that Platform is whole and of a release it drives;
// otherwise the Instance is FAILED with the seed's error, its VMM keeps
// running, and a node that can drive it again takes it over unharmed.
func TestTakeoverWithEarlierInstallation(t *testing.T) {
	h := newHarness(t)
	// Its agent is release 0.3.2 (the manifest field is not part of the
	// content id).
	inst := copyPlatform(t, h, "0.3.2")
	dir := inst.Dir
	ctx := testCtx(t, 3*time.Minute)
	const id = "older"
	open := func(own, release string) *runtime.Runtime {
		t.Helper()
		cfg := h.config()
		cfg.OwnInstallation, cfg.Release = own, &release
		rt, err := runtime.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return rt
	}
	rt := open(inst.ID, "0.3.2")
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 64}); err != nil {
		t.Fatal(err)
	}
	if r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo before > /tmp/mark"}}, nil); err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("mark: %+v %v", r, err)
	}
	rt.Close()
	unit := runtime.UnitPrefix + id + ".service"
	check := func(rt *runtime.Runtime, want runtime.State, why string) {
		t.Helper()
		st, err := rt.Status(id)
		if err != nil || st.State != want || !strings.Contains(st.Error, why) {
			t.Fatalf("after takeover: %+v %v; want %s with %q", st, err, want, why)
		}
		if u, err := h.m.Get(ctx, unit); err != nil || !u.Active() {
			t.Fatalf("VMM unit %s: %+v %v; want it running on", unit, u, err)
		}
		rt.Close()
	}

	// 0.4.0 drives the previous MINOR's agent.
	check(open("sha256-other", "0.4.0"), runtime.StateRunning, "")
	// 0.5.0 does not: FAILED, the VMM untouched, the start-up log says why.
	check(open("sha256-other", "0.5.0"), runtime.StateFailed, "outside what this build (0.5.0) drives: its own Platform, earlier releases of 0.5 and releases of the previous MINOR: "+runtime.ErrInstallationUnavailable)
	if !strings.Contains(h.logs.String(), "earlier runtime installation cannot be retained") {
		t.Error("no 'earlier runtime installation cannot be retained' in the log")
	}
	// Nor an unreleased build another build's Platform.
	check(open("sha256-other", ""), runtime.StateFailed, "an unreleased build drives only its own Platform")
	// A file changed on disk (same size): the digests no longer match,
	// even for the node's own Platform.
	initrd := filepath.Join(dir, platform.InitrdFile)
	orig, _ := os.ReadFile(initrd)
	changed := append([]byte(nil), orig...)
	changed[len(changed)/2] ^= 0xff
	os.WriteFile(initrd, changed, 0o644)
	check(open(inst.ID, "0.3.2"), runtime.StateFailed, "recover instance process: runtime installation "+inst.ID+": platform "+inst.ID+": "+platform.InitrdFile+" has sha256")

	// Made whole again: taken over, the guest never noticed.
	os.WriteFile(initrd, orig, 0o644)
	rt = open(inst.ID, "0.3.2")
	defer rt.Close()
	if st, _ := rt.Status(id); st.State != runtime.StateRunning {
		t.Fatalf("whole again: %+v", st)
	}
	testenv.WaitFor(t, 30*time.Second, "guest session", func() (bool, string) {
		st, _ := rt.Status(id)
		return st.GuestResponding, "state " + string(st.State)
	})
	if r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/cat", "/tmp/mark"}}, nil); err != nil || r.stdout != "before\n" {
		t.Fatalf("after the takeovers: %+v %v", r, err)
	}
	if err := rt.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// copyPlatform copies the Platform fixture into the harness's
// installations (so a file of it can be changed without touching the
// shared fixture), its agent's release set to release when not "".
func copyPlatform(t *testing.T, h *harness, release string) *platform.Installation {
	t.Helper()
	fixture := platformFixture(t)
	dir := filepath.Join(h.root, "installations", fixture.ID)
	os.MkdirAll(filepath.Dir(dir), 0o755)
	if out, err := exec.Command("cp", "-a", fixture.Dir, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the Platform: %v %s", err, out)
	}
	if release != "" {
		manifest := filepath.Join(dir, platform.ManifestFile)
		raw, _ := os.ReadFile(manifest)
		var m map[string]any
		json.Unmarshal(raw, &m)
		m["agent_release"] = release
		raw, _ = json.Marshal(m)
		if err := os.WriteFile(manifest, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inst, err := platform.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}
