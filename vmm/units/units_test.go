package units_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// harness is one private systemd and a Manager connected to it.
type harness struct {
	inst *privsd.Instance
	m    *units.Manager
}

// newHarness boots a private systemd for the test. Cleanups stop it and
// check that nothing is left: no process, no cgroup, and a marker in the
// host's /tmp still there (the tmpfiles hazard).
func newHarness(t *testing.T) *harness {
	t.Helper()
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "private systemd unavailable (needs root and the systemd package): %v", err)
	}
	marker, err := os.CreateTemp("/tmp", "kibotos-units-marker-*")
	if err != nil {
		t.Fatal(err)
	}
	marker.Close()
	t.Cleanup(func() { os.Remove(marker.Name()) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := privsd.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := inst.Stop(); err != nil {
			t.Errorf("stop private systemd: %v", err)
		}
		if syscall.Kill(inst.PID, 0) == nil {
			t.Errorf("private systemd PID %d still exists", inst.PID)
		}
		if _, err := os.Stat(inst.CgroupRoot); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind", inst.CgroupRoot)
		}
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), " "+inst.Dir) {
			t.Errorf("host mounts under %s left behind:\n%s", inst.Dir, mi)
		}
		if _, err := os.Stat(marker.Name()); err != nil {
			t.Errorf("marker %s in the host's /tmp is gone: the private systemd wiped /tmp", marker.Name())
		}
	})
	t.Logf("private systemd up in %v (host PID %d)", inst.BootTime, inst.PID)
	m, err := units.Connect(ctx, inst.Target())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return &harness{inst: inst, m: m}
}

