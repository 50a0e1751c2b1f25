package privsd_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func requirePrivsd(t *testing.T) {
	t.Helper()
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "private systemd unavailable: %v", err)
	}
}

// tmpMarker guards against the /tmp-wiping hazard: a file in the host's /tmp
// (not in the test dir) must survive a private systemd's boot and poweroff.
func tmpMarker(t *testing.T) func() {
	t.Helper()
	f, err := os.CreateTemp("/tmp", "kibotos-privsd-marker-*")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { os.Remove(f.Name()) })
	return func() {
		t.Helper()
		if _, err := os.Stat(f.Name()); err != nil {
			t.Errorf("marker %s in the host's /tmp is gone: the private systemd wiped /tmp: %v", f.Name(), err)
		}
	}
}

// ourMounts lists the host mounts a private systemd could leak if its mount
// namespace were not private: /run, /proc/sys, /dev/console, cgroup mounts,
// and anything under the test's directories. Other mounts are ignored so
// that tests of other packages running meanwhile (whose private systemds
// share their run/netns with the host) do not disturb the check.
func ourMounts(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		mp := f[4]
		if mp == "/run" || mp == "/proc/sys" || mp == "/dev/console" || mp == "/proc" ||
			strings.HasPrefix(mp, "/sys/fs/cgroup") || strings.HasPrefix(mp, filepath.Join(os.TempDir(), t.Name())) {
			out = append(out, strings.Join(f[3:], " ")) // without mount and parent IDs
		}
	}
	return strings.Join(out, "\n")
}

func TestStartStop(t *testing.T) {
	requirePrivsd(t)
	checkMarker := tmpMarker(t)
	before := ourMounts(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst, err := privsd.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	t.Logf("private systemd host PID %d, bus %s, cgroup %s, boot %v", inst.PID, inst.BusSocket, inst.CgroupRoot, inst.BootTime)

	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", inst.PID))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nNSpid:\t") || !strings.HasSuffix(nspidLine(string(st)), "\t1") {
		t.Errorf("host PID %d is not PID 1 of its namespace: NSpid %q", inst.PID, nspidLine(string(st)))
	}
	if _, err := os.Stat(filepath.Join(inst.CgroupRoot, "init.scope")); err != nil {
		t.Errorf("no init.scope under the cgroup root: %v", err)
	}
	// /proc/sys is read-only inside, so the host's sysctls are untouched.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/root/proc/sys/kernel/hostname", inst.PID), []byte("x"), 0); err == nil {
		t.Errorf("/proc/sys is writable inside the private systemd")
	}

	t0 := time.Now()
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop took %v", time.Since(t0))
	if err := syscall.Kill(inst.PID, 0); err == nil {
		t.Errorf("PID %d still exists after Stop", inst.PID)
	}
	if _, err := os.Stat(inst.CgroupRoot); !os.IsNotExist(err) {
		t.Errorf("cgroup %s left behind (%v)", inst.CgroupRoot, err)
	}
	if after := ourMounts(t); after != before {
		t.Errorf("host mounts changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	checkMarker()
}

func nspidLine(status string) string {
	for _, l := range strings.Split(status, "\n") {
		if strings.HasPrefix(l, "NSpid:") {
			return l
		}
	}
	return ""
}

func TestSecondStartOnSameDirRefused(t *testing.T) {
	requirePrivsd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	inst, err := privsd.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Stop() })
	if second, err := privsd.Start(ctx, dir); err == nil {
		_ = second.Stop()
		t.Fatal("a second private systemd started on the same directory")
	} else if !strings.Contains(err.Error(), "already") {
		t.Errorf("second Start: %v; want 'seems to run already'", err)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := inst.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	// The directory can be used again once stopped.
	again, err := privsd.Start(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestBootTime measures Start (launch → manager running, via the bus proxy) and Stop.
func TestBootTime(t *testing.T) {
	requirePrivsd(t)
	checkMarker := tmpMarker(t)
	var boot, stop []time.Duration
	for range 5 {
		inst, err := privsd.Start(context.Background(), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = inst.Stop() })
		boot = append(boot, inst.BootTime)
		t0 := time.Now()
		if err := inst.Stop(); err != nil {
			t.Fatal(err)
		}
		stop = append(stop, time.Since(t0))
	}
	slices.Sort(boot)
	slices.Sort(stop)
	t.Logf("private systemd boot (Start → running): median %v, min %v, max %v; Stop: median %v, max %v",
		boot[2].Round(time.Millisecond), boot[0].Round(time.Millisecond), boot[4].Round(time.Millisecond),
		stop[2].Round(time.Millisecond), stop[4].Round(time.Millisecond))
	checkMarker()
}
