package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// A stopped Instance no Workspace owns (a pause saved it, then its delete
// failed) is deleted by the node's next sweep; a stopped one a Workspace
// still owns (a stop between its two steps) is left to its command.
func TestSweepDeletesStoppedInstancesOfNoWorkspace(t *testing.T) {
	runtimetest.RequireVMHost(t)
	scratch, err := os.MkdirTemp("/tmp", "kbu-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	_, units := runtimetest.Systemd(t, filepath.Join(scratch, "sd"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dd := datadir.Dir(filepath.Join(scratch, "d"))
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: dd.StorageRoot(), NodeID: "node-a", Units: units, Accel: qemu.AccelAuto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	inst := runtimetest.Platform(t)
	for _, id := range []string{"inst-unowned", "inst-owned"} {
		if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256}); err != nil {
			t.Fatal(err)
		}
		if err := rt.ForceStop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	a := &Agent{cfg: Config{NodeID: "node-a", DataDir: dd, Runtime: rt}, log: slog.New(slog.NewTextHandler(&logs, nil))}
	a.initTasks()
	a.tasks.owners["inst-owned"] = "ws-1"

	a.deleteUnowned(ctx)
	if st, err := rt.Status("inst-unowned"); err == nil {
		t.Errorf("the stopped Instance of no Workspace is still there after a sweep: %s\n%s", st.State, logs.String())
	}
	if st, err := rt.Status("inst-owned"); err != nil || st.State != runtime.StateStopped {
		t.Errorf("the sweep touched a stopped Instance a Workspace owns: %v, %v", st.State, err)
	}
	if err := rt.Delete(ctx, "inst-owned"); err != nil {
		t.Fatal(err)
	}
}
