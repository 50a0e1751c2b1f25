package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
)

// The node processes of the check-maintenance tests are this test binary
// re-executed with maintenanceNodeEnv set to what they do; they serve
// until the test kills them, leaving what a node killed at that moment
// leaves.
const (
	maintenanceNodeEnv = "KBR_MAINTENANCE_NODE"
	// envHelperFIFO: the "helper" node starts a tool that reads this FIFO
	// until the test closes it.
	envHelperFIFO = "KBR_HELPER_FIFO"
	// envSwitch: the "switch" node applies this policy (JSON) to Instance
	// switchInstance and is killed while the egress routes follow it;
	// envNodeNS is the lab's node namespace.
	envSwitch = "KBR_SWITCH_POLICY"
	envNodeNS = "KBR_NODE_NS"
)

const switchInstance = "sw"

// helperStatus is what the "helper" node reports.
type helperStatus struct {
	PID, HelperPID int
}

// runMaintenanceNode is the child node of the check-maintenance tests.
func runMaintenanceNode(mode string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "test node (%s): %v\n", mode, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m, err := units.ConnectFromEnv(ctx)
	if err != nil {
		return fail(err)
	}
	cfg := runtime.Config{StorageRoot: os.Getenv(envRoot), NodeID: "node-a", Units: m, Accel: qemu.AccelAuto,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)), OwnInstallation: filepath.Base(os.Getenv(envPlatform))}
	var st any
	switch mode {
	case "helper":
		if _, err := runtime.Open(ctx, cfg); err != nil {
			return fail(err)
		}
		// A tool the node runs, as it runs mkfs.ext4 or qemu-img: a child
		// process, in the node's cgroup.
		helper := exec.Command("cat", os.Getenv(envHelperFIFO))
		if err := helper.Start(); err != nil {
			return fail(err)
		}
		st = helperStatus{PID: os.Getpid(), HelperPID: helper.Process.Pid}
	case "switch":
		network, err := netpol.ParseConfig(labPool, "", []string{labMgmtNode + "/24"}, []string{labInternet}, "up0")
		if err != nil {
			return fail(err)
		}
		var p runtime.NetworkPolicy
		if err := json.Unmarshal([]byte(os.Getenv(envSwitch)), &p); err != nil {
			return fail(err)
		}
		router := &haltingRouter{}
		cfg.Network, cfg.HostNetNS, cfg.Egress = &network, os.Getenv(envNodeNS), router
		rt, err := runtime.Open(ctx, cfg)
		if err != nil {
			return fail(err)
		}
		router.halt.Store(true)
		err = rt.UpdateNetwork(ctx, switchInstance, p)
		return fail(fmt.Errorf("the switch returned (%v) instead of halting in the egress routes", err))
	default:
		return fail(fmt.Errorf("unknown mode"))
	}
	if err := writeStatus(st); err != nil {
		return fail(err)
	}
	for {
		time.Sleep(time.Hour) // serve until killed
	}
}

// haltingRouter stands for the node's egress process: once halt is set,
// an Apply reports the node's PID to the test and never returns, so the
// test kills the node half-way through a policy change.
type haltingRouter struct{ halt atomic.Bool }

func (r *haltingRouter) Apply(ctx context.Context, cfg egress.Config) error {
	if !r.halt.Load() {
		return nil
	}
	if err := writeStatus(helperStatus{PID: os.Getpid()}); err != nil {
		fmt.Fprintf(os.Stderr, "test node: %v\n", err)
	}
	select {}
}

// writeStatus reports v to the test, whole or not at all.
func writeStatus(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := os.Getenv(envStatus) + ".part"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, os.Getenv(envStatus))
}

