package runtime_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
)

// A VMM whose cgroup keeps a process stuck in the kernel after the unit
// stopped (the seed's troubleshooting row: storage that does not answer;
// here a writer blocked on a frozen filesystem, moved into the VMM's
// cgroup): the stop waits STOPPING and logs "instance cleanup pending"
// for as long as it takes, and completes on its own once the process can
// end.
func TestCleanupPending(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	rt := h.mustOpen(t)
	const id = "vm-c"
	st, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, MemoryMiB: 256, DiskMiB: 16})
	if err != nil {
		t.Fatal(err)
	}
	_, mnt, _ := stuckInVMMCgroup(ctx, t, h, st.Unit)

	stopped := make(chan error, 1)
	t0 := time.Now()
	go func() { stopped <- rt.Stop(ctx, id, time.Second) }()
	testenv.WaitFor(t, 90*time.Second, "instance cleanup pending in the node log", func() (bool, string) {
		return strings.Contains(h.logs.String(), `"msg":"instance cleanup pending"`), ""
	})
	t.Logf("stop → instance cleanup pending: %v", time.Since(t0).Round(time.Millisecond))
	if s, _ := rt.Status(id); s.State != runtime.StateStopping {
		t.Fatalf("while the cgroup holds the stuck process: %s, want STOPPING", s.State)
	}
	select {
	case err := <-stopped:
		t.Fatalf("the stop returned while its cgroup holds a process: %v", err)
	default:
	}
	thaw(mnt)
	t1 := time.Now()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop after the process could end: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the stop did not complete after the stuck process could end")
	}
	t.Logf("thaw → stop complete: %v", time.Since(t1).Round(time.Millisecond))
	if s, _ := rt.Status(id); s.State != runtime.StateStopped {
		t.Errorf("after the cleanup: %s, want STOPPED", s.State)
	}
	if !strings.Contains(h.logs.String(), `"msg":"instance cleanup done"`) {
		t.Error("the node did not log instance cleanup done")
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// stuckInVMMCgroup starts a writer on a frozen filesystem, waits until it
// is stuck in the kernel and moves it into the cgroup of the VMM unit
// named unit: a process that unit's stop cannot end. It returns the
// writer, the frozen mount and the unit; the test's end thaws the mount
// and waits for the writer.
func stuckInVMMCgroup(ctx context.Context, t *testing.T, h *harness, unit string) (*exec.Cmd, string, units.Unit) {
	t.Helper()
	mnt := frozenFS(t, h.scratch)
	writer := exec.Command("/bin/sh", "-c", "echo x > "+filepath.Join(mnt, "f"))
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		thaw(mnt)
		if writer.ProcessState == nil {
			writer.Wait()
		}
	})
	testenv.WaitFor(t, 10*time.Second, "the writer blocked on the frozen filesystem", func() (bool, string) {
		st := testenv.ProcState(writer.Process.Pid)
		return st == "D", "process state " + strconv.Quote(st)
	})
	u, err := h.m.Get(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.m.CgroupPath(u), "cgroup.procs"), []byte(strconv.Itoa(writer.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move the stuck writer into the VMM's cgroup: %v", err)
	}
	return writer, mnt, u
}

// frozenFS mounts a small ext4 image under dir and freezes it: a write to
// it blocks in the kernel (uninterruptible) until thaw.
func frozenFS(t *testing.T, dir string) string {
	t.Helper()
	mkfs := testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	img, mnt := filepath.Join(dir, "stuck.img"), filepath.Join(dir, "stuck")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(8 << 20)
	f.Close()
	if out, err := exec.Command(mkfs, "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	os.MkdirAll(mnt, 0o755)
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop: %v: %s", err, out)
	}
	t.Cleanup(func() {
		thaw(mnt)
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, 0xC0045877, 0); err != nil { // FIFREEZE
		t.Fatalf("freeze %s: %v", mnt, err)
	}
	return mnt
}

// thaw thaws a filesystem frozenFS froze (once thawed, EINVAL: fine).
func thaw(mnt string) {
	if fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
		unix.IoctlSetInt(fd, 0xC0045878, 0) // FITHAW
		unix.Close(fd)
	}
}
