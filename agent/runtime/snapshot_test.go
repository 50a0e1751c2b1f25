package runtime_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// TestPauseRestore: a paused guest comes back as it was: the same boot
// (boot_id), a process counting on and a file it holds open, its clock
// set right, its network address that of the new Instance (its own again,
// not configured anew, when that is free); the snapshot
// is checked before it is restored (a flipped byte refuses it); a VMM
// killed during the pause leaves no snapshot behind.
func TestPauseRestore(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	var killPID int
	cfg := runtime.BeforeSave(h.config(), func(pid int) {
		if killPID == -1 {
			killPID = pid
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	rt, err := runtime.Open(testCtx(t, time.Minute), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	ctx := testCtx(t, 4*time.Minute)
	spec := func(id string) runtime.Spec {
		return runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true}
	}
	sh := func(id, script string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", script}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("%s in %s: %+v, %v", script, id, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	// The Workspace's environment, told at start, reaches an exec with a
	// Root ("/": the agent's own root is one too) and not the agent's
	// own; the restored guest's agent still holds it.
	wsEnv := func(id string, root string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo \"$WS_TOKEN\""}, Root: root, Env: []string{"PATH=/bin:/sbin"}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("env in %s: %+v, %v", id, r, err)
		}
		return strings.TrimSpace(r.stdout)
	}
	s1 := spec("p-1")
	s1.Configure = func(guestproto.GuestInfo) guestproto.ConfigureRequest {
		return guestproto.ConfigureRequest{Env: []string{"WS_TOKEN=kept"}}
	}
	if _, err := rt.Start(ctx, s1); err != nil {
		t.Fatal(err)
	}
	if in, own := wsEnv("p-1", "/"), wsEnv("p-1", ""); in != "kept" || own != "" {
		t.Fatalf("WS_TOKEN %q in a root, %q in the agent's own exec; want kept and none", in, own)
	}
	bootID := sh("p-1", "cat /proc/sys/kernel/random/boot_id")
	sh("p-1", "(i=0; exec 3>/tmp/held; while :; do i=$((i+1)); echo $i > /tmp/count; echo $i >&3; sleep 0.1; done) >/dev/null 2>&1 & echo $! > /tmp/pid")
	testenv.WaitFor(t, 20*time.Second, "the guest's counter to reach 3", func() (bool, string) {
		c := sh("p-1", "cat /tmp/count")
		n, _ := strconv.Atoi(c)
		return n >= 3, "count " + strconv.Quote(c)
	})
	pid := sh("p-1", "cat /tmp/pid")
	guestAddr := func(id string) string {
		t.Helper()
		rec, err := runtime.ReadLaunchRecord(filepath.Join(h.root, "runtime", "instances", id, runtime.LaunchRecordFile))
		if err != nil || rec.Network == nil {
			t.Fatalf("launch record of %s: %+v, %v", id, rec, err)
		}
		return rec.Network.Guest.String()
	}
	addr1 := guestAddr("p-1")
	dir := filepath.Join(h.scratch, "pool", "snapshots", "ws-1")

	t0 := time.Now()
	meta, err := rt.Pause(ctx, "p-1", dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING pause of a 256 MiB guest: %s (state %d bytes)", time.Since(t0).Round(time.Millisecond), meta.StateBytes)
	if st, _ := rt.Status("p-1"); st.State != runtime.StateStopped {
		t.Fatalf("after pause: %+v", st)
	}
	if meta.Compat.QEMUVersion == "" || meta.Compat.MemoryMiB != 256 || meta.Compat.InstallationID != inst.ID || len(meta.Compat.Devices) == 0 {
		t.Errorf("snapshot compatibility %+v", meta.Compat)
	}
	if names := dirEntries(t, dir); strings.Join(names, " ") != "snapshot.json state" {
		t.Fatalf("snapshot directory holds %v", names)
	}
	time.Sleep(2 * time.Second) // the guest's clock falls behind while it is saved

	t0 = time.Now()
	s2 := spec("p-2")
	s2.Restore = &runtime.RestoreSpec{Dir: dir}
	_, err = rt.Start(ctx, s2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TIMING restore to the guest agent answering: %s", time.Since(t0).Round(time.Millisecond))
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, "p-2") && (strings.Contains(l, "restored") || strings.Contains(l, "instance started") || strings.Contains(l, "DEBUG")) {
			t.Log(l)
		}
	}
	// p-1 still held its address: p-2 has another one.
	if err := rt.Delete(ctx, "p-1"); err != nil {
		t.Fatal(err)
	}
	if got := wsEnv("p-2", "/"); got != "kept" || meta.Configured == nil || !slices.Equal(meta.Configured.Env, []string{"WS_TOKEN=kept"}) {
		t.Errorf("restored WS_TOKEN %q, snapshot configuration %+v; want kept in both", got, meta.Configured)
	}
	if got := sh("p-2", "cat /proc/sys/kernel/random/boot_id"); got != bootID {
		t.Errorf("boot_id %s after the restore, %s before: the guest booted again", got, bootID)
	}
	before, _ := strconv.Atoi(sh("p-2", "cat /tmp/count"))
	testenv.WaitFor(t, 20*time.Second, "the restored guest's counter to count on", func() (bool, string) {
		c := sh("p-2", "cat /tmp/count")
		n, _ := strconv.Atoi(c)
		return n > before, fmt.Sprintf("count %q, %d before", c, before)
	})
	if got := sh("p-2", "kill -0 $(cat /tmp/pid) && cat /tmp/pid"); got != pid {
		t.Errorf("the counting process: %q, want %s running", got, pid)
	}
	if got := sh("p-2", "ls -l /proc/"+pid+"/fd/3"); !strings.Contains(got, "/tmp/held") {
		t.Errorf("the file the process held open: %q", got)
	}
	guestNow, _ := strconv.ParseInt(sh("p-2", "date +%s"), 10, 64)
	if d := time.Now().Unix() - guestNow; d > 2 || d < -2 {
		t.Errorf("the restored guest's clock is %d s off", d)
	}
	addr, addr2 := sh("p-2", "ip -4 -o addr show dev eth0 scope global"), guestAddr("p-2")
	if !strings.Contains(addr, addr2+"/") || strings.Contains(addr, addr1+"/") {
		t.Errorf("eth0 after the restore: %q; want only %s (was %s)", addr, addr2, addr1)
	}

	// Paused again and restored with its address free: the guest keeps
	// its address and is not configured again. Every tap has the same
	// hardware address, so what the guest learnt of its gateway holds.
	sh("p-2", "ping -c 1 -W 1 169.254.100.1 >/dev/null 2>&1; true") // learn it
	gateway := func(id string) string { return sh(id, "ip neigh show 169.254.100.1 dev eth0") }
	if got := gateway("p-2"); !strings.Contains(got, "02:6b:62:00:00:01") {
		t.Fatalf("the gateway as the guest knows it: %q", got)
	}
	dir3 := filepath.Join(h.scratch, "pool", "snapshots", "ws-3")
	if _, err := rt.Pause(ctx, "p-2", dir3); err != nil {
		t.Fatal(err)
	}
	rt.Delete(ctx, "p-2")
	s4 := spec("p-4")
	s4.Restore = &runtime.RestoreSpec{Dir: dir3}
	if _, err := rt.Start(ctx, s4); err != nil {
		t.Fatal(err)
	}
	if got := guestAddr("p-4"); got != addr2 {
		t.Errorf("restored with its address free: %s, want %s again", got, addr2)
	}
	kept := false
	for _, l := range strings.Split(h.logs.String(), "\n") {
		kept = kept || strings.Contains(l, `"instance restored","instance_id":"p-4"`) && strings.Contains(l, `"network_kept":true`)
	}
	if !kept {
		t.Error(`no "instance restored" of p-4 with network_kept=true`)
	}
	if addr := sh("p-4", "ip -4 -o addr show dev eth0 scope global"); !strings.Contains(addr, addr2+"/") {
		t.Errorf("eth0 after a restore that kept it: %q, want %s", addr, addr2)
	}
	if got := gateway("p-4"); !strings.Contains(got, "02:6b:62:00:00:01") || strings.Contains(got, "FAILED") {
		t.Errorf("the gateway after the restore: %q", got)
	}

	// A second pause, then a flipped byte in the state: refused, nothing runs.
	dir2 := filepath.Join(h.scratch, "pool", "snapshots", "ws-2")
	if _, err := rt.Pause(ctx, "p-4", dir2); err != nil {
		t.Fatal(err)
	}
	rt.Delete(ctx, "p-4")
	state := filepath.Join(dir2, runtime.SnapshotStateFile)
	b, _ := os.ReadFile(state)
	b[len(b)/2] ^= 0xff
	os.WriteFile(state, b, 0o600)
	s3 := spec("p-3")
	s3.Restore = &runtime.RestoreSpec{Dir: dir2}
	if _, err := rt.Start(ctx, s3); !errors.Is(err, runtime.ErrSnapshotUnusable) || !strings.Contains(err.Error(), "torn or changed") {
		t.Fatalf("restore of a flipped byte: %v", err)
	}
	if len(h.activeVMMs(t)) != 0 {
		t.Fatalf("VMMs left after a refused restore: %v", h.activeVMMs(t))
	}
	rt.Delete(ctx, "p-3")

	// The VMM killed during the pause: the guest is gone, no snapshot left.
	if _, err := rt.Start(ctx, spec("p-4")); err != nil {
		t.Fatal(err)
	}
	killPID = -1
	dir4 := filepath.Join(h.scratch, "pool", "snapshots", "ws-4")
	if _, err := rt.Pause(ctx, "p-4", dir4); !errors.Is(err, runtime.ErrVMMGone) {
		t.Fatalf("pause with the VMM killed: %v", err)
	}
	if names := dirEntries(t, dir4); len(names) != 0 {
		t.Errorf("a pause whose VMM died left %v", names)
	}
	rt.Delete(ctx, "p-4")
}

func dirEntries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}
