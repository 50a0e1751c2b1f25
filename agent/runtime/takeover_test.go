package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
)

// The child "node" process is this test binary re-executed with nodeEnv set;
// it is configured by the other variables.
const (
	nodeEnv      = "KIBOTOS_RUNTIME_TEST_NODE"
	envRoot      = "KBR_ROOT"
	envPlatform  = "KBR_PLATFORM"
	envStatus    = "KBR_STATUS"
	killRestarts = 5
)

var nodeInstances = []string{"vm-a", "vm-b"}

// nodeStatus is what the child reports once it serves.
type nodeStatus struct {
	PID int
	// Open is the Runtime.Open duration; FirstExec is Open start → an
	// exec answered on every Instance.
	Open, FirstExec time.Duration
	Started         bool // this run started the VMs
	Instances       []nodeInstance
}

type nodeInstance struct {
	ID, Unit, InvocationID, Echo string
	State                        runtime.State
	MainPID                      uint32
	HostPID                      int
}

// runNode is the child: open the Runtime on the shared private systemd,
// start the Instances on the first run, exec on each, report, serve.
func runNode() int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "test node: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m, err := units.ConnectFromEnv(ctx)
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	rt, err := runtime.Open(ctx, runtime.Config{
		StorageRoot: os.Getenv(envRoot), NodeID: "node-a", Units: m, Accel: qemu.AccelAuto,
		Logger:          slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		OwnInstallation: filepath.Base(os.Getenv(envPlatform)),
	})
	if err != nil {
		return fail(err)
	}
	st := nodeStatus{PID: os.Getpid(), Open: time.Since(t0)}
	if len(rt.List()) == 0 {
		st.Started = true
		inst, err := platform.Load(os.Getenv(envPlatform))
		if err != nil {
			return fail(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(nodeInstances))
		for i, id := range nodeInstances {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, MemoryMiB: 256})
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fail(err)
		}
	}
	for _, s := range rt.List() {
		ni := nodeInstance{ID: s.ID, Unit: s.Unit, InvocationID: s.InvocationID, State: s.State, MainPID: s.MainPID, HostPID: s.HostPID}
		r, err := run(ctx, rt, s.ID, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo ok"}}, nil)
		if err != nil {
			return fail(err)
		}
		ni.Echo = r.stdout
		st.Instances = append(st.Instances, ni)
	}
	st.FirstExec = time.Since(t0)
	b, _ := json.Marshal(st)
	tmp := os.Getenv(envStatus) + ".part"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, os.Getenv(envStatus)); err != nil {
		return fail(err)
	}
	for {
		time.Sleep(time.Hour) // serve until killed
	}
}

type child struct {
	cmd    *exec.Cmd
	exited chan struct{}
	status string
	log    string
}

func startChild(t *testing.T, h *harness, n int) *child {
	t.Helper()
	c := &child{
		exited: make(chan struct{}),
		status: filepath.Join(h.scratch, fmt.Sprintf("status-%d.json", n)),
		log:    filepath.Join(h.scratch, fmt.Sprintf("node-%d.log", n)),
	}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	tg := h.sd.Target()
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), nodeEnv+"=1", envRoot+"="+h.root,
		envPlatform+"="+runtimetest.Platform(t).Dir, envStatus+"="+c.status)
	c.cmd.Env = append(c.cmd.Env, tg.Env()...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.cmd.Wait()
		close(c.exited)
	}()
	// Only the process this test started, by its PID.
	t.Cleanup(c.kill)
	return c
}

func (c *child) kill() {
	select {
	case <-c.exited:
	default:
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	}
}

func (c *child) wait(t *testing.T, d time.Duration) nodeStatus {
	t.Helper()
	var st nodeStatus
	c.waitJSON(t, d, &st)
	return st
}

