package privsd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// A detached private systemd outlives the Instance value that started it
// (as kibotos dev's outlives a dev process): Attach finds it by its PID
// file, its units are still there, a user that lets it go (Release) leaves
// it running, and Stop through the attached value ends it and removes its
// cgroup.
func TestDetachedAttach(t *testing.T) {
	requirePrivsd(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := privsd.Attach(ctx, dir); !errors.Is(err, privsd.ErrNotRunning) {
		t.Fatalf("attach before start: %v, want privsd.ErrNotRunning", err)
	}
	first, err := privsd.StartWith(ctx, dir, privsd.Options{Detached: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Stop() })
	m, err := units.Connect(ctx, first.Target())
	if err != nil {
		t.Fatal(err)
	}
	u, err := m.StartVMM(ctx, units.Spec{Name: "kibotos-vmm-detached.service", Argv: []string{"/bin/sleep", "300"}})
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	again, err := privsd.Attach(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.PID != first.PID || again.CgroupRoot != first.CgroupRoot {
		t.Fatalf("attached to %+v, started %+v", again, first)
	}
	user, err := privsd.Attach(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	user.Release()
	m2, err := units.Connect(ctx, again.Target())
	if err != nil {
		t.Fatal(err)
	}
	got, err := m2.Get(ctx, u.Name)
	m2.Close()
	if err != nil || got.InvocationID != u.InvocationID {
		t.Fatalf("unit after attach: %+v, %v; want invocation %s", got, err, u.InvocationID)
	}
	if err := again.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(again.CgroupRoot); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cgroup %s after Stop: %v", again.CgroupRoot, err)
	}
	if _, err := privsd.Attach(ctx, dir); !errors.Is(err, privsd.ErrNotRunning) {
		t.Fatalf("attach after stop: %v, want privsd.ErrNotRunning", err)
	}
}

// childEnv makes the test binary a process that starts a detached private
// systemd in the named directory and exits at once.
const childEnv = "KIBOTOS_PRIVSD_TEST_DETACH"

// attachedEnv makes the test binary a process that starts a private
// systemd tied to it in the named directory, prints its PID and waits to
// be killed.
const attachedEnv = "KIBOTOS_PRIVSD_TEST_ATTACHED"

// noDeathSignalEnv makes that process start it without the parent-death
// signal.
const noDeathSignalEnv = "KIBOTOS_PRIVSD_TEST_NO_DEATH_SIGNAL"

func TestMain(m *testing.M) {
	privsd.RunIfInit()
	if dir := os.Getenv(attachedEnv); dir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := privsd.Start
		if os.Getenv(noDeathSignalEnv) != "" {
			start = privsd.StartWithoutDeathSignal
		}
		inst, err := start(ctx, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(inst.PID)
		select {}
	}
	if dir := os.Getenv(childEnv); dir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := privsd.StartWith(ctx, dir, privsd.Options{Detached: true}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The process that started a detached private systemd exits; the systemd
// keeps running and a later process attaches to it.
func TestDetachedOutlivesItsStarter(t *testing.T) {
	requirePrivsd(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("starter process: %v: %s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := privsd.Attach(ctx, dir)
	if err != nil {
		t.Fatalf("attach after the starter exited: %v", err)
	}
	t.Cleanup(func() { inst.Stop() })
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
}

// startAttached runs the test binary as a process that starts a private
// systemd tied to it in dir (env: more of its environment), and returns
// that process, still running, and the private systemd's PID.
func startAttached(t *testing.T, dir string, env ...string) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), attachedEnv+"="+dir), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("starter process printed no PID: %v", err)
	}
	return cmd, pid
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil && testenv.ProcState(pid) != "Z" }

// A private systemd that is not detached ends with the process that
// started it, also when that process is killed (kill -9 of a member
// serving with --systemd private): its VMs end with it, and the next
// start in the same directory finds nothing running.
func TestAttachedEndsWithItsStarter(t *testing.T) {
	requirePrivsd(t)
	dir := t.TempDir()
	starter, pid := startAttached(t, dir)
	starter.Process.Signal(syscall.SIGKILL)
	starter.Wait()
	if !testenv.Poll(t, 15*time.Second, func() bool { return !alive(pid) }) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("private systemd (pid %d) still runs after its starter was killed", pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, err := privsd.StartWith(ctx, dir, privsd.Options{})
	if err != nil {
		t.Fatalf("start again in the same directory: %v", err)
	}
	if inst.EndedLeftover != 0 {
		t.Errorf("the next start ended PID %d: nothing was left to end", inst.EndedLeftover)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}
}

// Should one outlive its starter all the same (seen by the fault harness,
// nemesis: a member killed while it started a VM left its private systemd
// running, and every restart was refused "seems to run already"), the
// next start in the directory ends it, with whatever runs in it, and
// starts anew. One whose starter still runs is never touched.
func TestLeftoverOfADeadStarterIsEnded(t *testing.T) {
	requirePrivsd(t)
	dir := t.TempDir()
	starter, pid := startAttached(t, dir, noDeathSignalEnv+"=1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := privsd.StartWith(ctx, dir, privsd.Options{}); err == nil || !strings.Contains(err.Error(), "still runs") {
		t.Errorf("start while its starter runs: %v, want refused (the starter still runs)", err)
	}
	starter.Process.Signal(syscall.SIGKILL)
	starter.Wait()
	t.Cleanup(func() {
		if alive(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if !alive(pid) {
		t.Fatalf("private systemd (pid %d) started without the death signal ended with its starter", pid)
	}
	inst, err := privsd.StartWith(ctx, dir, privsd.Options{})
	if err != nil {
		t.Fatalf("start after the starter died: %v", err)
	}
	defer inst.Stop()
	if inst.EndedLeftover != pid || alive(pid) {
		t.Errorf("ended leftover %d (alive: %v), want %d ended", inst.EndedLeftover, alive(pid), pid)
	}
	if err := inst.Stop(); err != nil {
		t.Fatal(err)
	}

	// EndLeftover ends one without starting anew (a test lab's cleanup).
	starter, pid = startAttached(t, dir, noDeathSignalEnv+"=1")
	starter.Process.Signal(syscall.SIGKILL)
	starter.Wait()
	if ended, err := privsd.EndLeftover(dir); ended != pid || err != nil || alive(pid) {
		t.Errorf("EndLeftover: %d, %v (alive: %v); want %d ended", ended, err, alive(pid), pid)
	}
	if ended, err := privsd.EndLeftover(dir); ended != 0 || err != nil {
		t.Errorf("EndLeftover with nothing left: %d, %v", ended, err)
	}
}