func sleepSpec(name string) units.Spec {
	return units.Spec{
		Name:                 name,
		Description:          "test VMM " + name,
		Argv:                 []string{"/bin/sleep", "300"},
		LimitMEMLOCKInfinity: true,
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStartVMMTakeoverStop(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "kibotos-vmm-t1.service"

	t0 := time.Now()
	u, err := h.m.StartVMM(ctx, sleepSpec(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("StartVMM returned in %v: %+v", time.Since(t0), u)

	if u.ActiveState != "active" {
		t.Errorf("ActiveState %q, want active", u.ActiveState)
	}
	if b, err := hex.DecodeString(u.InvocationID); err != nil || len(b) != 16 {
		t.Errorf("InvocationID %q is not 32 hex characters", u.InvocationID)
	}
	if want := "/kibotos.slice/kibotos-vmm.slice/" + name; u.ControlGroup != want {
		t.Errorf("ControlGroup %q, want %q", u.ControlGroup, want)
	}
	if u.Slice != units.VMMSlice {
		t.Errorf("Slice %q, want %q", u.Slice, units.VMMSlice)
	}
	if u.MainPID == 0 {
		t.Fatal("MainPID is 0")
	}
	hostPID := mainHostPID(t, h, u)
	if err := syscall.Kill(hostPID, 0); err != nil {
		t.Fatalf("main process (host PID %d) not alive: %v", hostPID, err)
	}
	if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", hostPID)); string(cmd) != "/bin/sleep\x00300\x00" {
		t.Errorf("host PID %d runs %q, want the sleep", hostPID, cmd)
	}
	if got, err := h.m.MainHostPID(u); err != nil || got != hostPID {
		t.Errorf("MainHostPID = %d, %v; want %d", got, err, hostPID)
	}
	// What systemd applied, read back: a VMM the kernel's OOM killer hits
	// ends its whole unit, and the unit sees the node's mounts.
	for prop, want := range map[string]any{"OOMPolicy": "kill", "PrivateMounts": false, "KillMode": "control-group", "Restart": "no", "Type": "exec"} {
		if got, err := h.m.ServiceProperty(ctx, name, prop); err != nil || got != want {
			t.Errorf("%s of %s: %v (%T), %v; want %v", prop, name, got, got, err, want)
		}
	}
	vmmSlice, err := h.m.Get(ctx, units.VMMSlice)
	if err != nil || vmmSlice.Slice != "kibotos.slice" || !vmmSlice.Active() {
		t.Errorf("kibotos-vmm.slice: %+v, %v; want active with parent kibotos.slice", vmmSlice, err)
	}

	// Takeover: the unit outlives our connection; a new one finds the same run.
	h.m.Close()
	m2, err := units.Connect(ctx, h.inst.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	list, err := m2.List(ctx, "kibotos-vmm-*")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(list, func(x units.Unit) bool { return x.Name == name })
	if i < 0 {
		t.Fatalf("List(kibotos-vmm-*) after reconnect: %+v, no %s", list, name)
	}
	if got := list[i]; got.InvocationID != u.InvocationID || got.MainPID != u.MainPID || !got.Active() {
		t.Errorf("after reconnect %+v; want invocation %s, MainPID %d, active", got, u.InvocationID, u.MainPID)
	}
	if l, err := m2.List(ctx, "kibotos-dataplane-*"); err != nil || len(l) != 0 {
		t.Errorf("List(kibotos-dataplane-*) = %+v, %v; want none", l, err)
	}

	t0 = time.Now()
	if err := m2.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop returned in %v", time.Since(t0))
	cg := m2.CgroupPath(u)
	if pids, err := units.CgroupPIDs(cg); err != nil || len(pids) != 0 {
		t.Errorf("cgroup %s after Stop: PIDs %v, %v", cg, pids, err)
	}
	if syscall.Kill(hostPID, 0) == nil {
		t.Errorf("main process (host PID %d) alive after Stop", hostPID)
	}
	testenv.WaitFor(t, 2*time.Second, "cgroup "+cg+" removed", func() (bool, string) {
		_, err := os.Stat(cg)
		return os.IsNotExist(err), fmt.Sprintf("stat: %v", err)
	})
	if _, err := m2.Get(ctx, name); !errors.Is(err, units.ErrNotFound) {
		t.Errorf("Get after Stop: %v, want ErrNotFound (collected)", err)
	}
	if err := m2.Stop(ctx, name); err != nil {
		t.Errorf("second Stop: %v, want nil", err)
	}
}

// mainHostPID maps MainPID (a PID of the private namespace) to a host PID
// independently of the package: via NSpid of the processes in cgroup.procs.
func mainHostPID(t *testing.T, h *harness, u units.Unit) int {
	t.Helper()
	procs := filepath.Join(h.inst.CgroupRoot, u.ControlGroup, "cgroup.procs")
	b, err := os.ReadFile(procs)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		st, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if ns, ok := strings.CutPrefix(l, "NSpid:"); ok {
				fs := strings.Fields(ns)
				if fs[len(fs)-1] == strconv.Itoa(int(u.MainPID)) {
					pid, _ := strconv.Atoi(fs[0])
					return pid
				}
			}
		}
	}
	t.Fatalf("MainPID %d of %s not found in %s (%q)", u.MainPID, u.Name, procs, b)
	return 0
}

func TestStartVMMExecFailsThenSameNameStarts(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "kibotos-vmm-bad.service"
	spec := sleepSpec(name)
	spec.Argv = []string{"/nonexistent/kibotos-vmm", "--x"}
	_, err := h.m.StartVMM(ctx, spec)
	if err == nil {
		t.Fatal("StartVMM of a nonexistent binary succeeded")
	}
	if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "/nonexistent/kibotos-vmm") {
		t.Errorf("error does not name the unit and the binary: %v", err)
	}
	t.Logf("expected error: %v", err)

	// CollectMode=inactive-or-failed frees the name at once.
	u, err := h.m.StartVMM(ctx, sleepSpec(name))
	if err != nil {
		t.Fatalf("second start with the same name: %v", err)
	}
	if !u.Active() || u.MainPID == 0 {
		t.Errorf("second start: %+v", u)
	}
	if err := h.m.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestStartVMMTwiceIsErrExists(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "kibotos-vmm-dup.service"
	u, err := h.m.StartVMM(ctx, sleepSpec(name))
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.m.StartVMM(ctx, sleepSpec(name))
	if !errors.Is(err, units.ErrExists) || !strings.Contains(err.Error(), u.InvocationID) {
		t.Errorf("second StartVMM: %v; want ErrExists naming invocation %s", err, u.InvocationID)
	}
	again, err := h.m.Get(ctx, name)
	if err != nil || again.InvocationID != u.InvocationID {
		t.Errorf("running unit changed: %+v, %v", again, err)
	}
	if err := h.m.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestStartServiceInItsSlice(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "kibotos-dataplane-s1-1.service"
	spec := sleepSpec(name)
	spec.Slice = units.DataPlaneSlice
	// The data plane uses -900, but lowering needs CAP_SYS_RESOURCE, which
	// these sandboxes lack (systemd then ignores it); raising shows the property works.
	spec.OOMScoreAdjust = 500
	spec.LimitMEMLOCKInfinity = false
	if _, err := h.m.StartService(ctx, units.Spec{Name: name, Argv: spec.Argv}); err == nil {
		t.Error("StartService without a slice succeeded")
	}
	u, err := h.m.StartService(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if want := "/kibotos.slice/kibotos-dataplane.slice/" + name; u.ControlGroup != want {
		t.Errorf("ControlGroup %q, want %q", u.ControlGroup, want)
	}
	pid := mainHostPID(t, h, u)
	if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); strings.TrimSpace(string(b)) != "500" {
		t.Errorf("oom_score_adj %q, want 500", b)
	}
	if err := h.m.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
}

func TestSpecValidation(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	for _, s := range []units.Spec{
		{Name: "kibotos-vmm-x", Argv: []string{"/bin/true"}},
		{Name: "kibotos-vmm-x.service", Argv: []string{"sleep", "1"}},
		{Name: "kibotos-vmm-x.service"},
	} {
		if _, err := h.m.StartVMM(ctx, s); err == nil {
			t.Errorf("StartVMM(%+v) succeeded", s)
		}
	}
}

// TestStartLatency measures StartVMM (call → exec'd, properties read back) and Stop.
func TestStartLatency(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const n = 20
	var start, stop []time.Duration
	for i := range n {
		name := fmt.Sprintf("kibotos-vmm-lat%d.service", i)
		t0 := time.Now()
		if _, err := h.m.StartVMM(ctx, sleepSpec(name)); err != nil {
			t.Fatal(err)
		}
		start = append(start, time.Since(t0))
		t0 = time.Now()
		if err := h.m.Stop(ctx, name); err != nil {
			t.Fatal(err)
		}
		stop = append(stop, time.Since(t0))
	}
	t.Logf("StartVMM n=%d: %s; Stop (until processes gone): %s; private systemd boot %v",
		n, summary(start), summary(stop), h.inst.BootTime)
}

func summary(d []time.Duration) string {
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	r := func(x time.Duration) time.Duration { return x.Round(10 * time.Microsecond) }
	return fmt.Sprintf("median %v (min %v, max %v)", r(s[len(s)/2]), r(s[0]), r(s[len(s)-1]))
}

// A bad NetworkNamespacePath must fail the start (ExecStart is not
// "ignore failure"); a good one puts the VMM in that namespace.
func TestStartVMMNetworkNamespace(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	spec := sleepSpec("kibotos-vmm-netns.service")
	spec.NetworkNamespacePath = "/run/netns/kibotos-missing"
	if _, err := h.m.StartVMM(ctx, spec); err == nil || !strings.Contains(err.Error(), spec.NetworkNamespacePath) {
		t.Fatalf("StartVMM with a missing netns: %v; want an error naming the path", err)
	}

	ip := testenv.LookPath(t, "ip", "iproute2") // creates the netns
	// The netns must exist in the private systemd's mount namespace: create it
	// there. It goes away with that namespace.
	pid := strconv.Itoa(h.inst.PID)
	if out, err := exec.Command("nsenter", "-t", pid, "-m", "-p", "--", ip, "netns", "add", "kibotos-t").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add inside the private systemd: %v: %s", err, out)
	}
	spec.NetworkNamespacePath = "/run/netns/kibotos-t"
	u, err := h.m.StartVMM(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	hostPID := mainHostPID(t, h, u)
	vmmNS, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", hostPID))
	wantNS, err2 := inode(filepath.Join("/proc", pid, "root/run/netns/kibotos-t"))
	if err1 != nil || err2 != nil || vmmNS != fmt.Sprintf("net:[%d]", wantNS) {
		t.Errorf("VMM netns %s (%v), want net:[%d] (%v)", vmmNS, err1, wantNS, err2)
	}
	if err := h.m.Stop(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
}

func inode(p string) (uint64, error) {
	var st syscall.Stat_t
	err := syscall.Stat(p, &st)
	return st.Ino, err
}

func TestConnectErrorNamesSocket(t *testing.T) {
	target := units.Target{Socket: filepath.Join(t.TempDir(), "no-such.sock"), CgroupRoot: "/sys/fs/cgroup"}
	_, err := units.Connect(context.Background(), target)
	if err == nil || !strings.Contains(err.Error(), target.Socket) {
		t.Errorf("Connect to a missing socket: %v; want an error naming it", err)
	}
}

// TestStartVMMConfined runs a VMM unit as an unprivileged account with the
// confinement properties and reads them back, from the bus and from the
// process. "nobody" stands in for the VMM account (the runtime creates
// kibotos-vmm; this package never creates accounts).
func TestStartVMMConfined(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	spec := sleepSpec("kibotos-vmm-confined.service")
	spec.User, spec.Group = "nobody", "nogroup"
	spec.NoNewPrivileges, spec.UMask = true, 0o077
	spec.MemoryMax, spec.TasksMax = 64<<20, 8
	u, err := h.m.StartVMM(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer h.m.Stop(ctx, spec.Name)
	if u.User != "nobody" || !u.NoNewPrivileges || u.MemoryMax != 64<<20 || u.TasksMax != 8 || u.LimitMEMLOCK != math.MaxUint64 {
		t.Errorf("read back User %q NoNewPrivileges %v MemoryMax %d TasksMax %d LimitMEMLOCK %d; want nobody, true, %d, 8, infinity",
			u.User, u.NoNewPrivileges, u.MemoryMax, u.TasksMax, u.LimitMEMLOCK, 64<<20)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", mainHostPID(t, h, u)))
	if err != nil {
		t.Fatal(err)
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nUid:\t" + nobody.Uid + "\t", "\nNoNewPrivs:\t1\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("/proc status of the main process lacks %q:\n%s", want, status)
		}
	}
}

// A Background VMM (a warm guest's boot) runs at the lowest priority:
// the nice value shows in its main process; systemd takes the weights
// even where it has no cpu or io controller to apply them.
func TestStartVMMBackground(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	spec := sleepSpec("kibotos-vmm-background.service")
	spec.Background = true
	u, err := h.m.StartVMM(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer h.m.Stop(ctx, spec.Name)
	if nice := testenv.ProcStatField(mainHostPID(t, h, u), 19); nice != strconv.Itoa(units.BackgroundNice) {
		t.Fatalf("nice of the main process: %q; want %d", nice, units.BackgroundNice)
	}
}

// The sandbox a service gets from NoCapabilities, ReadOnlyFilesystem,
// ReadWritePaths and InaccessiblePaths, seen from inside: it runs as root
// so that only the sandbox (not file permissions) can deny it anything.
func TestStartServiceSandboxed(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	rw, ro, hidden := filepath.Join(dir, "rw"), filepath.Join(dir, "ro"), filepath.Join(dir, "hidden")
	for _, d := range []string{rw, ro, hidden} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(hidden, "secret"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`{ touch %[2]s/x 2>/dev/null && echo ro-writable || echo ro-denied
cat %[3]s/secret >/dev/null 2>&1 && echo hidden-readable || echo hidden-denied
touch %[1]s/x && echo rw-writable; } > %[1]s/result; exec sleep 300`, rw, ro, hidden)
	const name = "kibotos-egress-sandbox-1.service"
	u, err := h.m.StartService(ctx, units.Spec{
		Name: name, Argv: []string{"/bin/sh", "-c", script}, Slice: units.EgressSlice,
		NoNewPrivileges: true, NoCapabilities: true, ReadOnlyFilesystem: true,
		ReadWritePaths: []string{rw}, InaccessiblePaths: []string{hidden},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.m.Stop(ctx, name)
	if u.CapabilityBoundingSet != 0 || u.ProtectSystem != "strict" || !slices.Equal(u.ReadWritePaths, []string{rw}) || !slices.Equal(u.InaccessiblePaths, []string{hidden}) {
		t.Errorf("read back CapabilityBoundingSet %#x ProtectSystem %q ReadWritePaths %q InaccessiblePaths %q", u.CapabilityBoundingSet, u.ProtectSystem, u.ReadWritePaths, u.InaccessiblePaths)
	}
	var result []byte
	testenv.WaitFor(t, 10*time.Second, "the sandboxed script's result", func() (bool, string) {
		result, _ = os.ReadFile(filepath.Join(rw, "result"))
		return strings.Count(string(result), "\n") == 3, fmt.Sprintf("result %q", result)
	})
	if got, want := string(result), "ro-denied\nhidden-denied\nrw-writable\n"; got != want {
		t.Errorf("inside the sandbox: %q, want %q", got, want)
	}
	// The script exec'd sleep: the main process is what systemd started.
	pid := 0
	testenv.WaitFor(t, 10*time.Second, "sleep to be the main process", func() (bool, string) {
		pid = mainHostPID(t, h, u)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return strings.TrimSpace(string(comm)) == "sleep", fmt.Sprintf("main process %d is %q", pid, strings.TrimSpace(string(comm)))
	})
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nCapEff:\t0000000000000000\n", "\nCapPrm:\t0000000000000000\n", "\nCapBnd:\t0000000000000000\n", "\nCapAmb:\t0000000000000000\n", "\nNoNewPrivs:\t1\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("/proc status of the main process lacks %q:\n%s", want, status)
		}
	}
	if err := h.m.Stop(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// A private systemd has no journal: what a unit writes to its standard
// output and error is appended to its file in the target's LogDir, also
// when it runs as another user on a read-only file system.
func TestStartServiceLogsToLogDir(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t)
	const name = "kibotos-dataplane-logs-1.service"
	spec := units.Spec{Name: name, Slice: units.DataPlaneSlice, User: "nobody", ReadOnlyFilesystem: true,
		Argv: []string{"/bin/sh", "-c", "echo to stdout; echo to stderr >&2; exec sleep 300"}}
	log := filepath.Join(h.inst.UnitLogDir(), name+".log")
	for run := 1; run <= 2; run++ {
		if _, err := h.m.StartService(ctx, spec); err != nil {
			t.Fatal(err)
		}
		want := strings.Repeat("to stdout\nto stderr\n", run)
		testenv.WaitFor(t, 10*time.Second, "the unit's lines in "+log, func() (bool, string) {
			b, _ := os.ReadFile(log)
			return string(b) == want, fmt.Sprintf("%q", b)
		})
		if err := h.m.Stop(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(h.inst.UnitLogDir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("log directory: %v, %v; want mode 0700", fi, err)
	}
	// A VMM's output has its Instance's own log: no file here.
	vmm := sleepSpec("kibotos-vmm-logs.service")
	if _, err := h.m.StartVMM(ctx, vmm); err != nil {
		t.Fatal(err)
	}
	defer h.m.Stop(ctx, vmm.Name)
	if _, err := os.Stat(filepath.Join(h.inst.UnitLogDir(), vmm.Name+".log")); !os.IsNotExist(err) {
		t.Errorf("a VMM unit got a log file in the log directory: %v", err)
	}
}