// waitJSON waits for the child's status file and decodes it into v.
func (c *child) waitJSON(t *testing.T, d time.Duration, v any) {
	t.Helper()
	deadline := time.After(d)
	for {
		if b, err := os.ReadFile(c.status); err == nil {
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatal(err)
			}
			return
		}
		select {
		case <-c.exited:
			b, _ := os.ReadFile(c.log)
			t.Fatalf("node process exited (%v) before serving; its log:\n%s", c.cmd.ProcessState, b)
		case <-deadline:
			b, _ := os.ReadFile(c.log)
			t.Fatalf("node process did not report within %v; its log:\n%s", d, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestTakeoverAfterKill9(t *testing.T) {
	h := newHarness(t)
	platformFixture(t)
	c := startChild(t, h, 0)
	first := c.wait(t, 3*time.Minute)
	if !first.Started || len(first.Instances) != len(nodeInstances) {
		t.Fatalf("first node run: %+v", first)
	}
	t.Logf("first run: Open %v, started %d VMs and exec'd on each after %v", first.Open, len(first.Instances), first.FirstExec.Round(time.Millisecond))
	key := func(i nodeInstance) string {
		return fmt.Sprintf("%s %s %s main %d host %d", i.ID, i.Unit, i.InvocationID, i.MainPID, i.HostPID)
	}
	var want []string
	for _, i := range first.Instances {
		want = append(want, key(i))
	}
	sort.Strings(want)

	var opens, execs []time.Duration
	pending := 0 // restarts where a guest needed more than one reconnect attempt
	for n := 1; n <= killRestarts; n++ {
		c.kill()
		if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("node run %d ended with %v, not SIGKILL", n-1, c.cmd.ProcessState)
		}
		c = startChild(t, h, n)
		st := c.wait(t, 2*time.Minute)
		if st.Started {
			t.Fatalf("restart %d started new VMs instead of taking over", n)
		}
		var got []string
		for _, i := range st.Instances {
			got = append(got, key(i))
			if i.State != runtime.StateRunning || i.Echo != "ok\n" {
				t.Errorf("restart %d: %s is %s, echo %q", n, i.ID, i.State, i.Echo)
			}
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("restart %d took over\n%q\nwant the same runs\n%q", n, got, want)
		}
		vmms := h.activeVMMs(t)
		if len(vmms) != len(nodeInstances) {
			t.Fatalf("restart %d: %d active kibotos-vmm units, want %d: %+v", n, len(vmms), len(nodeInstances), vmms)
		}
		opens, execs = append(opens, st.Open), append(execs, st.FirstExec)
		if b, _ := os.ReadFile(c.log); bytes.Contains(b, []byte("instance guest sync pending")) {
			pending++
			for _, l := range bytes.Split(b, []byte("\n")) {
				if bytes.Contains(l, []byte("instance guest sync pending")) {
					t.Logf("restart %d: %s", n, l)
				}
			}
		}
	}
	t.Logf("%d kill -9 + restarts, %d VMs: Open (takeover) %v; Open → exec answered on every VM %v; restarts with a guest reconnect retry: %d",
		killRestarts, len(nodeInstances), opens, execs, pending)

	// Clean up through a Runtime of our own: takeover once more, then Delete.
	c.kill()
	rt := h.mustOpen(t)
	ctx := testCtx(t, time.Minute)
	for _, id := range nodeInstances {
		// Taken over, an Instance keeps its data-plane socket: it comes
		// from the Instance directory and the launch's command line.
		want := filepath.Join(h.root, "runtime", "instances", id, "data.sock")
		if st, err := rt.Status(id); err != nil || st.DataSocket != want {
			t.Errorf("%s after takeover: DataSocket %q, %v; want %q", id, st.DataSocket, err, want)
		} else if _, err := os.Stat(want); err != nil {
			t.Errorf("%s after takeover: data socket: %v", id, err)
		}
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if l := h.activeVMMs(t); len(l) != 0 {
		t.Errorf("VMM units after Delete: %+v", l)
	}
}

// A takeover whose first hello is lost in the guest (its agent's port
// closed just as it arrived) reaches the guest on a new connection
// within seconds: a stop right after it, which waits up to 10 s for the
// guest session to prepare the guest, succeeds. (With one 15 s attempt
// it failed: "prepare guest stop: ... did not answer within 10s".)
func TestTakeoverLostHello(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 3*time.Minute)
	startAndClose(t, ctx, h, "lh")
	var lost atomic.Bool
	cfg := runtime.GuestConn(h.config(), func(c net.Conn) net.Conn {
		if lost.CompareAndSwap(false, true) {
			return helloSink{c}
		}
		return c
	})
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	if err := rt.Stop(ctx, "lh", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !lost.Load() {
		t.Error("no connection to the guest was made to lose a hello on")
	}
	if err := rt.Delete(ctx, "lh"); err != nil {
		t.Fatal(err)
	}
}

// helloSink is a connection to a guest agent whose writes never arrive.
type helloSink struct{ net.Conn }

func (helloSink) Write(p []byte) (int, error) { return len(p), nil }

// A VMM binary replaced on disk while its VMs run (a QEMU package
// upgrade renames the new file over the old) leaves each running VMM's
// executable deleted, the same dev:ino it was launched as: a node that
// restarts then takes them over, and the guests never notice.
func TestTakeoverAfterVMMBinaryReplaced(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	system, err := exec.LookPath(qemu.DefaultBinary)
	if err != nil {
		t.Fatal(err)
	}
	system, err = filepath.EvalSymlinks(system)
	if err != nil {
		t.Fatal(err)
	}
	// A prefix of its own, whose modules and data are the system's: QEMU
	// finds them relative to its executable.
	prefix, systemPrefix := filepath.Join(h.scratch, "qemu"), filepath.Dir(filepath.Dir(system))
	bin := filepath.Join(prefix, "bin", qemu.DefaultBinary)
	shared, _ := filepath.Glob(filepath.Join(systemPrefix, "lib", "*", "qemu"))
	for _, d := range append(shared, filepath.Join(systemPrefix, "share", "qemu")) {
		rel, _ := filepath.Rel(systemPrefix, d)
		os.MkdirAll(filepath.Dir(filepath.Join(prefix, rel)), 0o755)
		if err := os.Symlink(d, filepath.Join(prefix, rel)); err != nil {
			t.Fatal(err)
		}
	}
	install := func() {
		t.Helper()
		os.MkdirAll(filepath.Dir(bin), 0o755)
		b, err := os.ReadFile(system)
		if err != nil {
			t.Fatal(err)
		}
		// As a package manager does: a new file renamed over the old.
		if err := os.WriteFile(bin+".new", b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(bin+".new", bin); err != nil {
			t.Fatal(err)
		}
	}
	install()
	cfg := h.config()
	cfg.QEMUBinary = bin
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: "rb", Installation: inst, VCPUs: 1, MemoryMiB: 256}); err != nil {
		rt.Close()
		t.Fatal(err)
	}
	if r, err := run(ctx, rt, "rb", guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo before > /tmp/mark"}}, nil); err != nil || r.exit.ExitCode != 0 {
		rt.Close()
		t.Fatalf("mark: %+v %v", r, err)
	}
	rt.Close()
	install()
	rt, err = runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("takeover after the VMM binary was replaced: %v", err)
	}
	defer rt.Close()
	if st, err := rt.Status("rb"); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("after the takeover: %+v %v", st, err)
	}
	testenv.WaitFor(t, 30*time.Second, "guest session", func() (bool, string) {
		st, _ := rt.Status("rb")
		return st.GuestResponding, "state " + string(st.State)
	})
	if r, err := run(ctx, rt, "rb", guestproto.ExecRequest{Argv: []string{"/bin/cat", "/tmp/mark"}}, nil); err != nil || r.stdout != "before\n" {
		t.Fatalf("after the takeover: %+v %v", r, err)
	}
	if err := rt.Stop(ctx, "rb", 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// A start whose starter has steps of its own after Start (Spec.Staged: a
// Workspace's Volumes to mount, its machine id) is not started until the
// starter says so. A node that restarts before that takes the Instance
// over FAILED, its VMM still running for Delete, rather than as a
// started guest that was never told what it still needed (the fault
// harness's seed 33: a Workspace AVAILABLE without its filesystem
// mounted, after a member was killed during its start). One the starter
// finished is taken over RUNNING.
func TestTakeoverOfAnUnfinishedStart(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	rt, err := runtime.Open(ctx, h.config())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range []string{"cut", "done"} {
		wg.Go(func() {
			_, errs[i] = rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, Staged: true})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		rt.Close()
		t.Fatal(err)
	}
	for _, id := range []string{"cut", "done"} {
		if st, _ := rt.Status(id); st.State != runtime.StateRunning {
			t.Errorf("instance %s after its Start: %s (%s), want RUNNING", id, st.State, st.Error)
		}
	}
	if err := rt.Finish("done"); err != nil {
		t.Error(err)
	}
	rt.Close()

	rt = h.mustOpen(t)
	cut, err := rt.Status("cut")
	if err != nil {
		t.Fatal(err)
	}
	if cut.State != runtime.StateFailed || !strings.Contains(cut.Error, "start interrupted") {
		t.Errorf("unfinished start after a node restart: %s (%q), want FAILED, start interrupted", cut.State, cut.Error)
	}
	if done, err := rt.Status("done"); err != nil || done.State != runtime.StateRunning {
		t.Errorf("finished start after a node restart: %s (%q, %v), want RUNNING", done.State, done.Error, err)
	}
	if n := len(h.activeVMMs(t)); n != 2 {
		t.Errorf("%d VMM units run after the restart, want 2: the unfinished one's is left for Delete", n)
	}
	for _, id := range []string{"cut", "done"} {
		if err := rt.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if n := len(h.activeVMMs(t)); n != 0 {
		t.Errorf("%d VMM units run after both were deleted", n)
	}
}

// A node that ends after a VMM unit started and before the launch record
// named its process (the fault harness's seed 38: a member killed during
// a start) finds a unit running for a record without a process. Its
// description names the launch, so the restarted node records the
// process and takes the Instance over as a start cut short: FAILED, its
// VMM left for Delete. It refused to open before, and the member never
// came back. A unit that does not name the record's launch is still
// refused.
func TestTakeoverOfALaunchCutBeforeItsProcessWasRecorded(t *testing.T) {
	h := newHarness(t)
	ctx := testCtx(t, 3*time.Minute)
	startAndClose(t, ctx, h, "cut")

	// The record as the launch wrote it before the unit started.
	dir := filepath.Join(h.root, "runtime", "instances", "cut")
	rec, err := runtime.ReadLaunchRecord(filepath.Join(dir, runtime.LaunchRecordFile))
	if err != nil {
		t.Fatal(err)
	}
	recorded := *rec.Process
	launch := rec.LaunchID
	rec.Process, rec.Guest, rec.Configured, rec.Unfinished = nil, nil, nil, true
	rec.LaunchID = "another-launch"
	if err := runtime.WriteLaunchRecord(dir, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.open(t); err == nil || !strings.Contains(err.Error(), "cannot tell it is this launch") {
		t.Fatalf("open with a unit that names another launch than the record: %v, want a refusal", err)
	}
	rec.LaunchID = launch
	if err := runtime.WriteLaunchRecord(dir, rec); err != nil {
		t.Fatal(err)
	}

	rt := h.mustOpen(t)
	st, err := rt.Status("cut")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != runtime.StateFailed || !strings.Contains(st.Error, "start interrupted") {
		t.Errorf("a launch cut before its process was recorded, after a node restart: %s (%q), want FAILED, start interrupted", st.State, st.Error)
	}
	if st.InvocationID != recorded.InvocationID || st.HostPID != recorded.HostPID {
		t.Errorf("process taken over: invocation %s, host PID %d; the launch's: %s, %d", st.InvocationID, st.HostPID, recorded.InvocationID, recorded.HostPID)
	}
	if n := len(h.activeVMMs(t)); n != 1 {
		t.Errorf("%d VMM units run after the restart, want 1: its VMM is left for Delete", n)
	}
	if rec, err := runtime.ReadLaunchRecord(filepath.Join(dir, runtime.LaunchRecordFile)); err != nil || rec.Process == nil {
		t.Errorf("launch record after the takeover: %v, process %v; want the process recorded", err, rec)
	}
	if err := rt.Delete(ctx, "cut"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.activeVMMs(t)); n != 0 {
		t.Errorf("%d VMM units run after the Instance was deleted", n)
	}
}

// startAndClose starts Instance id on a runtime it then closes: a node
// that ended with the VMM running.
func startAndClose(t *testing.T, ctx context.Context, h *harness, id string) {
	t.Helper()
	rt, err := runtime.Open(ctx, h.config())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: platformFixture(t), VCPUs: 1, MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
}
