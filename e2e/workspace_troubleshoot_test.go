package e2e

// Rows of the process-model seed's troubleshooting table, reproduced on
// the TestWorkspace VM: a stop the guest cannot prepare, and a VMM the
// kernel's OOM killer ends.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
)

// vmm is the recorded VMM process of a Workspace's Instance.
func (d *wsDev) vmm(instanceID string) *runtime.ProcessRecord {
	d.t.Helper()
	rec, err := runtime.ReadLaunchRecord(filepath.Join(datadir.Dir(d.dir).StorageRoot(), "runtime", "instances", instanceID, runtime.LaunchRecordFile))
	if err != nil || rec.Process == nil {
		d.t.Fatalf("launch record of %s: %+v, %v", instanceID, rec, err)
	}
	return rec.Process
}

// alive reports whether the recorded process still runs.
func alive(p *runtime.ProcessRecord) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.HostPID) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 19 && f[19] == strconv.FormatUint(p.StartTime, 10)
}

type failureView struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// failureOf is the Workspace's failure and last error as get --json shows.
func (d *wsDev) failureOf(id string) (failure, last *failureView) {
	d.t.Helper()
	var w struct {
		Failure   *failureView `json:"failure"`
		LastError *failureView `json:"last_error"`
	}
	if err := clusterlab.DecodeResult(d.must("workspace", "get", id, "--json"), &w); err != nil {
		d.t.Fatal(err)
	}
	return w.Failure, w.LastError
}

// testStopNotPrepared: a tmpfs mounted over the Volume in the Workspace
// cannot be frozen, so the guest cannot prepare the stop: the Workspace
// is FAILED with "prepare guest stop: retained filesystem freeze failed"
// and the VMM keeps running; stop --force ends it (STOPPED, not confirmed
// on disk) and start brings it back with its files.
func (d *wsDev) testStopNotPrepared(id string) {
	t := d.t
	d.must("workspace", "exec", id, "--", "sh", "-c", "echo before-freeze > /root/g; sync; mount -t tmpfs none /data")
	w := d.get(id)
	p := d.vmm(w.InstanceID)
	r := d.kibo(2*time.Minute, nil, "workspace", "stop", id)
	if r.Code == 0 || !strings.Contains(r.Stderr, "prepare guest stop: retained filesystem freeze failed: ") {
		t.Fatalf("stop with a tmpfs over the Volume: %s; want it refused with prepare guest stop: retained filesystem freeze failed", r)
	}
	failure, _ := d.failureOf(id)
	if got := d.get(id); got.State != api.WorkspaceFailed || got.InstanceID != w.InstanceID || failure == nil ||
		!strings.HasPrefix(failure.Message, "prepare guest stop: retained filesystem freeze failed: /rootfs/data: ") {
		t.Fatalf("after the stop that was not prepared: %+v, failure %+v; want FAILED, the same Instance, the guest's reason", got, failure)
	}
	if !alive(p) {
		t.Fatal("the VMM ended after a stop the guest did not prepare; the seed keeps it running")
	}
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "start", id); !strings.Contains(r.Stderr, "stop --force "+id) {
		t.Errorf("start of the FAILED Workspace with its VMM running: %s; want it to say stop --force", r)
	}
	t0 := time.Now()
	d.must("workspace", "stop", "--force", id)
	t.Logf("TIMING stop --force after a stop that was not prepared: %s", time.Since(t0).Round(time.Millisecond))
	if got := d.get(id); got.State != api.WorkspaceStopped || !got.StopUnconfirmed || alive(p) {
		t.Fatalf("after stop --force: %+v (VMM alive: %v); want STOPPED, not confirmed on disk, the VMM gone", got, alive(p))
	}
	d.must("workspace", "start", id)
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/g", "/data/f"); r.Stdout != "before-freeze\non-volume\n" {
		t.Errorf("files after stop --force and start: %q", r.Stdout)
	}
}

// testOOMKill: the kernel's OOM killer ends the VMM (moved into a memory
// cgroup whose limit the guest then exceeds). ctrl stops the Workspace on
// its own (STOPPED; the last error says why) and it starts again; any
// other unexpected exit stays FAILED (NodeKill's kill of a VMM checks
// that).
func (d *wsDev) testOOMKill(id string) {
	t := d.t
	p := d.vmm(d.get(id).InstanceID)
	cg := oomCgroup(d, p.HostPID)
	// The guest touches memory QEMU never had: every new page is charged
	// to the cgroup, which has 16 MiB.
	d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c",
		"dd if=/dev/zero of=/dev/null bs=$(( $(sed -n 's/^MemFree: *\\([0-9]*\\) kB/\\1/p' /proc/meminfo) * 7 / 10 ))k count=1")
	testenv.WaitFor(t, time.Minute, fmt.Sprintf("the OOM kill of the VMM (pid %d) in memory cgroup %s", p.HostPID, cg), func() (bool, string) {
		return !alive(p), "the VMM runs"
	})
	var w wsView
	testenv.Poll(t, 30*time.Second, func() bool { w = d.get(id); return w.State == api.WorkspaceStopped })
	failure, last := d.failureOf(id)
	if w.State != api.WorkspaceStopped || w.InstanceID != "" || failure != nil || last == nil || !strings.Contains(last.Message, "OOM killed the VMM") {
		t.Fatalf("after the OOM kill: %+v, failure %+v, last error %+v; want STOPPED by ctrl, the last error naming the OOM kill", w, failure, last)
	}
	t.Logf("after the OOM kill: %s, last error %q", w.State, last.Message)
	t0 := time.Now()
	d.must("workspace", "start", id)
	t.Logf("TIMING start after the OOM kill: %s", time.Since(t0).Round(time.Millisecond))
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/g"); r.Stdout != "before-freeze\n" {
		t.Errorf("files after the OOM kill and start: %q", r.Stdout)
	}
}

