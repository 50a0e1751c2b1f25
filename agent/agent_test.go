package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func TestMain(m *testing.M) {
	privsd.RunIfInit()
	code := m.Run()
	runtimetest.Cleanup()
	os.Exit(code)
}

// A node reports the Instances it runs (so drain stays DRAINING), and when
// its old incarnation comes back after isolate it destroys them all and
// exits; its next incarnation is accepted with nothing running.
func TestInstancesInReportsAndIsolationDestroysThem(t *testing.T) {
	runtimetest.RequireVMHost(t)
	inst := runtimetest.Platform(t)
	scratch, err := os.MkdirTemp("/tmp", "kba-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	_, units := runtimetest.Systemd(t, filepath.Join(scratch, "sd"))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: filepath.Join(scratch, "s"), NodeID: "node-2", Units: units, Accel: qemu.AccelAuto})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })

	o := clustertest.Options{Ctrl: 1, NodeOnly: 1, Runtimes: map[string]*runtime.Runtime{"node-2": rt}}
	c := clustertest.New(t, o)
	leader, node := c.Members[0], c.Members[1]
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: "vm-1", Installation: inst, VCPUs: 1, MemoryMiB: 256, DiskMiB: 64}); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		if err != nil || n.Report == nil {
			return false, "no report"
		}
		r := n.Report
		return r.Instances == 1 && r.Allocated.CPU == 1000 && r.Allocated.MemoryBytes == 256<<20, "report " + strconv.Itoa(r.Instances)
	})
	var drained api.Node
	if _, err := c.Client(leader).Do(ctx, "POST", "/v1/nodes/node-2/drain", api.NodeWriteRequest{}, &drained); err != nil {
		t.Fatal(err)
	}
	if drained.Status != api.NodeDraining {
		t.Fatalf("drain of a node running an Instance: status %s, want DRAINING", drained.Status)
	}

	// The node process dies; the operator isolates it; the same
	// incarnation comes back (as a process that was only cut off would).
	inc := node.Agent.Incarnation()
	node.Kill()
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		return err == nil && !n.Session.Alive, "session alive"
	})
	if _, err := c.Client(leader).Do(ctx, "POST", "/v1/nodes/node-2/isolate", api.NodeWriteRequest{ConfirmHostCannotWrite: true}, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(node.Dir.NodeDir(), "incarnation"), []byte(strconv.FormatUint(inc-1, 10)), 0o600); err != nil {
		t.Fatal(err)
	}
	node.Restart(o)
	if node.Agent.Incarnation() != inc {
		t.Fatalf("restarted with incarnation %d, want the old %d", node.Agent.Incarnation(), inc)
	}
	err, exited := node.WaitAgentExit(2 * time.Minute)
	if !exited || !errors.Is(err, agent.ErrIsolated) {
		t.Fatalf("old incarnation after isolate: exited=%v err=%v, want ErrIsolated", exited, err)
	}
	if l := rt.List(); len(l) != 0 {
		t.Fatalf("Instances left after isolation: %+v", l)
	}
	if vms, err := units.List(ctx, runtime.UnitPrefix+"*"); err != nil || len(vms) != 0 {
		t.Fatalf("VMM units left after isolation: %v %v", vms, err)
	}

	// The next incarnation clears isolation; the node runs nothing.
	node.Stop()
	node.Restart(o)
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		if err != nil || n.Session == nil {
			return false, "no session"
		}
		return n.Session.Alive && !n.Isolated && n.Session.Incarnation > inc && n.Report != nil && n.Report.Instances == 0, n.Status
	})
}
