package runtime_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// A guest restarts inside its VMM (a reboot, or a panic, which panic=-1
// turns into one), with or without a node running: the VMM goes on, and
// the first session that finds the new boot tells it the launch-time
// configuration again (its network and this run's DNS, its hostname, the
// mounts of the start and one added after it), before anything else
// reaches it; the launch record then claims the new boot. (With
// -no-reboot the VMM ended and the Instance was FAILED.)
func TestGuestRestartReconfigured(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 5*time.Minute)
	const id = "rb"
	rt, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { rt.Close() }()
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 64, Network: true,
		Configure: func(guestproto.GuestInfo) guestproto.ConfigureRequest {
			return guestproto.ConfigureRequest{Hostname: "rb-guest", Mounts: []guestproto.Mount{{Source: "/dev/vda", Target: "/mnt/data", FSType: "ext4"}}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Configure(ctx, id, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "tmpfs", Target: "/mnt/extra", FSType: "tmpfs"}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo kept > /mnt/data/x && sync"}}, nil); err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("write on the data disk: %+v, %v", r, err)
	}
	dir := filepath.Join(h.root, "runtime", "instances", id)
	rec, err := runtime.ReadLaunchRecord(filepath.Join(dir, runtime.LaunchRecordFile))
	if err != nil {
		t.Fatal(err)
	}
	if c := rec.Configured; c == nil || c.Hostname != "rb-guest" || len(c.Mounts) != 2 || c.Mounts[0].Target != "/mnt/data" || c.Mounts[1].Target != "/mnt/extra" {
		t.Fatalf("launch record's configuration %+v; want the hostname and both mounts, in order", rec.Configured)
	}
	guestAddr := rec.Network.Guest.String()

	// configured checks the guest is as launched, on a boot other than
	// the one before, and returns its kernel's boot id.
	configured := func(when, before string) string {
		t.Helper()
		r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c",
			"cat /proc/sys/kernel/random/boot_id; hostname; cat /mnt/data/x; grep -c ' /mnt/extra tmpfs ' /proc/mounts; ip -4 -o addr show; cat /etc/resolv.conf"}}, nil)
		if err != nil {
			t.Fatalf("%s: exec: %v", when, err)
		}
		boot, _, _ := strings.Cut(r.stdout, "\n")
		for _, want := range []string{"\nrb-guest\n", "\nkept\n1\n", " " + guestAddr + "/", "nameserver " + netpol.TapAddr} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s: the guest shows\n%s\nwithout %q", when, r.stdout, want)
			}
		}
		if boot == before {
			t.Fatalf("%s: boot id %s is the one before: the guest did not restart", when, boot)
		}
		return boot
	}
	// restartedTo waits until the node claims a guest other than claimed
	// (the agent's boot id), answering, and returns its id.
	restartedTo := func(claimed string) string {
		t.Helper()
		var now string
		testenv.WaitFor(t, 3*time.Minute, "the restarted guest to be reconfigured", func() (bool, string) {
			s, err := rt.Status(id)
			if err != nil || s.State != runtime.StateRunning || !s.GuestResponding || s.Guest == nil {
				return false, fmt.Sprintf("state %s, guest responding %v, %v", s.State, s.GuestResponding, err)
			}
			now = s.Guest.BootID
			return now != claimed, "boot id still " + now
		})
		return now
	}
	boot := configured("after the start", "")
	claimed := st.Guest.BootID

	// A reboot from inside, with the node running.
	if r, err := run(ctx, rt, id, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "(sleep 1; reboot -f) >/dev/null 2>&1 &"}}, nil); err != nil || r.exit.ExitCode != 0 {
		t.Fatalf("reboot: %+v, %v", r, err)
	}
	claimed = restartedTo(claimed)
	boot = configured("after a reboot with the node running", boot)

	// A reset while no node runs: the next one takes the VMM over and
	// finds a new boot.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	q, err := qemu.DialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	err = q.Execute(ctx, "system_reset", nil, nil)
	q.Close()
	if err != nil {
		t.Fatal(err)
	}
	if rt, err = h.open(t); err != nil {
		t.Fatal(err)
	}
	restartedTo(claimed)
	configured("after a restart while no node ran", boot)
	if now, err := rt.Status(id); err != nil || now.InvocationID != st.InvocationID {
		t.Errorf("after both restarts: %+v, %v; want the VMM of the start, invocation %s", now, err, st.InvocationID)
	}
	if n := len(h.logs.entries("instance guest restarted; reconfigured with the launch-time configuration")); n != 2 {
		t.Errorf("%d restarts logged, want 2", n)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}
