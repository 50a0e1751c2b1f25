package privsd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

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

func TestMain(m *testing.M) {
	privsd.RunIfInit()
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
