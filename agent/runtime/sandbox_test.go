package runtime_test

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

const testConsoleCap = 256 << 10

// openWith opens the harness's runtime with a small console cap; legacy
// launches the way builds before VMM confinement did.
func (h *harness) openWith(t *testing.T, legacy bool) *runtime.Runtime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := h.config()
	cfg.ConsoleLogCap = testConsoleCap
	if legacy {
		cfg = runtime.UnconfinedVMM(cfg)
	}
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func consoleSize(dir string) (cur, total int64) {
	for _, n := range []string{"console.log", "console.log.1"} {
		if st, err := os.Stat(filepath.Join(dir, n)); err == nil {
			total += st.Size()
			if n == "console.log" {
				cur = st.Size()
			}
		}
	}
	return cur, total
}

// TestConfinedVMM boots one confined Instance and one launched as before
// confinement, and checks on the confined one: QEMU runs as the VMM
// account under seccomp with no_new_privs; the unit carries the derived
// limits; its files are the node's and the account's only; a guest writing
// to its serial console without end leaves at most the cap on the host,
// also across a node restart (takeover reconnects to the console). The
// legacy Instance is taken over unchanged by the confining node.
func TestConfinedVMM(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 5*time.Minute)

	// The Instance of the previous build: root QEMU, file console.
	rtOld := h.openWith(t, true)
	if _, err := rtOld.Start(ctx, runtime.Spec{InstanceID: "old", Installation: inst, VCPUs: 1, MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
	oldSt, _ := rtOld.Status("old")
	rtOld.Close()

	rt := h.openWith(t, false)
	if st, err := rt.Status("old"); err != nil || st.State != runtime.StateRunning || st.InvocationID != oldSt.InvocationID {
		t.Fatalf("legacy Instance after the confining node's takeover: %+v, %v; want it RUNNING, same invocation", st, err)
	}
	if r, err := run(ctx, rt, "old", guestproto.ExecRequest{Argv: []string{"/bin/echo", "old"}}, nil); err != nil || r.stdout != "old\n" {
		t.Errorf("exec on the legacy Instance: %+v, %v", r, err)
	}
	if s := procStatus(t, oldSt.HostPID); !strings.HasPrefix(s["Uid"], "0\t") || s["Seccomp"] != "0" {
		t.Errorf("legacy QEMU: Uid %q Seccomp %q; want it to keep root and no filter", s["Uid"], s["Seccomp"])
	}

	const id = "box"
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 2, MemoryMiB: 256, DiskMiB: 16, Network: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.root, "runtime", "instances", id)
	acct, err := user.Lookup(runtime.DefaultVMMUser)
	if err != nil {
		t.Fatalf("VMM account: %v", err)
	}
	s := procStatus(t, st.HostPID)
	if uid := strings.Fields(s["Uid"]); len(uid) != 4 || uid[0] != acct.Uid || uid[1] != acct.Uid {
		t.Errorf("QEMU Uid %q, want %s (%s)", s["Uid"], acct.Uid, runtime.DefaultVMMUser)
	}
	if s["Seccomp"] != "2" || s["NoNewPrivs"] != "1" || s["CapEff"] != "0000000000000000" {
		t.Errorf("QEMU Seccomp %q NoNewPrivs %q CapEff %q; want 2, 1, none", s["Seccomp"], s["NoNewPrivs"], s["CapEff"])
	}
	t.Logf("confined QEMU (2 vCPUs, 256 MiB, blk+net+2 channels): %s threads, VmRSS %s, VmHWM %s", s["Threads"], s["VmRSS"], s["VmHWM"])

	// What systemd holds. The private systemd here cannot enforce
	// MemoryMax/TasksMax (the host's cgroup v1 hierarchies own the memory
	// and pids controllers, so its cgroup2 tree has neither, and
	// LimitMEMLOCK is capped without CAP_SYS_RESOURCE): the properties are
	// asserted, and memory.max only where the controller exists.
	u, err := h.m.Get(ctx, st.Unit)
	if err != nil {
		t.Fatal(err)
	}
	wantMem, wantTasks := runtime.VMMLimits(256, 2)
	if u.User != runtime.DefaultVMMUser || !u.NoNewPrivileges || u.MemoryMax != wantMem || u.TasksMax != wantTasks {
		t.Errorf("unit User %q NoNewPrivileges %v MemoryMax %d TasksMax %d; want %s, true, %d, %d",
			u.User, u.NoNewPrivileges, u.MemoryMax, u.TasksMax, runtime.DefaultVMMUser, wantMem, wantTasks)
	}
	if u.LimitMEMLOCK != ^uint64(0) {
		t.Errorf("unit LimitMEMLOCK %d, want infinity", u.LimitMEMLOCK)
	}
	cg := h.m.CgroupPath(u)
	if b, err := os.ReadFile(filepath.Join(cg, "memory.max")); err == nil {
		if strings.TrimSpace(string(b)) != strconv.FormatUint(wantMem, 10) {
			t.Errorf("%s/memory.max = %s, want %d", cg, b, wantMem)
		}
	} else {
		t.Logf("memory limit not enforceable here: %v (no memory controller in this cgroup2 tree)", err)
	}
	rec, err := runtime.ReadLaunchRecord(filepath.Join(dir, runtime.LaunchRecordFile))
	if err != nil || rec.Confinement == nil || rec.Confinement.User != runtime.DefaultVMMUser || !rec.Confinement.Seccomp || rec.Confinement.Console != "socket" {
		t.Errorf("launch record confinement %+v, %v", rec.Confinement, err)
	}
	argv := strings.Join(rec.VMMArgv, " ")
	for _, want := range []string{"-sandbox " + qemu.SandboxOptions, "-serial chardev:console"} {
		if !strings.Contains(argv, want) {
			t.Errorf("VMM argv lacks %q: %s", want, argv)
		}
	}
	t.Logf("VMM argv: %q", rec.VMMArgv)

	// Nothing QEMU uses is open to others; the node's own files are not
	// the VMM's to write.
	for _, f := range []string{dir, filepath.Join(dir, "agent.sock"), filepath.Join(dir, "ttyS0.sock"),
		filepath.Join(dir, "disk.raw"), filepath.Join(dir, "vmm.log"), filepath.Join(dir, "console.log"), filepath.Join(dir, runtime.LaunchRecordFile),
		inst.Kernel(), inst.Initrd()} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if fi.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s has mode %v: open to others", f, fi.Mode())
		}
	}
	if fi, err := os.Stat(dir); err == nil && (fi.Mode().Perm() != 0o730 || fi.Mode()&os.ModeSticky == 0) {
		t.Errorf("instance directory mode %v, want 01730 (the VMM account creates its sockets, never lists or replaces the node's files)", fi.Mode())
	}

	// A guest flooding its console (ttyS0 is the serial console:
	// console=ttyS0): the host keeps at most the cap, and the ring turned
	// over at least once. The flood is a size, not a time: an emulated
	// UART under TCG on a busy machine wrote less than the cap in 4 s.
	yes := func(bytes int, marker string) {
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c",
			fmt.Sprintf("echo %s > /dev/ttyS0; yes kibotos-console-flood | head -c %d > /dev/ttyS0; echo %s-end > /dev/ttyS0; true", marker, bytes, marker)}}, nil)
		if err != nil || r.exit.ExitCode != 0 {
			t.Fatalf("console flood in the guest: %+v, %v", r, err)
		}
	}
	yes(2*testConsoleCap+testConsoleCap/2, "flood1")
	var maxTotal int64
	testenv.WaitFor(t, time.Minute, "the console ring to turn over (console.log.1) and reach flood1-end", func() (bool, string) {
		_, total := consoleSize(dir)
		maxTotal = max(maxTotal, total)
		b, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		_, err := os.Stat(filepath.Join(dir, "console.log.1"))
		return err == nil && strings.Contains(string(b), "flood1-end"), fmt.Sprintf("console %d bytes in all, console.log.1: %v", total, err)
	})
	if _, total := consoleSize(dir); total > testConsoleCap || maxTotal > testConsoleCap {
		t.Errorf("console on the host: %d bytes (max seen %d), cap %d", total, maxTotal, testConsoleCap)
	}

	// Node restart: the new node reconnects to the console socket. What
	// the guest writes while no node reads is dropped by QEMU.
	rt.Close()
	rt = h.openWith(t, false)
	if st2, err := rt.Status(id); err != nil || st2.State != runtime.StateRunning || st2.InvocationID != st.InvocationID {
		t.Fatalf("after takeover: %+v, %v", st2, err)
	}
	yes(testConsoleCap/2, "flood2")
	testenv.WaitFor(t, time.Minute, "flood2-end in the console after the takeover", func() (bool, string) {
		b, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		_, total := consoleSize(dir)
		maxTotal = max(maxTotal, total)
		return strings.Contains(string(b), "flood2-end"), fmt.Sprintf("console %d bytes in all", total)
	})
	if maxTotal > testConsoleCap {
		t.Errorf("console on the host reached %d bytes, cap %d", maxTotal, testConsoleCap)
	}

	// Stop and delete keep the console tail (both halves of the ring).
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "machine-logs", id, "console.log")); err != nil || len(b) != runtime.MachineLogTail || !strings.Contains(string(b), "kibotos-console-flood") {
		t.Errorf("kept console tail: %d bytes, %v; want %d of the flood", len(b), err, runtime.MachineLogTail)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "machine-logs", id, "vmm.log")); err != nil || !strings.Contains(string(b), runtime.VMMExitedLine+" result=success") {
		t.Errorf("kept VMM log %q, %v; want the VMM to have exited cleanly", b, err)
	}
	if err := rt.Delete(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if l := h.activeVMMs(t); len(l) != 0 {
		t.Errorf("VMM units left: %+v", l)
	}
}