// oomCgroup moves pid into a new memory cgroup limited to 16 MiB above
// nothing (cgroup v1: charges stay where they were made), removed with the
// test.
func oomCgroup(d *wsDev, pid int) string {
	t := d.t
	root := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		t.Fatalf("this test needs the cgroup v1 memory controller at %s (the machines it runs on have it): %v", root, err)
	}
	b := make([]byte, 4)
	rand.Read(b)
	cg := filepath.Join(root, "kibotos-e2e-oom-"+hex.EncodeToString(b))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var err error
		if !testenv.Poll(t, 10*time.Second, func() bool { err = os.Remove(cg); return err == nil || errors.Is(err, os.ErrNotExist) }) {
			t.Errorf("memory cgroup %s left: %v", cg, err)
		}
	})
	for _, kv := range [][2]string{{"memory.limit_in_bytes", strconv.Itoa(16 << 20)}, {"cgroup.procs", strconv.Itoa(pid)}} {
		name, v := kv[0], kv[1]
		if err := os.WriteFile(filepath.Join(cg, name), []byte(v), 0o644); err != nil {
			t.Fatalf("memory cgroup %s: %s: %v", cg, name, err)
		}
	}
	return cg
}

// testGuestNotResponding: a guest that does not answer when the node
// takes it over (its VMM stopped with SIGSTOP across a kill -9 and restart
// of the node) shows as not responding in workspace get while the node
// logs "instance guest sync pending" and retries; once it answers again
// the node hands it this run's configuration, logs recovered=true, and
// the Workspace serves execs.
func (d *wsDev) testGuestNotResponding(id string) {
	t := d.t
	var n wsNode
	if err := clusterlab.DecodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil || n.Session == nil {
		t.Fatalf("node get dev: %v %+v", err, n)
	}
	p := d.vmm(d.get(id).InstanceID)
	if err := syscall.Kill(p.HostPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed && alive(p) {
			syscall.Kill(p.HostPID, syscall.SIGCONT)
		}
		resumed = true
	}
	defer resume()
	dev := d.devProc()
	dev.Cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := dev.WaitExit(10 * time.Second); !ok {
		t.Fatalf("kibotos dev (pid %d) did not die after SIGKILL", dev.Cmd.Process.Pid)
	}
	d.up()
	d.waitReady(n.Session.Incarnation)
	testenv.WaitFor(t, time.Minute, "workspace get to show the stopped guest as not responding", func() (bool, string) {
		w := d.get(id)
		return w.GuestNotResponding && w.State == api.WorkspaceAvailable, fmt.Sprintf("%+v", w)
	})
	if out := d.must("workspace", "get", id).Stdout; !regexp.MustCompile(`(?m)^Guest:?\s+not responding`).MatchString(out) {
		t.Errorf("workspace get does not say the guest is not responding:\n%s", out)
	}
	// The report says "not responding" as soon as the takeover found no
	// session; the log line follows the first attempt that failed.
	testenv.WaitFor(t, 30*time.Second, "the node to log instance guest sync pending", func() (bool, string) {
		return d.devProc().LogContains("instance guest sync pending"), ""
	})
	resume()
	t0 := time.Now()
	testenv.WaitFor(t, time.Minute, "the guest to respond again", func() (bool, string) {
		w := d.get(id)
		return !w.GuestNotResponding, fmt.Sprintf("%+v", w)
	})
	t.Logf("TIMING guest answering again to shown as responding: %s", time.Since(t0).Round(time.Millisecond))
	testenv.WaitFor(t, 30*time.Second, "the node to log instance guest sync pending ... recovered=true", func() (bool, string) {
		return d.devProc().LogContains("recovered=true"), ""
	})
	if r := d.must("workspace", "exec", id, "--", "sh", "-c", "grep -c nameserver /etc/resolv.conf; ip -4 route show default | grep -c via"); r.Stdout != "1\n1\n" {
		t.Errorf("the guest's DNS and default route after the sync: %q", r.Stdout)
	}
}
