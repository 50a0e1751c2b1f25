package e2e

// The two-node Workspace test: two hosts of the lab, each running its own
// `kibotos serve --systemd private` (real QEMU under TCG in a private
// systemd that ends with the member), sharing one storage pool directory.
// Everything is asserted through the CLI and its exit codes.

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// TestWorkspacesTwoNodes: placement by free capacity and overcommit, --node
// on a drained node, workspace move across a shared pool, drain --wait,
// and isolate of a dead node whose Workspace then starts on the other.
// Four VM boots in all.
func TestWorkspacesTwoNodes(t *testing.T) {
	t0 := time.Now()
	l, a, b, root := mhTwoHosts(t)

	artifacts := mhBuildArtifacts(t, root, l.Bin)
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}

	// node-a creates the cluster; node-b joins with a grant, node role only
	// (so the ctrl quorum survives node-b's death).
	if r := a.Kibotos("init", "--data-dir", a.DataDir, "--advertise", a.Addr(), "--node-id", a.NodeID, "--roles", a.Roles); r.Code != 0 {
		t.Fatal(r)
	}
	clusterlab.InstallArtifacts(t, artifacts, a)
	// "mobile" is a standalone pool whose disk is on node-b first and
	// moves to node-a (its directory renamed) after node-b's isolate;
	// node-a declares it from the start, unavailable until then. "gone"
	// is node-b's alone, and its disk is lost.
	aMobile, bMobile, bGone := filepath.Join(root, "a-mobile"), filepath.Join(root, "b-mobile"), filepath.Join(root, "b-gone")
	for _, d := range []string{bMobile, bGone} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	clusterlab.StartServeConfig(a, clusterlab.WriteConfig(t, a, shared, [2]string{"mobile", aMobile}))
	(&clusterlab.Cluster{Lab: l}).WaitFollowsLeader(t, a)
	grant := a.Kibo("enrollment", "grant", b.NodeID, "--roles", b.Roles)
	if grant.Code != 0 {
		t.Fatal(grant)
	}
	if r := b.Kibotos("join", "--data-dir", b.DataDir, "--advertise", b.Addr(), "--grant", strings.TrimSpace(grant.Stdout), a.Addr()); r.Code != 0 {
		t.Fatal(r)
	}
	clusterlab.InstallArtifacts(t, artifacts, b)
	clusterlab.StartServeConfig(b, clusterlab.WriteConfig(t, b, shared, [2]string{"mobile", bMobile}, [2]string{"gone", bGone}))
	for _, h := range l.Hosts {
		clusterlab.WaitNodeReport(t, a, h.NodeID, 30*time.Second, "ready for Workspaces", clusterlab.ReadyForWorkspaces)
	}
	admin := a // the CLI runs in node-a's namespace with node-a's credentials
	// The shared pool exists at ctrl with both hosts as members; its
	// capacity is ctrl's to set, and without one it takes no layer.
	if r := admin.Kibo("workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB", "--no-wait"); r.Code != api.ExitResourceExhausted || !strings.Contains(r.Stderr, "no capacity set") {
		t.Fatalf("create before the shared pool has a capacity: %s", r)
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "set-capacity", "shared", "100GiB")
	if list := strings.Join(strings.Fields(clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "list").Stdout), " "); !strings.Contains(list, "shared shared node-a,node-b 100.0GiB 0.0B 100.0GiB") {
		t.Fatalf("storage-pool list:\n%s", list)
	}
	t.Logf("cluster ready in %s", time.Since(t0).Round(time.Millisecond))

	var w1, w2 string
	other := map[string]string{a.NodeID: b.NodeID, b.NodeID: a.NodeID}

	// 0. A Workspace whose policy names an Egress leaves only through it.
	t.Run("Egress", func(t *testing.T) { mhEgress(t, l, admin, a.NodeID, b.NodeID) })

	// 1. Placement spreads by free capacity; overcommit is respected.
	t.Run("PlacementAndOvercommit", func(t *testing.T) {
		t1 := time.Now()
		// Each with a Volume made along with it, in its node's default
		// pool: the shared one.
		create := func(cpu string) api.Workspace {
			t.Helper()
			var ws api.Workspace
			if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "workspace", "create", "--template", template.DefaultName, "--cpu", cpu, "--memory", "256MiB",
				"--new-volume", "64MiB:/data", "--no-wait", "--json"), &ws); err != nil {
				t.Fatal(err)
			}
			return ws
		}
		// Both are placed by ctrl at once; they boot side by side.
		first := create("1")
		second := create("1")
		w1, w2 = first.WorkspaceID, second.WorkspaceID
		if first.NodeID == "" || second.NodeID != other[first.NodeID] {
			t.Fatalf("placement did not spread: W1 on %q, W2 on %q (want the other node)", first.NodeID, second.NodeID)
		}
		for _, ws := range []api.Workspace{first, second} {
			got := clusterlab.WaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceAvailable, clusterlab.BootTimeout)
			if got.NodeID != ws.NodeID || got.Layer == nil || got.Layer.PoolID != "shared" || !got.Layer.Shared {
				t.Fatalf("after boot: want on %s with its layer in the shared pool, got %s", ws.NodeID, clusterlab.WorkspaceString(got))
			}
			if v := mhVolume(t, admin, ws.WorkspaceID+"-1"); v.State != api.VolumeAvailable || v.PoolID != "shared" || !v.Held || v.NodeID != ws.NodeID {
				t.Fatalf("the Volume made with %s: want AVAILABLE in the shared pool, held by %s, got %+v", ws.WorkspaceID, ws.NodeID, v)
			}
		}
		t.Logf("W1 %s on %s, W2 %s on %s, both AVAILABLE in %s", w1, first.NodeID, w2, second.NodeID, time.Since(t1).Round(time.Millisecond))

		// Each node has 1 of 2 cores left: 2 cores fit nowhere.
		before := clusterlab.ListAll(t, admin)
		clusterlab.ExpectExit(t, admin, api.ExitResourceExhausted, "create of 2 cores with 1 free on each node",
			"workspace", "create", "--template", template.DefaultName, "--cpu", "2", "--memory", "256MiB", "--no-wait")
		if after := clusterlab.ListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("a refused create changed the Workspaces: before %v, after %v", before, after)
		}

		// A cpu multiplier of 2 on node-b: 4 schedulable, 3 free.
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "overcommit", "set", b.NodeID, "--cpu", "2")
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 10*time.Second, "with cpu overcommit 2 acknowledged", func(n clusterlab.NodeReport) bool {
			return n.Overcommit != nil && n.Overcommit.CPU == 2000 && n.Overcommit.Acknowledged && n.Schedulable != nil && n.Schedulable.CPU == 4000
		})
		// The placement is ctrl's decision, in the create's answer. The
		// probe's template is listed everywhere but unusable, so node-b
		// fails it at once instead of booting a fifth VM.
		var probe api.Workspace
		if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "workspace", "create", "--template", "mh-probe", "--cpu", "2", "--memory", "256MiB", "--no-wait", "--json"), &probe); err != nil {
			t.Fatal(err)
		}
		if probe.NodeID != b.NodeID {
			t.Fatalf("with overcommit 2 on %s a 2-core create must land there, got %s", b.NodeID, clusterlab.WorkspaceString(probe))
		}
		failed := clusterlab.WaitWorkspace(t, admin, probe.WorkspaceID, api.WorkspaceFailed, 30*time.Second)
		if failed.Failure == nil || failed.Failure.Reason != api.FailureStart || !strings.Contains(failed.Failure.Message, b.NodeID) {
			t.Fatalf("the probe must fail to start on %s (its template image is unusable), got %s", b.NodeID, clusterlab.WorkspaceString(failed))
		}
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "workspace", "delete", probe.WorkspaceID, "--timeout", "30s")
		if after := clusterlab.ListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("after deleting the probe: want %v, got %v", before, after)
		}
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "overcommit", "set", b.NodeID, "--cpu", "default")
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 10*time.Second, "back at the default overcommit, acknowledged", func(n clusterlab.NodeReport) bool {
			return n.Overcommit != nil && n.Overcommit.CPU == 1000 && n.Overcommit.Acknowledged
		})
	})
	if t.Failed() {
		return
	}
	// From here on W1 runs on node-a and W2 on node-b (swap the names when
	// the first create went to node-b).
	if ws := clusterlab.GetWorkspace(t, admin, w1); ws.NodeID != a.NodeID {
		w1, w2 = w2, w1
	}

	// 2. --node to a drained node fails and never falls back.
	t.Run("PinnedToDrainedNode", func(t *testing.T) {
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "drain", b.NodeID)
		before := clusterlab.ListAll(t, admin)
		clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "create --node of a drained node",
			"workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB", "--node", b.NodeID)
		if after := clusterlab.ListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("create --node of a drained node changed the Workspaces: before %v, after %v", before, after)
		}
		// W2 (on node-b) stops normally on a drained node.
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "stop", w2)
		stopped := clusterlab.GetWorkspace(t, admin, w2)
		clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "start --node of a drained node", "workspace", "start", w2, "--node", b.NodeID)
		if ws := clusterlab.GetWorkspace(t, admin, w2); ws.State != api.WorkspaceStopped || ws.NodeID != "" || ws.Version != stopped.Version {
			t.Fatalf("after a refused start --node: want STOPPED, unchanged (version %d), got %s", stopped.Version, clusterlab.WorkspaceString(ws))
		}
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "cancel-drain", b.NodeID)
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 10*time.Second, "READY again", func(n clusterlab.NodeReport) bool { return n.Status == api.NodeReady && !n.DrainRequested })
	})
	if t.Failed() {
		return
	}

	// 3 and 4. drain --wait times out while W1 runs on node-a; move W1 to
	// node-b (its layer is in the shared pool, so its data goes along);
	// then node-a drains.
	t.Run("DrainWaitAndMove", func(t *testing.T) {
		t1 := time.Now()
		clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "echo moved > /root/m; echo on-volume > /data/m; sync")
		clusterlab.ExpectExit(t, admin, api.ExitTimedOut, "drain --wait of a node running W1", "node", "drain", a.NodeID, "--wait", "--timeout", "5s")
		var draining clusterlab.NodeReport
		admin.MustKiboJSON(&draining, "node", "get", a.NodeID, "--consistent")
		if draining.Status != api.NodeDraining || !draining.DrainRequested {
			t.Fatalf("after drain --wait timed out: want DRAINING with drain requested, got %s", draining)
		}
		if left := clusterlab.ListAll(t, admin, "--node", a.NodeID); !slices.Equal(left, []string{w1}) {
			t.Fatalf("workspace list --node %s: want [%s], got %v", a.NodeID, w1, left)
		}

		before := clusterlab.GetWorkspace(t, admin, w1)
		cmdID := "mh-move-" + l.Prefix
		r := clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "move", w1, "--node", b.NodeID, "--command-id", cmdID)
		moved := clusterlab.GetWorkspace(t, admin, w1)
		if moved.State != api.WorkspaceAvailable || moved.NodeID != b.NodeID || moved.InstanceID == "" || moved.InstanceID == before.InstanceID {
			t.Fatalf("after move: want AVAILABLE on %s with a new Instance (was %s), got %s (%s)", b.NodeID, before.InstanceID, clusterlab.WorkspaceString(moved), r)
		}
		t.Logf("moved %s from %s to %s in %s", w1, a.NodeID, b.NodeID, time.Since(t1).Round(time.Millisecond))
		got := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/root/m", "/data/m")
		if got.Stdout != "moved\non-volume\n" {
			t.Fatalf("after move: /root/m and /data/m hold %q, want \"moved\" and \"on-volume\"", got.Stdout)
		}
		// Grown online on node-b: the guest's filesystem shows it at once.
		dfBefore := mhDataKiB(t, admin, w1)
		t2 := time.Now()
		clusterlab.Must(t, admin, 60*time.Second, "volume", "resize", w1+"-1", "--size", "256MiB")
		after := mhDataKiB(t, admin, w1)
		if dfBefore > 64<<10 || after < 200<<10 {
			t.Fatalf("df /data in W1: %d KiB before the resize to 256MiB, %d KiB after", dfBefore, after)
		}
		t.Logf("online resize 64MiB -> 256MiB seen by df in the guest: %d KiB -> %d KiB (%s)", dfBefore, after, time.Since(t2).Round(time.Millisecond))
		// The same command id again: already on the target, no stop/start.
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "move", w1, "--node", b.NodeID, "--command-id", cmdID)
		if again := clusterlab.GetWorkspace(t, admin, w1); again.Version != moved.Version || again.InstanceID != moved.InstanceID || again.State != api.WorkspaceAvailable {
			t.Fatalf("rerun of move %s: want nothing changed (%s), got %s", cmdID, clusterlab.WorkspaceString(moved), clusterlab.WorkspaceString(again))
		}

		if left := clusterlab.ListAll(t, admin, "--node", a.NodeID); len(left) != 0 {
			t.Fatalf("workspace list --node %s after the move: want none, got %v", a.NodeID, left)
		}
		r = clusterlab.Must(t, admin, 70*time.Second, "node", "drain", a.NodeID, "--wait", "--timeout", "60s", "--json")
		var n clusterlab.NodeReport
		if err := clusterlab.DecodeResult(r, &n); err != nil {
			t.Fatal(err)
		}
		if n.Status != api.NodeDrained {
			t.Fatalf("drain --wait: want DRAINED, got %s", n)
		}
		clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "cancel-drain", a.NodeID)
		clusterlab.WaitNodeReport(t, admin, a.NodeID, 10*time.Second, "READY again", func(n clusterlab.NodeReport) bool { return n.Status == api.NodeReady && !n.DrainRequested })
	})
	if t.Failed() {
		return
	}

	// 4b. W1 paused on node-b resumes on node-a through the shared pool
	// (its process counting on), then back on node-b.
	t.Run("PauseResumeAcrossHosts", func(t *testing.T) {
		clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 & echo $! > /tmp/counter.pid")
		pid := strings.TrimSpace(clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/tmp/counter.pid").Stdout)
		for _, to := range []string{a.NodeID, b.NodeID} {
			from := clusterlab.GetWorkspace(t, admin, w1).NodeID
			t1 := time.Now()
			clusterlab.Must(t, admin, 60*time.Second, "workspace", "pause", w1)
			tPause := time.Since(t1)
			if ws := clusterlab.GetWorkspace(t, admin, w1); ws.State != api.WorkspacePaused || ws.Snapshot == nil || ws.Snapshot.NodeID != from || ws.Snapshot.PoolID != "shared" {
				t.Fatalf("after pause on %s: %s", from, clusterlab.WorkspaceString(ws))
			}
			t1 = time.Now()
			clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "resume", w1, "--node", to)
			got := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "kill -0 "+pid+" && echo alive; cat /data/m")
			t.Logf("paused on %s in %s, resumed on %s to the first exec answer in %s", from, tPause.Round(time.Millisecond), to, time.Since(t1).Round(time.Millisecond))
			if ws := clusterlab.GetWorkspace(t, admin, w1); ws.State != api.WorkspaceAvailable || ws.NodeID != to || got.Stdout != "alive\non-volume\n" {
				t.Fatalf("resumed on %s: %s, exec %q", to, clusterlab.WorkspaceString(ws), got.Stdout)
			}
		}
		clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "kill", pid)
	})
	if t.Failed() {
		return
	}

	// Volumes in node-b's standalone pools: its private one, "mobile"
	// (stamped with a marker file) and "gone". A Workspace with one can
	// start on node-b alone.
	var solo, mv api.Volume
	t.Run("StandaloneVolumes", func(t *testing.T) {
		for _, pool := range []string{"mobile", "gone", b.NodeID + ":default"} {
			clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "set-capacity", pool, "1GiB")
		}
		clusterlab.Must(t, admin, 60*time.Second, "volume", "create", "mv", "--size", "32MiB", "--pool", "mobile", "--node", b.NodeID)
		clusterlab.Must(t, admin, 60*time.Second, "volume", "create", "gv", "--size", "32MiB", "--pool", "gone")
		clusterlab.Must(t, admin, 60*time.Second, "volume", "create", "solo", "--size", "32MiB", "--pool", b.NodeID+":default")
		solo, mv = mhVolume(t, admin, "solo"), mhVolume(t, admin, "mv")
		if solo.PoolID != b.NodeID+":default" || mv.NodeID != b.NodeID || mhVolume(t, admin, "gv").NodeID != b.NodeID {
			t.Fatalf("volumes: solo %+v, mv %+v", solo, mv)
		}
		marker := filepath.Join(root, "marker")
		os.WriteFile(marker, []byte("moved disk\n"), 0o644)
		if out, err := exec.Command("debugfs", "-w", "-R", "write "+marker+" marker", api.VolumeFilePath(bMobile, mv.VolumeID)).CombinedOutput(); err != nil {
			t.Fatalf("debugfs write into mv: %v: %s", err, out)
		}
		r := clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "create --node node-a with a Volume of node-b's standalone pool",
			"workspace", "create", "--template", template.DefaultName, "--memory", "256MiB", "--volume", "mv:/mv", "--node", a.NodeID, "--no-wait")
		if !strings.Contains(r.Stderr, "its volume mv is in pool mobile of node "+b.NodeID) {
			t.Errorf("refusal: %s", r)
		}
	})
	if t.Failed() {
		return
	}

	// 5. node-b is cut off with W1 running on it (its member and VM go on):
	// isolate releases W1's layer in the shared pool, W1 starts on node-a
	// with its data, and node-b, without any contact with ctrl, sees from
	// the layer's holder record in the pool that it was handed over and
	// stops its VM within seconds.
	t.Run("IsolateCutOffNode", func(t *testing.T) {
		t1 := time.Now()
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 10*time.Second, "READY", func(n clusterlab.NodeReport) bool { return n.Status == api.NodeReady })
		if ws := clusterlab.GetWorkspace(t, admin, w1); ws.State != api.WorkspaceAvailable || ws.NodeID != b.NodeID {
			t.Fatalf("before the crash: want W1 AVAILABLE on %s, got %s", b.NodeID, clusterlab.WorkspaceString(ws))
		}
		if len(clusterlab.QemuPIDs(b.DataDir)) == 0 {
			t.Fatalf("no QEMU of %s runs although W1 is AVAILABLE there", b.NodeID)
		}
		// The guest keeps writing to its layer until it is stopped.
		clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "(while :; do date >> /root/writer; date >> /data/writer; sync; sleep 0.2; done) >/dev/null 2>&1 &")
		b.Partition()
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 20*time.Second, "NOT_READY with its session ended", func(n clusterlab.NodeReport) bool {
			return n.Status == api.NodeNotReady && n.Session != nil && !n.Session.Alive
		})
		r := clusterlab.Must(t, admin, clusterlab.CLITimeout, "node", "isolate", b.NodeID, "--confirm-host-cannot-write", "--json")
		var res api.IsolateResult
		if err := clusterlab.DecodeResult(r, &res); err != nil {
			t.Fatal(err)
		}
		if res.WorkspacesFailed != 1 || res.RetainedLayersReleased != 1 || res.VolumesReleased != 1 {
			t.Fatalf("isolate %s: want 1 Workspace failed, 1 retained layer and 1 Volume released, got %+v", b.NodeID, res)
		}
		ws := clusterlab.GetWorkspace(t, admin, w1)
		if ws.State != api.WorkspaceFailed || ws.Failure == nil || ws.Failure.Reason != api.FailureUnavailable || ws.NodeID != "" {
			t.Fatalf("after isolate: want W1 FAILED (UNAVAILABLE) with no node, got %s", clusterlab.WorkspaceString(ws))
		}
		if len(clusterlab.QemuPIDs(b.DataDir)) == 0 {
			t.Fatalf("the VM of cut-off %s ended before its layer was handed over", b.NodeID)
		}
		// No --node: the shared pool lets ctrl pick node-a, whose holder
		// record of the layer is node-b's cue.
		handover := time.Now()
		started := make(chan clusterlab.Result, 1)
		go func() { started <- admin.KiboTimeout(clusterlab.BootTimeout, "workspace", "start", w1) }()
		if left := clusterlab.WaitNoQemu(t, b.DataDir, 20*time.Second); len(left) > 0 {
			t.Fatalf("QEMU of cut-off %s still runs 20s after W1 was handed to %s: %v", b.NodeID, a.NodeID, left)
		}
		t.Logf("TIMING handover to the old writer stopped: %s", time.Since(handover).Round(time.Millisecond))
		if r := <-started; r.Code != 0 {
			t.Fatalf("start after isolate: %s", r)
		}
		if p := b.ServeProc(); !p.LogContains("storage object handed to another node") {
			t.Errorf("%s's log has no line about its layer handed over:\n%s", b.NodeID, clusterlab.Tail(p.Log, 30))
		}
		ws = clusterlab.GetWorkspace(t, admin, w1)
		if ws.State != api.WorkspaceAvailable || ws.NodeID != a.NodeID {
			t.Fatalf("start after isolate: want AVAILABLE on %s, got %s", a.NodeID, clusterlab.WorkspaceString(ws))
		}
		got := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/root/m", "/data/m")
		if got.Stdout != "moved\non-volume\n" {
			t.Fatalf("after the restart on %s: /root/m and /data/m hold %q", a.NodeID, got.Stdout)
		}
		// What node-b's writer put on the Volume is whole lines; stopped,
		// the file on disk is what the guest read and the filesystem is
		// clean: no write of the old holder came after the handover.
		r = clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "wc -l < /data/writer; grep -vc '^[A-Z][a-z][a-z] ' /data/writer; sha256sum /data/writer")
		f := strings.Fields(r.Stdout)
		if len(f) < 3 || f[0] == "0" || f[1] != "0" {
			t.Fatalf("/data/writer after the handover: lines, malformed lines, checksum: %q", r.Stdout)
		}
		inGuest := f[2]
		v1 := mhVolume(t, admin, w1+"-1")
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "stop", w1)
		img := api.VolumeFilePath(shared, v1.VolumeID)
		if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
			t.Fatalf("e2fsck -fn of W1's Volume after the handover: %v\n%s", err, out)
		}
		onDisk, err := exec.Command("debugfs", "-R", "cat /writer", img).Output()
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(onDisk)); got != inGuest {
			t.Fatalf("/data/writer: sha256 %s on disk, %s as the guest read it", got, inGuest)
		}
		t.Logf("isolate and restart on %s in %s; /data/writer: %s lines, clean filesystem", a.NodeID, time.Since(t1).Round(time.Millisecond), f[0])

		// W2 (stopped; layer and Volume in the shared pool, last on node-b)
		// is deleted by node-a without waiting for node-b: no file is left.
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "delete", w2)
		v2 := mhVolume(t, admin, w2+"-1")
		clusterlab.Must(t, admin, 60*time.Second, "volume", "delete", v2.Name)
		for _, f := range []string{api.VolumeFilePath(shared, v2.VolumeID), filepath.Join(shared, "layers", w2+".qcow2")} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Errorf("%s after W2 and its Volume were deleted on %s: %v", f, a.NodeID, err)
			}
		}
	})
	if t.Failed() {
		return
	}

	// 6. node-b's standalone pools after its isolate: the delete of a
	// Volume in its private pool waits until node-b is back, then leaves
	// no file; "mobile", whose disk moved to node-a, serves a Workspace
	// there with its data; "gone", whose disk is lost, is declared lost.
	t.Run("PoolsAfterIsolate", func(t *testing.T) {
		var v api.Volume
		if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "volume", "delete", "solo", "--json"), &v); err != nil {
			t.Fatal(err)
		}
		if v.State != api.VolumeDeleting || v.Pending != nil || v.DeleteWaitsForPool != b.NodeID+":default" {
			t.Fatalf("delete of solo after isolate: want DELETING, waiting for pool %s:default, got %+v", b.NodeID, v)
		}
		soloFile := api.VolumeFilePath(filepath.Join(datadir.Dir(b.DataDir).StorageRoot(), "pools", "default"), solo.VolumeID)
		if _, err := os.Stat(soloFile); err != nil {
			t.Fatalf("solo's file while its delete waits: %v", err)
		}

		// The disk of "mobile" moves to node-a.
		if err := os.Rename(bMobile, aMobile); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 20*time.Second, "node-a reports pool mobile available", func() (bool, string) {
			var p api.StoragePool
			admin.MustKiboJSON(&p, "storage-pool", "get", "mobile")
			for _, m := range p.Nodes {
				if m.NodeID == a.NodeID && m.Available {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", p.Nodes)
		})
		r := clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "create", "--template", template.DefaultName, "--memory", "256MiB", "--volume", "mv:/mv", "-q")
		w3 := strings.TrimSpace(r.Stdout)
		if ws := clusterlab.GetWorkspace(t, admin, w3); ws.NodeID != a.NodeID {
			t.Fatalf("the Workspace with mv: want it on %s, got %s", a.NodeID, clusterlab.WorkspaceString(ws))
		}
		if got := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", w3, "--", "cat", "/mv/marker"); got.Stdout != "moved disk\n" {
			t.Fatalf("/mv/marker on %s: %q", a.NodeID, got.Stdout)
		}
		clusterlab.Must(t, admin, clusterlab.BootTimeout, "workspace", "delete", w3)

		// The disk of "gone" is lost; node-b comes back without it.
		os.RemoveAll(bGone)
		p := b.ServeProc()
		b.Heal()
		if _, ok := p.WaitExit(60 * time.Second); !ok {
			t.Fatalf("isolated %s did not exit once it reached ctrl again:\n%s", b.NodeID, clusterlab.Tail(p.Log, 20))
		}
		clusterlab.StartServeConfig(b, clusterlab.WriteConfig(t, b, shared))
		clusterlab.WaitNodeReport(t, admin, b.NodeID, 60*time.Second, "READY with a new incarnation", func(n clusterlab.NodeReport) bool { return n.Status == api.NodeReady && !n.Isolated })
		testenv.WaitFor(t, 30*time.Second, "solo deleted by node-b", func() (bool, string) {
			r := admin.Kibo("volume", "get", "solo")
			return r.Code == api.ExitNotFound, r.String()
		})
		if _, err := os.Stat(soloFile); !os.IsNotExist(err) {
			t.Errorf("solo's file after node-b came back and deleted it: %v", err)
		}

		var lost api.PoolLostResult
		if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "declare-lost", "gone", "--confirm-data-lost", "--json"), &lost); err != nil {
			t.Fatal(err)
		}
		if lost.Volumes != 1 {
			t.Errorf("declare-lost gone: %+v, want 1 Volume lost", lost)
		}
		if v := mhVolume(t, admin, "gv"); v.State != api.VolumeLost {
			t.Errorf("gv after declare-lost: %+v", v)
		}
		if out := clusterlab.Must(t, admin, clusterlab.CLITimeout, "volume", "delete", "gv").Stdout; !strings.Contains(out, "deleted") {
			t.Errorf("delete of a lost Volume: %q", out)
		}
	})
	// 7. An application on a third host, holding only the API URL, the CA
	// file and a key of its namespace.
	t.Run("RemoteClient", func(t *testing.T) { mhRemoteClient(t, l, a) })
	t.Logf("whole test %s", time.Since(t0).Round(time.Millisecond))
}