// startMaintenanceNode starts a child node in mode, in the cgroup
// directory cgroup when one is given, with env added.
func startMaintenanceNode(t *testing.T, h *harness, n int, mode, cgroup string, env ...string) *child {
	t.Helper()
	c := &child{
		exited: make(chan struct{}),
		status: filepath.Join(h.scratch, fmt.Sprintf("status-%s-%d.json", mode, n)),
		log:    filepath.Join(h.scratch, fmt.Sprintf("node-%s-%d.log", mode, n)),
	}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), maintenanceNodeEnv+"="+mode, envRoot+"="+h.root, envStatus+"="+c.status)
	c.cmd.Env = append(append(c.cmd.Env, h.sd.Target().Env()...), env...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{}
	if cgroup != "" {
		err = units.StartInCgroup(c.cmd, cgroup)
	} else {
		err = c.cmd.Start()
	}
	if err != nil {
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

// maintenance runs check-maintenance op and returns its blocking items.
func maintenance(t *testing.T, cfg runtime.Config, op string) (ok bool, blocking []runtime.MaintenanceItem) {
	t.Helper()
	rep, err := runtime.CheckMaintenance(testCtx(t, time.Minute), cfg, op)
	if err != nil {
		t.Fatalf("check-maintenance %s: %v", op, err)
	}
	for _, it := range rep.Items {
		if it.Blocking {
			blocking = append(blocking, it)
		}
	}
	return rep.OK, blocking
}

// TestCheckMaintenanceHelperProcesses: a tool the node started (as it
// starts mkfs.ext4 or qemu-img) that still runs in the node service's
// cgroup after the node ended blocks an upgrade and a removal, named by
// its PID and command line; once it finished, the upgrade may go ahead.
func TestCheckMaintenanceHelperProcesses(t *testing.T) {
	h := newHarness(t)
	mount, err := units.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	// The node's service: a cgroup of its own, as systemd makes one for
	// kibotos.service.
	service := filepath.Join(mount, fmt.Sprintf("kbr-node-%d.service", os.Getpid()))
	if err := os.Mkdir(service, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(h.scratch, "helper.fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// finishHelper lets the tool end (end of its input) and waits for
	// the service's cgroup to empty.
	finishHelper := func() error {
		var pids []int
		var err error
		if testenv.Poll(t, 30*time.Second, func() bool {
			if f, err := os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				f.Close()
			}
			pids, err = units.CgroupPIDs(service)
			// Not only no PID listed: a task still exiting keeps the
			// cgroup populated, and rmdir of it fails with EBUSY.
			return err != nil || len(pids) == 0 && !cgroupPopulated(service)
		}) {
			return err
		}
		return fmt.Errorf("cgroup %s still holds %v", service, pids)
	}
	t.Cleanup(func() {
		if err := errors.Join(finishHelper(), units.RemoveCgroup(service)); err != nil {
			t.Errorf("clean up the node's service cgroup: %v", err)
		}
	})
	c := startMaintenanceNode(t, h, 0, "helper", service, envHelperFIFO+"="+fifo)
	var st helperStatus
	c.waitJSON(t, time.Minute, &st)
	c.kill() // the node ends; the tool it started runs on

	want := fmt.Sprintf("%d (cat %s)", st.HelperPID, fifo)
	for _, op := range []string{runtime.OpUpgrade, runtime.OpRemove} {
		ok, blocking := maintenance(t, h.config(), op)
		found := false
		for _, it := range blocking {
			found = found || (it.Object == service && it.State == "helper processes" && strings.Contains(it.Detail, want) &&
				strings.Contains(it.Detail, fmt.Sprintf("node process %d", st.PID)))
		}
		if ok || !found {
			t.Errorf("check-maintenance %s with a tool of the node still running: ok=%v, blocked by %+v; want %s named under %s", op, ok, blocking, want, service)
		}
	}

	if err := finishHelper(); err != nil {
		t.Fatal(err)
	}
	if ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade); !ok {
		t.Errorf("check-maintenance upgrade once the tool ended: blocked by %+v", blocking)
	}
}

// TestCheckMaintenanceNetworkSwitch: a node killed while it changes a
// running Instance's policy leaves the switch half done (the record and
// the table have the new policy, the egress routes not yet): an upgrade
// is blocked naming the Instance and the switch, a network switch when
// the policy changes, a target rotation when only the Egress it names
// moves to a new revision; the next node's takeover finishes it, and
// nothing blocks any more, as after a switch that completed.
func TestCheckMaintenanceNetworkSwitch(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	h.wireInternet()
	ctx := testCtx(t, 5*time.Minute)
	rt := h.mustOpen(t)
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: switchInstance, Installation: inst, VCPUs: 1, MemoryMiB: 256, Network: true,
		Policy: runtime.NetworkPolicy{Egress: "public"}}); err != nil {
		t.Fatal(err)
	}
	rt.Close()

	rev1 := runtime.NetworkPolicy{Egress: runtime.EgressProxyMode, Proxy: &runtime.EgressProxy{Name: "corp", Revision: 1, SOCKS5: labInternet + ":1080"}}
	rev2 := runtime.NetworkPolicy{Egress: runtime.EgressProxyMode, Proxy: &runtime.EgressProxy{Name: "corp", Revision: 2, SOCKS5: labInternet + ":1081"}}
	for n, c := range []struct {
		to         runtime.NetworkPolicy
		state, msg string
	}{
		{rev1, "network switch half done", "a network switch is half done (from egress public to egress proxy through corp revision 1 (" + labInternet + ":1080), started "},
		{rev2, "target rotation half done", "a target rotation is half done (from egress proxy through corp revision 1 (" + labInternet + ":1080) to egress proxy through corp revision 2 (" + labInternet + ":1081), started "},
	} {
		policy, _ := json.Marshal(c.to)
		node := startMaintenanceNode(t, h, n, "switch", "", envSwitch+"="+string(policy), envNodeNS+"="+h.nodeNS, envPlatform+"="+inst.Dir)
		node.waitJSON(t, 2*time.Minute, &helperStatus{})
		node.kill()

		ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade)
		found := false
		for _, it := range blocking {
			found = found || (it.Object == "instance "+switchInstance && it.State == c.state && strings.Contains(it.Detail, c.msg) &&
				strings.HasSuffix(it.Detail, "start the node so it finishes it, then check again"))
		}
		if ok || !found {
			t.Errorf("check-maintenance upgrade after a node was killed mid-switch to %s: ok=%v, blocked by %+v; want instance %s: %s",
				policy, ok, blocking, switchInstance, c.msg)
		}

		// The next node takes the Instance over and finishes the switch.
		rt := h.mustOpen(t)
		rt.Close()
		if ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade); !ok {
			t.Errorf("check-maintenance upgrade once a node took the half-done switch over: blocked by %+v", blocking)
		}
	}

	// A switch that completes leaves nothing behind.
	rt = h.mustOpen(t)
	if err := rt.UpdateNetwork(ctx, switchInstance, runtime.NetworkPolicy{Egress: "public"}); err != nil {
		t.Fatal(err)
	}
	rt.Close()
	if ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade); !ok {
		t.Errorf("check-maintenance upgrade after a switch that completed: blocked by %+v", blocking)
	}

	rt = h.mustOpen(t)
	if err := rt.Delete(ctx, switchInstance); err != nil {
		t.Fatal(err)
	}
}

