package runtime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Forks of a paused guest (kibo workspace create --from): one guest boots
// and pauses; two forks restore its snapshot from their own names of the
// state file, over their own overlays of its frozen layer, and each gets
// its own identity: machine id, boot_id and random bytes all differ. What
// a fork writes never reaches the source, which resumes from its own
// snapshot afterwards; the frozen base goes with the last layer over it.
func TestForkRestore(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 4*time.Minute)
	tpl := busyboxTemplate(ctx, t, h, "sh", "cat", "sync", "echo")
	pool := filepath.Join(h.scratch, "pool")
	layer := func(ws string) string { return filepath.Join(pool, "layers", ws+".qcow2") }
	snap := func(ws string) string { return filepath.Join(pool, "snapshots", ws) }
	os.MkdirAll(filepath.Join(pool, "layers"), 0o700)
	spec := func(id, ws string) runtime.Spec {
		return runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true, RootImage: tpl.Image(), LayerPath: layer(ws)}
	}
	sh := func(id, root, script string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Root: root, Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s in %s: %+v, %v", script, id, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	count := func(id string) int { n, _ := strconv.Atoi(sh(id, "", "cat /tmp/count")); return n }

	if _, err := rt.Start(ctx, spec("src-1", "ws-src")); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Guest("src-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Hostname: "ws-src", Mounts: []guestproto.Mount{{Source: "serial:" + runtime.LayerSerial, Target: "/rootfs", FSType: "ext4"}}}); err != nil {
		t.Fatal(err)
	}
	sh("src-1", "/rootfs", "echo source > /data.txt && sync")
	sh("src-1", "", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &")
	testenv.WaitFor(t, 20*time.Second, "src-1's counter to reach 3", func() (bool, string) {
		n := count("src-1")
		return n >= 3, fmt.Sprintf("count %d", n)
	})
	if _, err := rt.Pause(ctx, "src-1", snap("ws-src")); err != nil {
		t.Fatal(err)
	}
	if err := rt.Delete(ctx, "src-1"); err != nil {
		t.Fatal(err)
	}

	type ident struct{ machineID, bootID, random string }
	forks := map[string]ident{}
	for _, ws := range []string{"ws-f1", "ws-f2"} {
		t0 := time.Now()
		f := runtime.ForkFiles{Source: "ws-src", Fork: ws, SourceInstance: "src-1", SourceLayer: layer("ws-src"), SourceSnapshot: snap("ws-src"),
			Layer: layer(ws), Snapshot: snap(ws)}
		if err := runtime.PrepareFork(ctx, "node-a", f); err != nil {
			t.Fatal(err)
		}
		tPrep := time.Since(t0)
		s := spec(ws+"-1", ws)
		s.Restore = &runtime.RestoreSpec{Dir: snap(ws)}
		s.Identity = &runtime.Identity{Hostname: ws, Roots: []string{"/rootfs"}}
		if _, err := rt.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Logf("TIMING fork %s: files %s, restored and answering %s", ws, tPrep.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		os.RemoveAll(snap(ws)) // spent, as the node removes it
		id := ws + "-1"
		if got := sh(id, "/rootfs", "cat /data.txt"); got != "source" {
			t.Errorf("%s: the source's file holds %q", ws, got)
		}
		if got := sh(id, "", "cat /proc/sys/kernel/hostname"); got != ws {
			t.Errorf("%s: hostname %q", ws, got)
		}
		before := count(id)
		testenv.WaitFor(t, 20*time.Second, id+"'s counter to count on", func() (bool, string) {
			n := count(id)
			return n > before, fmt.Sprintf("count %d, %d before", n, before)
		})
		forks[ws] = ident{
			machineID: sh(id, "/rootfs", "cat /etc/machine-id"),
			bootID:    sh(id, "", "cat /proc/sys/kernel/random/boot_id"),
			random:    sh(id, "", "head -c 16 /dev/urandom | od -An -tx1"),
		}
		sh(id, "/rootfs", "echo "+ws+" > /data.txt && sync")
	}
	f1, f2 := forks["ws-f1"], forks["ws-f2"]
	t.Logf("forks: %+v", forks)
	if len(f1.machineID) != 32 || f1.machineID == f2.machineID {
		t.Errorf("machine ids %q and %q: want two different ones", f1.machineID, f2.machineID)
	}
	if f1.bootID == "" || f1.bootID == f2.bootID {
		t.Errorf("boot_ids %q and %q: want two different ones", f1.bootID, f2.bootID)
	}
	if f1.random == f2.random {
		t.Errorf("both forks read %s first from /dev/urandom", f1.random)
	}
	for _, ws := range []string{"ws-f1", "ws-f2"} {
		if got := sh(ws+"-1", "/rootfs", "cat /data.txt"); got != ws {
			t.Errorf("%s reads back %q", ws, got)
		}
	}

	// The forks go; the source's base stays while the source is over it.
	bases := filepath.Join(pool, "bases")
	for _, ws := range []string{"ws-f1", "ws-f2"} {
		if err := rt.Delete(ctx, ws+"-1"); err != nil {
			t.Fatal(err)
		}
		if err := runtime.RemoveLayer(layer(ws), ws); err != nil {
			t.Fatal(err)
		}
	}
	if got := dirEntries(t, bases); strings.Join(got, " ") != "ws-src@src-1.qcow2 ws-src@src-1.qcow2.refs" {
		t.Errorf("bases after the forks went: %v", got)
	}

	// The source resumes from its own snapshot: its file as it left it.
	s := spec("src-2", "ws-src")
	s.Restore = &runtime.RestoreSpec{Dir: snap("ws-src")}
	if _, err := rt.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	if got := sh("src-2", "/rootfs", "cat /data.txt"); got != "source" {
		t.Errorf("the source after its forks wrote: %q", got)
	}
	before := count("src-2")
	testenv.WaitFor(t, 20*time.Second, "src-2's counter to count on", func() (bool, string) {
		n := count("src-2")
		return n > before, fmt.Sprintf("count %d, %d before", n, before)
	})
	sh("src-2", "/rootfs", "echo resumed > /data.txt && sync")
	if err := rt.Delete(ctx, "src-2"); err != nil {
		t.Fatal(err)
	}
	if err := runtime.RemoveLayer(layer("ws-src"), "ws-src"); err != nil {
		t.Fatal(err)
	}
	if got := dirEntries(t, bases); len(got) != 0 {
		t.Errorf("bases after every layer went: %v", got)
	}
}
