package runtime_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/hostusage"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/units"
)

func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	rt := h.mustOpen(t)
	ctx := testCtx(t, 3*time.Minute)
	const id = "life"

	t0 := time.Now()
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 64, Network: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start → guest agent answered: %v (%s, invocation %s, host PID %d)", time.Since(t0).Round(time.Millisecond), st.Unit, st.InvocationID, st.HostPID)
	if st.State != runtime.StateRunning || st.Unit != "kibotos-vmm-life.service" || st.InvocationID == "" || !st.GuestResponding {
		t.Fatalf("after Start: %+v", st)
	}
	dir := filepath.Join(h.root, "runtime", "instances", id)
	rec, err := runtime.ReadLaunchRecord(filepath.Join(dir, runtime.LaunchRecordFile))
	if err != nil {
		t.Fatal(err)
	}
	u, err := h.m.Get(ctx, st.Unit)
	if err != nil {
		t.Fatal(err)
	}
	if p := rec.Process; p == nil || p.InvocationID != u.InvocationID || p.MainPID != u.MainPID || p.ControlGroup != u.ControlGroup ||
		p.StartTime == 0 || p.ExeIno == 0 || !strings.Contains(p.Exe, "qemu") || rec.InstallationID != inst.ID || rec.Guest == nil {
		t.Errorf("launch record %+v (process %+v) does not describe unit %+v", rec, rec.Process, u)
	}

	// The node's host usage counts this VM: its unit is in the VM slice
	// the runtime names, under whichever systemd runs it (a private one
	// here, whose tree is not at the cgroup2 mount's root).
	slice := rt.VMSliceCgroup()
	if got := filepath.Dir(h.m.CgroupPath(u)); got != slice {
		t.Errorf("VMM unit's cgroup is in %s; the runtime names %s as the VM slice", got, slice)
	}
	// The idle measure reads the guest's CPU from the unit's cgroup.
	if cur, err := rt.Status(id); err != nil || cur.Cgroup != h.m.CgroupPath(u) {
		t.Errorf("status names cgroup %q (%v), want the unit's %s", cur.Cgroup, err, h.m.CgroupPath(u))
	} else if usec, err := hostusage.CgroupCPUUsec(cur.Cgroup); err != nil || usec == 0 {
		t.Errorf("the VMM's CPU time from %s: %d µs, %v", cur.Cgroup, usec, err)
	}
	usage := hostusage.NewSampler(hostusage.Config{VMCgroup: slice})
	usage.Sample()

	r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/uname", "-a"}}, nil)
	if err != nil || r.exit.ExitCode != 0 || !strings.Contains(r.stdout, inst.KernelVersion) {
		t.Errorf("uname -a: %+v, %v; want the Platform kernel %s", r, err, inst.KernelVersion)
	}
	if u := usage.Sample(); u.VMCPUCores == nil || *u.VMCPUCores <= 0 {
		t.Errorf("host usage VM CPU while the guest ran uname: %v; want a share of a core", u.VMCPUCores)
	}
	in := "hello kibotos\nsecond line\n"
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "cat; exit 3"}}, &in)
	if err != nil || r.exit.ExitCode != 3 || r.stdout != in {
		t.Errorf("sh -c 'cat; exit 3': %+v, %v; want the input echoed and exit 3", r, err)
	}
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "tty"}, PTY: &guestproto.WinSize{Rows: 24, Cols: 80}}, nil)
	if err != nil || r.exit.ExitCode != 0 || !strings.Contains(r.stdout, "/dev/pts") {
		t.Errorf("tty on a PTY: %+v, %v; want /dev/pts/N", r, err)
	}
	// What the guest reaches over its network: network_test.go.
	if rec.Process == nil || rec.Process.NetNS != "/run/netns/"+runtime.NetNSName(id) {
		t.Errorf("launch record netns: %+v", rec.Process)
	}
	// The writable disk is attached as virtio-blk: 64 MiB = 131072 sectors.
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/cat", "/sys/block/vda/size"}}, nil)
	if err != nil || strings.TrimSpace(r.stdout) != "131072" {
		t.Errorf("guest /sys/block/vda/size: %+v, %v; want 131072", r, err)
	}

	c, err := rt.Guest(id)
	if err != nil {
		t.Fatal(err)
	}
	// configure: hostname, DNS and the writable disk mounted; freeze and
	// thaw of that filesystem (in the guest, so safe to do here).
	if err := c.Configure(ctx, guestproto.ConfigureRequest{Hostname: "life-guest", DNS: []string{"192.0.2.53"},
		Mounts: []guestproto.Mount{{Source: "/dev/vda", Target: "/mnt/data", FSType: "ext4"}}}); err != nil {
		t.Fatalf("configure: %v", err)
	}
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "hostname; cat /etc/resolv.conf; grep ' /mnt/data ' /proc/mounts; echo kept > /mnt/data/x"}}, nil)
	if err != nil || r.exit.ExitCode != 0 || !strings.Contains(r.stdout, "life-guest") || !strings.Contains(r.stdout, "nameserver 192.0.2.53") || !strings.Contains(r.stdout, "/dev/vda /mnt/data ext4") {
		t.Errorf("after configure: %+v, %v; want hostname, resolver and /dev/vda on /mnt/data", r, err)
	}
	if err := c.Sync(ctx); err != nil {
		t.Errorf("sync: %v", err)
	}
	if err := c.Freeze(ctx, "/mnt/data"); err != nil {
		t.Fatalf("freeze /mnt/data: %v", err)
	}
	if err := c.Thaw(ctx, "/mnt/data"); err != nil {
		t.Fatalf("thaw /mnt/data: %v", err)
	}
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo after > /mnt/data/y && cat /mnt/data/x /mnt/data/y"}}, nil)
	if err != nil || r.exit.ExitCode != 0 || r.stdout != "kept\nafter\n" {
		t.Errorf("write after thaw: %+v, %v", r, err)
	}

	data := bytes.Repeat([]byte("kibotos file round trip\n"), 4096)
	if _, err := c.WriteFile(ctx, "/tmp/roundtrip.txt", 0o644, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if fi, err := c.ReadFile(ctx, "/tmp/roundtrip.txt", &back); err != nil || fi.Size != int64(len(data)) || !bytes.Equal(back.Bytes(), data) {
		t.Errorf("ReadFile: %d bytes (info %+v), %v; want the %d bytes written", back.Len(), fi, err, len(data))
	}

	dataPlane(t, rt, id, dir, c)

	t1 := time.Now()
	if err := rt.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("Stop (graceful) took %v", time.Since(t1).Round(time.Millisecond))
	if st, _ := rt.Status(id); st.State != runtime.StateStopped || st.Error != "" {
		t.Errorf("after Stop: %+v", st)
	}
	if _, err := h.m.Get(ctx, u.Name); !errors.Is(err, units.ErrNotFound) {
		t.Errorf("unit after Stop: %v, want not found", err)
	}
	if pids, err := units.CgroupPIDs(h.m.CgroupPath(u)); err != nil || len(pids) != 0 {
		t.Errorf("cgroup of %s after Stop: %v, %v", u.Name, pids, err)
	}

	// A stopped Instance stays STOPPED across a node restart.
	rt.Close()
	rt = h.mustOpen(t)
	if st, err := rt.Status(id); err != nil || st.State != runtime.StateStopped {
		t.Errorf("after a node restart: %+v, %v; want STOPPED", st, err)
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	ended, err := runtime.ReadEndedRecord(filepath.Join(h.root, "runtime", "registry", id+".json"))
	if err != nil || ended.How != "stopped" || ended.Launch.LaunchID != rec.LaunchID || ended.EndedAt.IsZero() {
		t.Errorf("registry record: %+v, %v", ended, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance directory %s after Delete: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(h.sd.PID), "root", "run", "netns", runtime.NetNSName(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("network namespace after Delete: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(h.root, "machine-logs", id, "console.log")); err != nil || len(b) == 0 {
		t.Errorf("console tail kept: %d bytes, %v", len(b), err)
	}
	// One node-log entry for the end, as for a machine that exits on its
	// own, but not an error: the node stopped it.
	if e := h.logs.entries("instance machine exited"); len(e) != 1 || e[0]["instance_id"] != id || e[0]["exit"] != "stopped" || e[0]["level"] != "INFO" ||
		e[0]["machine_logs"] != filepath.Join(h.root, "machine-logs", id) {
		t.Errorf("log entries 'instance machine exited': %v; want one at INFO with exit stopped and the machine logs", e)
	}
	// The guest powered off and QEMU exited 0.
	if b, err := os.ReadFile(filepath.Join(h.root, "machine-logs", id, "vmm.log")); err != nil || !strings.Contains(string(b), runtime.VMMExitedLine+" result=success code=exited status=0") {
		t.Errorf("VMM log tail %q, %v; want QEMU to have exited 0", b, err)
	}
	if l := rt.List(); len(l) != 0 {
		t.Errorf("List after Delete: %+v", l)
	}
	if l := h.activeVMMs(t); len(l) != 0 {
		t.Errorf("VMM units after Delete: %+v", l)
	}
}

// dataPlane is what the data-plane process does with a running Instance:
// it dials the guest agent's second channel itself (the node never does),
// runs an exec and forwards a port to a TCP server in the guest. Closing
// that client leaves the node's session c untouched.
func dataPlane(t *testing.T, rt *runtime.Runtime, id, dir string, c *guestproto.Client) {
	ctx := testCtx(t, time.Minute)
	st, err := rt.Status(id)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "data.sock"); st.DataSocket != want || !filepath.IsAbs(st.DataSocket) {
		t.Fatalf("InstanceStatus.DataSocket %q, want %q", st.DataSocket, want)
	}
	conn, err := net.Dial("unix", st.DataSocket)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := guestproto.Dial(ctx, conn)
	if err != nil {
		t.Fatalf("handshake on the data channel: %v", err)
	}
	defer dc.Close()
	if info := dc.Info(); info.BootID != c.Info().BootID || !info.Has(guestproto.CapPortForward) || info.Has(guestproto.CapStop) {
		t.Errorf("data channel info %+v; want the node's guest (boot %s), port-forward and no stop", info, c.Info().BootID)
	}
	r, err := runOn(ctx, dc, guestproto.ExecRequest{Argv: []string{"/bin/echo", "data"}}, nil)
	if err != nil || r.exit.ExitCode != 0 || r.stdout != "data\n" {
		t.Errorf("echo data over the data channel: %+v, %v", r, err)
	}
	var ge *guestproto.Error
	if err := dc.Sync(ctx); !errors.As(err, &ge) || ge.Code != guestproto.CodeUnsupported {
		t.Errorf("sync over the data channel: %v; want code %s", err, guestproto.CodeUnsupported)
	}

	// busybox nc runs cat on the one connection it accepts: an echo that
	// answers until the node half-closes, then closes.
	const port = 7007
	srv, err := dc.Exec(ctx, guestproto.ExecRequest{Argv: []string{"/bin/nc", "-l", "-p", strconv.Itoa(port), "-e", "/bin/cat"}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var fwd net.Conn
	testenv.WaitFor(t, 30*time.Second, "nc to listen in the guest", func() (bool, string) {
		fwd, err = dc.PortForward(ctx, "", port)
		if errors.As(err, &ge) && strings.Contains(ge.Message, "connection refused") {
			return false, err.Error()
		}
		if err != nil {
			t.Fatalf("port-forward to %d: %v", port, err)
		}
		return true, ""
	})
	msg := "through the data plane\n"
	if _, err := io.WriteString(fwd, msg); err != nil {
		t.Fatal(err)
	}
	fwd.Close() // half-close: cat reads EOF, exits, nc's connection closes
	fwd.SetReadDeadline(time.Now().Add(30 * time.Second))
	echoed, err := io.ReadAll(fwd)
	if err != nil || string(echoed) != msg {
		t.Errorf("port-forward echo %q, %v; want %q then EOF", echoed, err, msg)
	}
	if exit, err := srv.Wait(); err != nil || exit.ExitCode != 0 {
		t.Errorf("nc in the guest: %+v, %v", exit, err)
	}

	// The data plane goes away; the node's session carries on.
	dc.Close()
	<-dc.Done()
	if _, err := c.GuestInfo(ctx); err != nil {
		t.Errorf("node session after the data client closed: %v", err)
	}
	r, err = run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/echo", "node"}}, nil)
	if err != nil || r.stdout != "node\n" {
		t.Errorf("exec over the node channel after the data client closed: %+v, %v", r, err)
	}
	if st, _ := rt.Status(id); !st.GuestResponding {
		t.Errorf("guest not responding after the data client closed: %+v", st)
	}
}
