package runtime_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/template"
)

// busyboxTemplate builds a template of busybox with the given applets and
// etc/kibotos-template holding "coding".
func busyboxTemplate(ctx context.Context, t testing.TB, h *harness, applets ...string) *template.Template {
	t.Helper()
	tree := filepath.Join(h.scratch, "tree")
	for _, d := range []string{"bin", "etc", "tmp"} {
		os.MkdirAll(filepath.Join(tree, d), 0o755)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox for the template: %v (Debian package busybox-static)", err)
	}
	os.WriteFile(filepath.Join(tree, "bin", "busybox"), bb, 0o755)
	for _, a := range applets {
		os.Symlink("busybox", filepath.Join(tree, "bin", a))
	}
	os.WriteFile(filepath.Join(tree, "etc", "kibotos-template"), []byte("coding\n"), 0o644)
	tpl, err := template.Build(ctx, template.Options{StorageRoot: filepath.Join(h.scratch, "tpl"), Name: "kibotos-coding", FromDir: tree})
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// A Workspace root filesystem: the template image is the read-only base of
// a retained qcow2 layer; what the guest writes stays in the layer across a
// new Instance, and the template image never changes. A Volume rides along:
// found by its serial like the layer, grown while running (QMP
// block_resize, then the agent's grow-fs) and while stopped (x-grow at
// the next mount), its data kept across Instances.
func TestTemplateRootAndRetainedLayer(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 3*time.Minute)

	tpl := busyboxTemplate(ctx, t, h, "sh", "cat", "sync")
	before := fileSum(t, tpl.Image())
	layer := filepath.Join(h.scratch, "layers", "ws-1.qcow2")
	volPool := filepath.Join(h.scratch, "volumes")
	vol := runtime.VolumeDisk{Serial: "vol-1", Path: filepath.Join(volPool, "data", "vol-1.img")}
	if err := storagepool.CreateVolume(ctx, "node-a", vol.Path, 32<<20); err != nil {
		t.Fatal(err)
	}

	boot := func(id string) *guestproto.Client {
		t.Helper()
		spec := runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, RootImage: tpl.Image(), LayerPath: layer,
			Volumes: []runtime.VolumeDisk{vol}}
		if _, err := rt.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
		c, err := rt.Guest(id)
		if err != nil {
			t.Fatal(err)
		}
		if !c.Info().Has(guestproto.CapMountSerial) || !c.Info().Has(guestproto.CapGrowFS) {
			t.Fatalf("guest capabilities %v", c.Info().Capabilities)
		}
		if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{
			{Source: "serial:" + runtime.LayerSerial, Target: "/rootfs", FSType: "ext4"},
			{Source: "serial:" + vol.Serial, Target: "/rootfs/data", FSType: "ext4", Options: []string{guestproto.MountOptGrow}},
		}}); err != nil {
			t.Fatalf("mount the layer and the volume: %v", err)
		}
		return c
	}
	// dfKiB is the size busybox df gives the volume in the guest.
	dfKiB := func(id string) int {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "df -k /rootfs/data | tail -n 1"}}, nil)
		f := strings.Fields(r.stdout)
		if err != nil || r.exit.ExitCode != 0 || len(f) < 2 {
			t.Fatalf("df in the guest: %+v, %v", r, err)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("df in the guest: %q", r.stdout)
		}
		return n
	}
	inRoot := func(id, script string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: "/rootfs", Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s in the Workspace root: %+v, %v", script, r, err)
		}
		return r.stdout
	}

	c := boot("ws-1-a")
	if got := inRoot("ws-1-a", "cat /etc/kibotos-template"); got != "coding\n" {
		t.Fatalf("template file in the root: %q", got)
	}
	inRoot("ws-1-a", "echo kept > /tmp/data.txt && echo on-volume > /data/v.txt && sync")
	if st, _ := rt.Status("ws-1-a"); len(st.Volumes) != 1 || st.Volumes[0] != vol {
		t.Errorf("status volumes %+v, want %+v", st.Volumes, vol)
	}

	// Grown while running: block_resize, then grow-fs waits for the
	// guest kernel to see the new capacity and grows the filesystem.
	dfBefore := dfKiB("ws-1-a")
	t0 := time.Now()
	if err := rt.BlockResize(ctx, "ws-1-a", vol.Serial, 64<<20); err != nil {
		t.Fatal(err)
	}
	tResize := time.Since(t0)
	res, err := c.GrowFS(ctx, guestproto.GrowFSRequest{Path: "/rootfs/data", MinBytes: 64 << 20})
	if err != nil || res.DeviceBytes != 64<<20 || res.FilesystemBytes != 64<<20 {
		t.Fatalf("grow-fs after block_resize: %+v, %v", res, err)
	}
	dfRunning := dfKiB("ws-1-a")
	t.Logf("volume grown while running: block_resize %v, grow-fs %v more; df %d KiB -> %d KiB",
		tResize.Round(time.Millisecond), (time.Since(t0) - tResize).Round(time.Millisecond), dfBefore, dfRunning)
	// ext4 spends some of the 32 MiB added on inode tables and bitmaps.
	if dfRunning < dfBefore+26<<10 {
		t.Errorf("df after growing 32 MiB -> 64 MiB: %d KiB -> %d KiB", dfBefore, dfRunning)
	}
	if res, err := c.GrowFS(ctx, guestproto.GrowFSRequest{Path: "/rootfs/data"}); err != nil || res.FilesystemBytes != 64<<20 {
		t.Errorf("grow-fs again: %+v, %v; want nothing to do", res, err)
	}
	for _, bad := range []struct {
		serial string
		size   uint64
		want   string
	}{
		{"vol-9", 64 << 20, "runtime: instance ws-1-a: resize volume vol-9: the Instance was not launched with it"},
		{vol.Serial, 32 << 20, "Volumes only grow"},
	} {
		if err := rt.BlockResize(ctx, "ws-1-a", bad.serial, bad.size); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("BlockResize %s to %d: %v; want %q", bad.serial, bad.size, err, bad.want)
		}
	}
	if err := rt.Delete(ctx, "ws-1-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("retained layer after the Instance was deleted: %v", err)
	}

	// Grown while stopped: the file alone; x-grow grows the filesystem
	// at the next mount.
	if err := os.Truncate(vol.Path, 96<<20); err != nil {
		t.Fatal(err)
	}
	boot("ws-1-b")
	if got := inRoot("ws-1-b", "cat /tmp/data.txt /etc/kibotos-template /data/v.txt"); got != "kept\ncoding\non-volume\n" {
		t.Fatalf("after a new Instance on the same layer and volume: %q; want the data written before", got)
	}
	if df := dfKiB("ws-1-b"); df < dfRunning+26<<10 {
		t.Errorf("df after growing the stopped volume to 96 MiB: %d KiB, was %d KiB at 64 MiB", df, dfRunning)
	} else {
		t.Logf("volume grown while stopped: df %d KiB after x-grow", df)
	}

	// check-maintenance: refused while a node holds the runtime; with it
	// stopped, an upgrade may go ahead (the record matches its unit), a
	// remove may not (an Instance runs, a layer and a Volume are held).
	pool := filepath.Join(h.scratch, "layers")
	mcfg := h.config()
	mcfg.Pools = []runtime.PoolDir{{ID: "p1", Path: h.scratch}} // its layers/ holds ws-1.qcow2, volumes/data vol-1.img
	if _, err := runtime.CheckMaintenance(ctx, mcfg, runtime.OpUpgrade); !errors.Is(err, runtime.ErrRuntimeInUse) {
		t.Fatalf("check-maintenance with the node running: %v", err)
	}
	rt.Close()
	maintenance := func(op string) (bool, string) {
		t.Helper()
		rep, err := runtime.CheckMaintenance(ctx, mcfg, op)
		if err != nil {
			t.Fatalf("check-maintenance %s: %v", op, err)
		}
		var blocking []string
		for _, it := range rep.Items {
			if it.Blocking {
				blocking = append(blocking, it.Object+": "+it.Detail)
			}
		}
		return rep.OK, strings.Join(blocking, "\n")
	}
	if ok, why := maintenance(runtime.OpUpgrade); !ok {
		t.Errorf("upgrade with a running Instance whose record matches: blocked by\n%s", why)
	}
	// A pinned namespace of an Instance without a record: nobody owns it.
	ghost := filepath.Join(h.sd.NetNSDir, runtime.NetNSName("ghost"))
	if err := os.WriteFile(ghost, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, why := maintenance(runtime.OpUpgrade); ok || !strings.Contains(why, "kibotos-ghost: network namespace of an Instance without a launch record") {
		t.Errorf("upgrade with a namespace nobody owns: ok=%v, blocked by\n%s", ok, why)
	}
	os.Remove(ghost)
	if ok, why := maintenance(runtime.OpRemove); ok || !strings.Contains(why, "node Instance ws-1-b is active or requires cleanup") ||
		!strings.Contains(why, "ws-1.qcow2: writable layer in pool p1") || !strings.Contains(why, "vol-1.img: Volume file in pool p1") {
		t.Errorf("remove with a running Instance, a held layer and a held Volume: ok=%v, blocked by\n%s", ok, why)
	}

	// The node restarts while the pools are gone (filesystems not mounted
	// yet): after waiting for them, the Instance is not taken over but
	// FAILED, its VMM left running: at the retained-layer stage while the
	// layer's pool is missing, at the volume stage once only the Volume's
	// is. Once the pools are back, a forced stop ends it.
	for _, p := range []string{pool, volPool} {
		if err := os.Rename(p, p+".away"); err != nil {
			t.Fatal(err)
		}
	}
	cfg := h.config()
	cfg.Pools, cfg.PoolOpenWait = []runtime.PoolDir{{ID: "p1", Path: pool}, {ID: "p2", Path: volPool}}, time.Second
	takeOver := func(wantErr string) {
		t.Helper()
		rt, err = runtime.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		st, err := rt.Status("ws-1-b")
		if err != nil || st.State != runtime.StateFailed || !strings.HasPrefix(st.Error, wantErr) {
			t.Fatalf("taken over without its pools: %+v %v; want an error beginning %q", st, err, wantErr)
		}
		if vms := h.activeVMMs(t); len(vms) != 1 {
			t.Fatalf("VMM units after the failed takeover: %v, want ws-1-b's still running", vms)
		}
		// The product documentation's log line, with the Instance and why.
		found := false
		for _, e := range h.logs.entries("instance takeover failed") {
			if e["instance_id"] == "ws-1-b" && e["level"] == "ERROR" && strings.HasPrefix(fmt.Sprint(e["err"]), wantErr) {
				found = true
			}
		}
		if !found {
			t.Errorf("no ERROR entry instance takeover failed for ws-1-b beginning %q", wantErr)
		}
	}
	takeOver("PREPARING_RETAINED_LAYER: storage pool is unavailable: pool p1")
	if e := h.logs.entries("storage pool not opened for takeover"); len(e) != 2 {
		t.Errorf("log entries %v; want one per pool", e)
	}
	rt.Close()
	if err := os.Rename(pool+".away", pool); err != nil {
		t.Fatal(err)
	}
	takeOver("ATTACHING_VOLUME: storage pool is unavailable: pool p2")
	if err := os.Rename(volPool+".away", volPool); err != nil {
		t.Fatal(err)
	}
	// Not taken over, so the node checks ownership before it stops the
	// service: a launch record that no longer names the process the node
	// recorded (edited, or another's) stops nothing.
	recPath := filepath.Join(h.root, "runtime", "instances", "ws-1-b", runtime.LaunchRecordFile)
	orig, err := os.ReadFile(recPath)
	if err != nil {
		t.Fatal(err)
	}
	var other map[string]any
	if err := json.Unmarshal(orig, &other); err != nil {
		t.Fatal(err)
	}
	other["process"].(map[string]any)["start_time"] = other["process"].(map[string]any)["start_time"].(float64) + 1
	edited, _ := json.Marshal(other)
	if err := os.WriteFile(recPath, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, "ws-1-b", 0); err == nil || !strings.Contains(err.Error(), "stop instance process this node did not take over: launch record "+recPath+" names process") {
		t.Fatalf("stop with a launch record that names another process: %v", err)
	}
	if vms := h.activeVMMs(t); len(vms) != 1 {
		t.Fatalf("VMM units after the refused stop: %v, want ws-1-b's still running", vms)
	}
	if err := os.WriteFile(recPath, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, "ws-1-b", 0); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, "ws-1-b"); err != nil {
		t.Fatal(err)
	}
	if vms := h.activeVMMs(t); len(vms) != 0 {
		t.Fatalf("VMM units after stop --force: %v", vms)
	}
	rt.Close()
	if ok, why := maintenance(runtime.OpRemove); ok || strings.Contains(why, "instance") || !strings.Contains(why, "ws-1.qcow2") || !strings.Contains(why, "vol-1.img") {
		t.Errorf("remove with only the layer and the Volume left: ok=%v, blocked by\n%s", ok, why)
	}
	for _, f := range []string{layer, vol.Path} {
		if err := os.Rename(f, filepath.Join(h.scratch, filepath.Base(f)+".kept")); err != nil {
			t.Fatal(err)
		}
	}
	if ok, why := maintenance(runtime.OpRemove); !ok {
		t.Errorf("remove with nothing left: blocked by\n%s", why)
	}
	if fileSum(t, tpl.Image()) != before {
		t.Fatal("the template image changed")
	}
}
