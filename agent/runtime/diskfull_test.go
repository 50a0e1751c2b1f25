package runtime_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A guest whose write finds its layer's pool full waits, its write held,
// and goes on by itself once the pool has room again: the write completes
// and nothing in the guest saw an error. The node says both.
func TestGuestStoppedByAFullPoolGoesOn(t *testing.T) {
	requireVMHost(t)
	// Mounted before the harness's private systemd starts: the VMMs see
	// the mounts of the moment it started.
	pool := filepath.Join(shortTempDir(t), "pool")
	testenv.SmallFS(t, pool, 256)
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 4*time.Minute)
	tpl := busyboxTemplate(ctx, t, h, "sh")
	id := "ws-full-a"
	spec := runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, RootImage: tpl.Image(), LayerPath: filepath.Join(pool, "layers", "ws-full.qcow2")}
	if _, err := rt.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Guest(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "serial:" + runtime.LayerSerial, Target: "/rootfs", FSType: "ext4"}}}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Fill(pool); err != nil {
		t.Fatal(err)
	}
	// 16 MiB the layer has no clusters for yet.
	done := make(chan result, 1)
	go func() {
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "dd if=/dev/zero of=/rootfs/big bs=1M count=16 2>/dev/null && sync && wc -c < /rootfs/big"}}, nil)
		if err != nil {
			r.stderr += err.Error()
		}
		done <- r
	}()
	stopped := func() bool {
		return len(h.logs.entries("guest stopped: a pool its disks are in is full; it goes on once the pool has room")) > 0
	}
	if !testenv.Poll(t, time.Minute, stopped) {
		t.Fatal("the node never said the guest waits for room in its pool")
	}
	select {
	case r := <-done:
		t.Fatalf("the write finished in a full pool: %+v", r)
	default:
	}
	if err := testenv.Unfill(pool); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.exit.ExitCode != 0 || r.stdout != "16777216\n" {
			t.Fatalf("the write once the pool had room: %+v, want 16777216 bytes written", r)
		}
	case <-time.After(time.Minute):
		t.Fatal("the guest did not go on within a minute of the pool having room")
	}
	if len(h.logs.entries("guest goes on: its pools have room again")) != 1 {
		t.Errorf("the node did not say once that the guest goes on:\n%s", h.logs.String())
	}
}

// shortTempDir is a temporary directory with a short path, removed with
// the test.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/tmp", "kbf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
