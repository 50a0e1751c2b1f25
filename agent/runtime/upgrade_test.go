package runtime_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
)

// check-upgrade with a real guest: --preview beside the live node (a
// start in progress is pending, a running Instance judged from its
// record), the full check once it stopped (the guest asked through its
// own VMM), one fixture per criterion each naming its blocked line, and
// not a byte of the storage root changed by any of it.
func TestCheckUpgrade(t *testing.T) {
	h := newHarness(t)
	inst := copyPlatform(t, h, "")
	own := inst.Dir
	ctx := testCtx(t, 4*time.Minute)
	cfg := h.config()
	cfg.OwnInstallation = inst.ID
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	target := runtime.UpgradeTarget{RuntimeDir: own, AgentSHA256: inst.AgentSHA256, Executables: runtime.DefaultExecutables,
		MinProtocol: guestproto.MinProtocolVersion, MaxProtocol: guestproto.ProtocolVersion, Capabilities: guestproto.Capabilities}
	check := func(tg runtime.UpgradeTarget) (*runtime.UpgradeReport, string) {
		t.Helper()
		rep, err := runtime.CheckUpgrade(ctx, cfg, tg)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, it := range rep.Items {
			lines = append(lines, it.Verdict+": "+it.Object+": "+it.Detail)
		}
		return rep, strings.Join(lines, "\n")
	}
	preview := target
	preview.Preview = true

	// While the guest boots, the preview says the Instance is pending.
	const id = "upg"
	started := make(chan error, 1)
	go func() {
		_, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 64, Network: true})
		started <- err
	}()
	testenv.WaitFor(t, 60*time.Second, "a pending line for the starting Instance", func() (bool, string) {
		rep, report := check(preview)
		return rep.OK && strings.Contains(report, "pending: instance "+id+": starting"), fmt.Sprintf("ok %v, report:\n%s", rep.OK, report)
	})
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	if rep, report := check(preview); !rep.OK || !strings.Contains(report, "ok: instance "+id+": taken over: guest protocol 1") {
		t.Fatalf("preview of a running Instance:\n%s", report)
	}
	if _, err := runtime.CheckUpgrade(ctx, cfg, target); !errors.Is(err, runtime.ErrRuntimeInUse) {
		t.Fatalf("the full check beside a live node: %v", err)
	}
	rt.Close()

	before := testenv.TreeDigest(t, h.root)
	rep, report := check(target)
	if !rep.OK || !strings.Contains(report, "ok: instance "+id+": taken over: guest protocol 1") ||
		!strings.Contains(report, "ok: runtime directory "+own+": platform "+inst.ID) || !strings.Contains(report, "ok: executable qemu-img") {
		t.Fatalf("clean check:\n%s", report)
	}
	if rep, report := check(preview); !rep.OK || strings.Contains(report, "blocked") {
		t.Fatalf("clean preview:\n%s", report)
	}
	if _, err := runtime.CheckMaintenance(ctx, cfg, runtime.OpUpgrade); err != nil {
		t.Fatal(err)
	}
	if after := testenv.TreeDigest(t, h.root); after != before {
		t.Fatal("check-upgrade, its preview or check-maintenance changed the storage root")
	}

	// One fixture per criterion: each made, checked (full and, where it
	// judges it, preview) and undone.
	instDir := filepath.Join(h.root, "runtime", "instances", id)
	record := filepath.Join(instDir, runtime.LaunchRecordFile)
	recRaw, _ := os.ReadFile(record)
	initrd := filepath.Join(own, platform.InitrdFile)
	initrdRaw, _ := os.ReadFile(initrd)
	ended := filepath.Join(h.root, "runtime", "registry", "old-1.json")
	for _, c := range []struct {
		name    string
		make    func(tg *runtime.UpgradeTarget)
		undo    func()
		want    string
		preview bool // the preview judges it too
	}{
		{"guest protocol out of range", func(tg *runtime.UpgradeTarget) {
			tg.MinProtocol, tg.MaxProtocol = guestproto.ProtocolVersion+1, guestproto.ProtocolVersion+1
		}, func() {}, "blocked: instance " + id + ": guest protocol", true},
		{"missing runtime executable", func(tg *runtime.UpgradeTarget) {
			tg.Executables = append(tg.Executables, "kibotos-no-such-vmm")
		}, func() {}, "blocked: executable kibotos-no-such-vmm: not found on PATH", true},
		{"installation digest mismatch", func(*runtime.UpgradeTarget) {
			b := append([]byte(nil), initrdRaw...)
			b[len(b)/3] ^= 0xff
			os.WriteFile(initrd, b, 0o644)
		}, func() { os.WriteFile(initrd, initrdRaw, 0o644) }, "blocked: instance " + id + ": runtime installation " + inst.ID + " cannot be kept: platform " + inst.ID + ": " + platform.InitrdFile + " has sha256", true},
		{"runtime directory of another build", func(tg *runtime.UpgradeTarget) { tg.AgentSHA256 = "0123456789abcdef" },
			func() {}, "blocked: runtime directory " + own + ": platform " + inst.ID + " carries guest agent sha256", true},
		{"wrong format version", func(*runtime.UpgradeTarget) {
			os.MkdirAll(filepath.Dir(ended), 0o700)
			os.WriteFile(ended, []byte(`{"format_version": 9, "instance_id": "old-1"}`), 0o600)
		}, func() { os.Remove(ended) }, "blocked: ended record old-1.json: ended-instance record " + ended + " has version 9, this build reads [1]", true},
		{"corrupt record", func(*runtime.UpgradeTarget) {
			os.MkdirAll(filepath.Dir(ended), 0o700)
			os.WriteFile(ended, []byte(`{"format_ver`), 0o600)
		}, func() { os.Remove(ended) }, "blocked: ended record old-1.json: unreadable", true},
		{"record mismatch", func(*runtime.UpgradeTarget) {
			var rec map[string]any
			json.Unmarshal(recRaw, &rec)
			rec["process"].(map[string]any)["start_time"] = 1
			b, _ := json.Marshal(rec)
			os.WriteFile(record, b, 0o600)
		}, func() { os.WriteFile(record, recRaw, 0o600) }, "does not match unit " + runtime.UnitPrefix + id + ".service: process start time", false},
		{"leftover directory", func(*runtime.UpgradeTarget) {
			os.MkdirAll(filepath.Join(h.root, "runtime", "instances", "ghost"), 0o700)
		},
			func() { os.Remove(filepath.Join(h.root, "runtime", "instances", "ghost")) }, "instances/ghost: leftover: instance directory without a launch record", false},
		{"unowned network namespace", func(*runtime.UpgradeTarget) {
			os.WriteFile(filepath.Join(h.sd.NetNSDir, runtime.NetNSName("ghost")), nil, 0o600)
		}, func() { os.Remove(filepath.Join(h.sd.NetNSDir, runtime.NetNSName("ghost"))) }, runtime.NetNSName("ghost") + ": leftover: network namespace of an Instance without a launch record", false},
	} {
		tg := target
		c.make(&tg)
		rep, report := check(tg)
		if rep.OK || !strings.Contains(report, c.want) {
			t.Errorf("%s: ok=%v, want a line with %q in\n%s", c.name, rep.OK, c.want, report)
		}
		if c.preview {
			pv := tg
			pv.Preview = true
			if rep, report := check(pv); rep.OK || !strings.Contains(report, c.want) {
				t.Errorf("%s, preview: ok=%v, want a line with %q in\n%s", c.name, rep.OK, c.want, report)
			}
		}
		c.undo()
	}

	rt, err = runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if st, _ := rt.Status(id); st.State != runtime.StateRunning {
		t.Fatalf("taken over after the checks: %+v", st)
	}
	if err := rt.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}