// TestCheckMaintenanceShutdownHalfDone: the node stops while the stop of
// an Instance waits for its VMM's cgroup to empty (a process stuck in the
// kernel, as in TestCleanupPending): the shutdown is half done, and an
// upgrade is blocked naming the Instance, its unit and the stuck process;
// once that process could end, the ended Instance's record blocks no
// upgrade.
func TestCheckMaintenanceShutdownHalfDone(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	rt := h.mustOpen(t)
	const id = "vm-s"
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	writer, mnt, u := stuckInVMMCgroup(ctx, t, h, st.Unit)
	stopped := make(chan error, 1)
	go func() { stopped <- rt.Stop(ctx, id, time.Second) }()
	testenv.WaitFor(t, 90*time.Second, "instance cleanup pending in the node log", func() (bool, string) {
		return strings.Contains(h.logs.String(), `"msg":"instance cleanup pending"`), ""
	})
	rt.Close() // the node stops before the shutdown finished
	if err := <-stopped; err == nil {
		t.Fatal("the stop returned no error although the node closed before the VMM's cgroup emptied")
	}

	ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade)
	want := fmt.Sprintf("a shutdown is half done: unit %s is no longer active, but its cgroup %s still holds host PIDs %d (/bin/sh -c echo x > %s/f)",
		st.Unit, h.m.CgroupPath(u), writer.Process.Pid, mnt)
	found := false
	for _, it := range blocking {
		found = found || (it.Object == "instance "+id && it.State == "shutdown half done" && strings.HasPrefix(it.Detail, want))
	}
	if ok || !found {
		t.Errorf("check-maintenance upgrade with the node stopped mid-shutdown: ok=%v, blocked by %+v; want instance %s: %s", ok, blocking, id, want)
	}

	thaw(mnt)
	if err := writer.Wait(); err != nil {
		t.Fatalf("the writer once its filesystem thawed: %v", err)
	}
	if ok, blocking := maintenance(t, h.config(), runtime.OpUpgrade); !ok {
		t.Errorf("check-maintenance upgrade once the stuck process ended: blocked by %+v", blocking)
	}
	rt = h.mustOpen(t)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// cgroupPopulated reads cgroup.events: "populated 1" while any task,
// exiting ones included, is in the cgroup or below it.
func cgroupPopulated(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	return err == nil && strings.Contains(string(b), "populated 1")
}
