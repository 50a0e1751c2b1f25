package runtime_test

import (
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/template"
)

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
// new Instance, and the template image never changes.
func TestTemplateRootAndRetainedLayer(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 3*time.Minute)

	tree := filepath.Join(h.scratch, "tree")
	for _, d := range []string{"bin", "etc", "tmp"} {
		os.MkdirAll(filepath.Join(tree, d), 0o755)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("busybox for the template: %v (Debian package busybox-static)", err)
	}
	os.WriteFile(filepath.Join(tree, "bin", "busybox"), bb, 0o755)
	for _, a := range []string{"sh", "cat", "sync"} {
		os.Symlink("busybox", filepath.Join(tree, "bin", a))
	}
	os.WriteFile(filepath.Join(tree, "etc", "kibotos-template"), []byte("coding\n"), 0o644)
	tpl, err := template.Build(ctx, template.Options{StorageRoot: filepath.Join(h.scratch, "tpl"), Name: "kibotos-coding", FromDir: tree})
	if err != nil {
		t.Fatal(err)
	}
	before := fileSum(t, tpl.Image())
	layer := filepath.Join(h.scratch, "layers", "ws-1.qcow2")

	boot := func(id string) *guestproto.Client {
		t.Helper()
		if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, RootImage: tpl.Image(), LayerPath: layer}); err != nil {
			t.Fatal(err)
		}
		c, err := rt.Guest(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "/dev/vda", Target: "/rootfs", FSType: "ext4"}}}); err != nil {
			t.Fatalf("mount the layer: %v", err)
		}
		return c
	}
	inRoot := func(id, script string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: "/rootfs", Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s in the Workspace root: %+v, %v", script, r, err)
		}
		return r.stdout
	}

	boot("ws-1-a")
	if got := inRoot("ws-1-a", "cat /etc/kibotos-template"); got != "coding\n" {
		t.Fatalf("template file in the root: %q", got)
	}
	inRoot("ws-1-a", "echo kept > /tmp/data.txt && sync")
	if err := rt.Delete(ctx, "ws-1-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("retained layer after the Instance was deleted: %v", err)
	}

	boot("ws-1-b")
	if got := inRoot("ws-1-b", "cat /tmp/data.txt /etc/kibotos-template"); got != "kept\ncoding\n" {
		t.Fatalf("after a new Instance on the same layer: %q; want the data written before", got)
	}

	// check-maintenance: refused while a node holds the runtime; with it
	// stopped, an upgrade may go ahead (the record matches its unit), a
	// remove may not (an Instance runs, a layer is held).
	pool := filepath.Join(h.scratch, "layers")
	mcfg := h.config()
	mcfg.Pools = []runtime.PoolDir{{ID: "p1", Path: h.scratch}} // its layers/ holds ws-1.qcow2
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
	if ok, why := maintenance(runtime.OpRemove); ok || !strings.Contains(why, "node Instance ws-1-b is active or requires cleanup") || !strings.Contains(why, "ws-1.qcow2: writable layer in pool p1") {
		t.Errorf("remove with a running Instance and a held layer: ok=%v, blocked by\n%s", ok, why)
	}

	// The node restarts while the layer's pool is gone (a filesystem not
	// mounted yet): after waiting for it, the Instance is not taken over
	// but FAILED at the retained-layer stage, its VMM left running; once
	// the pool is back, a forced stop ends it.
	if err := os.Rename(pool, pool+".away"); err != nil {
		t.Fatal(err)
	}
	cfg := h.config()
	cfg.Pools, cfg.PoolOpenWait = []runtime.PoolDir{{ID: "p1", Path: pool}}, time.Second
	rt, err = runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	st, err := rt.Status("ws-1-b")
	if err != nil || st.State != runtime.StateFailed || !strings.HasPrefix(st.Error, "PREPARING_RETAINED_LAYER: storage pool is unavailable: pool p1") {
		t.Fatalf("taken over without its pool: %+v %v", st, err)
	}
	if vms := h.activeVMMs(t); len(vms) != 1 {
		t.Fatalf("VMM units after the failed takeover: %v, want ws-1-b's still running", vms)
	}
	if e := h.logs.entries("storage pool not opened for takeover"); len(e) != 1 || e[0]["pool"] != "p1" {
		t.Errorf("log entries %v", e)
	}
	if err := os.Rename(pool+".away", pool); err != nil {
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
	if ok, why := maintenance(runtime.OpRemove); ok || strings.Contains(why, "instance") || !strings.Contains(why, "ws-1.qcow2") {
		t.Errorf("remove with only the layer left: ok=%v, blocked by\n%s", ok, why)
	}
	if err := os.Rename(layer, layer+".kept"); err != nil {
		t.Fatal(err)
	}
	if ok, why := maintenance(runtime.OpRemove); !ok {
		t.Errorf("remove with nothing left: blocked by\n%s", why)
	}
	if fileSum(t, tpl.Image()) != before {
		t.Fatal("the template image changed")
	}
}
