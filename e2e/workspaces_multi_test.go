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

	artifacts := mhBuildArtifacts(t, root, l.bin)
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}

	// node-a creates the cluster; node-b joins with a grant, node role only
	// (so the ctrl quorum survives node-b's death).
	if r := a.kibotos("init", "--data-dir", a.dataDir, "--advertise", a.addr(), "--node-id", a.nodeID, "--roles", a.roles); r.code != 0 {
		t.Fatal(r)
	}
	mhInstallArtifacts(t, artifacts, a)
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
	mhStartServe(a, mhWriteConfig(t, a, shared, [2]string{"mobile", aMobile}))
	(&cluster{lab: l}).waitFollowsLeader(t, a)
	grant := a.kibo("enrollment", "grant", b.nodeID, "--roles", b.roles)
	if grant.code != 0 {
		t.Fatal(grant)
	}
	if r := b.kibotos("join", "--data-dir", b.dataDir, "--advertise", b.addr(), "--grant", strings.TrimSpace(grant.stdout), a.addr()); r.code != 0 {
		t.Fatal(r)
	}
	mhInstallArtifacts(t, artifacts, b)
	mhStartServe(b, mhWriteConfig(t, b, shared, [2]string{"mobile", bMobile}, [2]string{"gone", bGone}))
	for _, h := range l.hosts {
		mhWaitNode(t, a, h.nodeID, 30*time.Second, "ready for Workspaces", mhReadyForWorkspaces)
	}
	admin := a // the CLI runs in node-a's namespace with node-a's credentials
	// The shared pool exists at ctrl with both hosts as members; its
	// capacity is ctrl's to set, and without one it takes no layer.
	if r := admin.kibo("workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB", "--no-wait"); r.code != api.ExitResourceExhausted || !strings.Contains(r.stderr, "no capacity set") {
		t.Fatalf("create before the shared pool has a capacity: %s", r)
	}
	mhMust(t, admin, cliTimeout, "storage-pool", "set-capacity", "shared", "100GiB")
	if list := strings.Join(strings.Fields(mhMust(t, admin, cliTimeout, "storage-pool", "list").stdout), " "); !strings.Contains(list, "shared shared node-a,node-b 100.0GiB 0.0B 100.0GiB") {
		t.Fatalf("storage-pool list:\n%s", list)
	}
	t.Logf("cluster ready in %s", time.Since(t0).Round(time.Millisecond))

	var w1, w2 string
	other := map[string]string{a.nodeID: b.nodeID, b.nodeID: a.nodeID}

	// 0. A Workspace whose policy names an Egress leaves only through it.
	t.Run("Egress", func(t *testing.T) { mhEgress(t, l, admin, a.nodeID, b.nodeID) })

	// 1. Placement spreads by free capacity; overcommit is respected.
	t.Run("PlacementAndOvercommit", func(t *testing.T) {
		t1 := time.Now()
		// Each with a Volume made along with it, in its node's default
		// pool: the shared one.
		create := func(cpu string) api.Workspace {
			t.Helper()
			var ws api.Workspace
			if err := decodeResult(mhMust(t, admin, cliTimeout, "workspace", "create", "--template", template.DefaultName, "--cpu", cpu, "--memory", "256MiB",
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
			got := mhWaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceAvailable, mhBootTimeout)
			if got.NodeID != ws.NodeID || got.Layer == nil || got.Layer.PoolID != "shared" || !got.Layer.Shared {
				t.Fatalf("after boot: want on %s with its layer in the shared pool, got %s", ws.NodeID, mhWSString(got))
			}
			if v := mhVolume(t, admin, ws.WorkspaceID+"-1"); v.State != api.VolumeAvailable || v.PoolID != "shared" || !v.Held || v.NodeID != ws.NodeID {
				t.Fatalf("the Volume made with %s: want AVAILABLE in the shared pool, held by %s, got %+v", ws.WorkspaceID, ws.NodeID, v)
			}
		}
		t.Logf("W1 %s on %s, W2 %s on %s, both AVAILABLE in %s", w1, first.NodeID, w2, second.NodeID, time.Since(t1).Round(time.Millisecond))

		// Each node has 1 of 2 cores left: 2 cores fit nowhere.
		before := mhListAll(t, admin)
		mhExpectExit(t, admin, api.ExitResourceExhausted, "create of 2 cores with 1 free on each node",
			"workspace", "create", "--template", template.DefaultName, "--cpu", "2", "--memory", "256MiB", "--no-wait")
		if after := mhListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("a refused create changed the Workspaces: before %v, after %v", before, after)
		}

		// A cpu multiplier of 2 on node-b: 4 schedulable, 3 free.
		mhMust(t, admin, cliTimeout, "node", "overcommit", "set", b.nodeID, "--cpu", "2")
		mhWaitNode(t, admin, b.nodeID, 10*time.Second, "with cpu overcommit 2 acknowledged", func(n mhNode) bool {
			return n.Overcommit != nil && n.Overcommit.CPU == 2000 && n.Overcommit.Acknowledged && n.Schedulable != nil && n.Schedulable.CPU == 4000
		})
		// The placement is ctrl's decision, in the create's answer. The
		// probe's template is listed everywhere but unusable, so node-b
		// fails it at once instead of booting a fifth VM.
		var probe api.Workspace
		if err := decodeResult(mhMust(t, admin, cliTimeout, "workspace", "create", "--template", "mh-probe", "--cpu", "2", "--memory", "256MiB", "--no-wait", "--json"), &probe); err != nil {
			t.Fatal(err)
		}
		if probe.NodeID != b.nodeID {
			t.Fatalf("with overcommit 2 on %s a 2-core create must land there, got %s", b.nodeID, mhWSString(probe))
		}
		failed := mhWaitWorkspace(t, admin, probe.WorkspaceID, api.WorkspaceFailed, 30*time.Second)
		if failed.Failure == nil || failed.Failure.Reason != api.FailureStart || !strings.Contains(failed.Failure.Message, b.nodeID) {
			t.Fatalf("the probe must fail to start on %s (its template image is unusable), got %s", b.nodeID, mhWSString(failed))
		}
		mhMust(t, admin, cliTimeout, "workspace", "delete", probe.WorkspaceID, "--timeout", "30s")
		if after := mhListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("after deleting the probe: want %v, got %v", before, after)
		}
		mhMust(t, admin, cliTimeout, "node", "overcommit", "set", b.nodeID, "--cpu", "default")
		mhWaitNode(t, admin, b.nodeID, 10*time.Second, "back at the default overcommit, acknowledged", func(n mhNode) bool {
			return n.Overcommit != nil && n.Overcommit.CPU == 1000 && n.Overcommit.Acknowledged
		})
	})
	if t.Failed() {
		return
	}
	// From here on W1 runs on node-a and W2 on node-b (swap the names when
	// the first create went to node-b).
	if ws := mhWorkspace(t, admin, w1); ws.NodeID != a.nodeID {
		w1, w2 = w2, w1
	}

	// 2. --node to a drained node fails and never falls back.
	t.Run("PinnedToDrainedNode", func(t *testing.T) {
		mhMust(t, admin, cliTimeout, "node", "drain", b.nodeID)
		before := mhListAll(t, admin)
		mhExpectExit(t, admin, api.ExitFailedPrecondition, "create --node of a drained node",
			"workspace", "create", "--template", template.DefaultName, "--cpu", "1", "--memory", "256MiB", "--node", b.nodeID)
		if after := mhListAll(t, admin); !slices.Equal(before, after) {
			t.Fatalf("create --node of a drained node changed the Workspaces: before %v, after %v", before, after)
		}
		// W2 (on node-b) stops normally on a drained node.
		mhMust(t, admin, mhBootTimeout, "workspace", "stop", w2)
		stopped := mhWorkspace(t, admin, w2)
		mhExpectExit(t, admin, api.ExitFailedPrecondition, "start --node of a drained node", "workspace", "start", w2, "--node", b.nodeID)
		if ws := mhWorkspace(t, admin, w2); ws.State != api.WorkspaceStopped || ws.NodeID != "" || ws.Version != stopped.Version {
			t.Fatalf("after a refused start --node: want STOPPED, unchanged (version %d), got %s", stopped.Version, mhWSString(ws))
		}
		mhMust(t, admin, cliTimeout, "node", "cancel-drain", b.nodeID)
		mhWaitNode(t, admin, b.nodeID, 10*time.Second, "READY again", func(n mhNode) bool { return n.Status == api.NodeReady && !n.DrainRequested })
	})
	if t.Failed() {
		return
	}

	// 3 and 4. drain --wait times out while W1 runs on node-a; move W1 to
	// node-b (its layer is in the shared pool, so its data goes along);
	// then node-a drains.
	t.Run("DrainWaitAndMove", func(t *testing.T) {
		t1 := time.Now()
		mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "echo moved > /root/m; echo on-volume > /data/m; sync")
		mhExpectExit(t, admin, api.ExitTimedOut, "drain --wait of a node running W1", "node", "drain", a.nodeID, "--wait", "--timeout", "5s")
		var draining mhNode
		admin.mustKiboJSON(&draining, "node", "get", a.nodeID, "--consistent")
		if draining.Status != api.NodeDraining || !draining.DrainRequested {
			t.Fatalf("after drain --wait timed out: want DRAINING with drain requested, got %s", draining)
		}
		if left := mhListAll(t, admin, "--node", a.nodeID); !slices.Equal(left, []string{w1}) {
			t.Fatalf("workspace list --node %s: want [%s], got %v", a.nodeID, w1, left)
		}

		before := mhWorkspace(t, admin, w1)
		cmdID := "mh-move-" + l.prefix
		r := mhMust(t, admin, mhBootTimeout, "workspace", "move", w1, "--node", b.nodeID, "--command-id", cmdID)
		moved := mhWorkspace(t, admin, w1)
		if moved.State != api.WorkspaceAvailable || moved.NodeID != b.nodeID || moved.InstanceID == "" || moved.InstanceID == before.InstanceID {
			t.Fatalf("after move: want AVAILABLE on %s with a new Instance (was %s), got %s (%s)", b.nodeID, before.InstanceID, mhWSString(moved), r)
		}
		t.Logf("moved %s from %s to %s in %s", w1, a.nodeID, b.nodeID, time.Since(t1).Round(time.Millisecond))
		got := mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/root/m", "/data/m")
		if got.stdout != "moved\non-volume\n" {
			t.Fatalf("after move: /root/m and /data/m hold %q, want \"moved\" and \"on-volume\"", got.stdout)
		}
		// Grown online on node-b: the guest's filesystem shows it at once.
		dfBefore := mhDataKiB(t, admin, w1)
		t2 := time.Now()
		mhMust(t, admin, 60*time.Second, "volume", "resize", w1+"-1", "--size", "256MiB")
		after := mhDataKiB(t, admin, w1)
		if dfBefore > 64<<10 || after < 200<<10 {
			t.Fatalf("df /data in W1: %d KiB before the resize to 256MiB, %d KiB after", dfBefore, after)
		}
		t.Logf("online resize 64MiB -> 256MiB seen by df in the guest: %d KiB -> %d KiB (%s)", dfBefore, after, time.Since(t2).Round(time.Millisecond))
		// The same command id again: already on the target, no stop/start.
		mhMust(t, admin, mhBootTimeout, "workspace", "move", w1, "--node", b.nodeID, "--command-id", cmdID)
		if again := mhWorkspace(t, admin, w1); again.Version != moved.Version || again.InstanceID != moved.InstanceID || again.State != api.WorkspaceAvailable {
			t.Fatalf("rerun of move %s: want nothing changed (%s), got %s", cmdID, mhWSString(moved), mhWSString(again))
		}

		if left := mhListAll(t, admin, "--node", a.nodeID); len(left) != 0 {
			t.Fatalf("workspace list --node %s after the move: want none, got %v", a.nodeID, left)
		}
		r = mhMust(t, admin, 70*time.Second, "node", "drain", a.nodeID, "--wait", "--timeout", "60s", "--json")
		var n mhNode
		if err := decodeResult(r, &n); err != nil {
			t.Fatal(err)
		}
		if n.Status != api.NodeDrained {
			t.Fatalf("drain --wait: want DRAINED, got %s", n)
		}
		mhMust(t, admin, cliTimeout, "node", "cancel-drain", a.nodeID)
		mhWaitNode(t, admin, a.nodeID, 10*time.Second, "READY again", func(n mhNode) bool { return n.Status == api.NodeReady && !n.DrainRequested })
	})
	if t.Failed() {
		return
	}

	// 4b. W1 paused on node-b resumes on node-a through the shared pool
	// (its process counting on), then back on node-b.
	t.Run("PauseResumeAcrossHosts", func(t *testing.T) {
		mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 & echo $! > /tmp/counter.pid")
		pid := strings.TrimSpace(mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/tmp/counter.pid").stdout)
		for _, to := range []string{a.nodeID, b.nodeID} {
			from := mhWorkspace(t, admin, w1).NodeID
			t1 := time.Now()
			mhMust(t, admin, 60*time.Second, "workspace", "pause", w1)
			tPause := time.Since(t1)
			if ws := mhWorkspace(t, admin, w1); ws.State != api.WorkspacePaused || ws.Snapshot == nil || ws.Snapshot.NodeID != from || ws.Snapshot.PoolID != "shared" {
				t.Fatalf("after pause on %s: %s", from, mhWSString(ws))
			}
			t1 = time.Now()
			mhMust(t, admin, mhBootTimeout, "workspace", "resume", w1, "--node", to)
			got := mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "kill -0 "+pid+" && echo alive; cat /data/m")
			t.Logf("paused on %s in %s, resumed on %s to the first exec answer in %s", from, tPause.Round(time.Millisecond), to, time.Since(t1).Round(time.Millisecond))
			if ws := mhWorkspace(t, admin, w1); ws.State != api.WorkspaceAvailable || ws.NodeID != to || got.stdout != "alive\non-volume\n" {
				t.Fatalf("resumed on %s: %s, exec %q", to, mhWSString(ws), got.stdout)
			}
		}
		mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "kill", pid)
	})
	if t.Failed() {
		return
	}

	// Volumes in node-b's standalone pools: its private one, "mobile"
	// (stamped with a marker file) and "gone". A Workspace with one can
	// start on node-b alone.
	var solo, mv api.Volume
	t.Run("StandaloneVolumes", func(t *testing.T) {
		for _, pool := range []string{"mobile", "gone", b.nodeID + ":default"} {
			mhMust(t, admin, cliTimeout, "storage-pool", "set-capacity", pool, "1GiB")
		}
		mhMust(t, admin, 60*time.Second, "volume", "create", "mv", "--size", "32MiB", "--pool", "mobile", "--node", b.nodeID)
		mhMust(t, admin, 60*time.Second, "volume", "create", "gv", "--size", "32MiB", "--pool", "gone")
		mhMust(t, admin, 60*time.Second, "volume", "create", "solo", "--size", "32MiB", "--pool", b.nodeID+":default")
		solo, mv = mhVolume(t, admin, "solo"), mhVolume(t, admin, "mv")
		if solo.PoolID != b.nodeID+":default" || mv.NodeID != b.nodeID || mhVolume(t, admin, "gv").NodeID != b.nodeID {
			t.Fatalf("volumes: solo %+v, mv %+v", solo, mv)
		}
		marker := filepath.Join(root, "marker")
		os.WriteFile(marker, []byte("moved disk\n"), 0o644)
		if out, err := exec.Command("debugfs", "-w", "-R", "write "+marker+" marker", api.VolumeFilePath(bMobile, mv.VolumeID)).CombinedOutput(); err != nil {
			t.Fatalf("debugfs write into mv: %v: %s", err, out)
		}
		r := mhExpectExit(t, admin, api.ExitFailedPrecondition, "create --node node-a with a Volume of node-b's standalone pool",
			"workspace", "create", "--template", template.DefaultName, "--memory", "256MiB", "--volume", "mv:/mv", "--node", a.nodeID, "--no-wait")
		if !strings.Contains(r.stderr, "its volume mv is in pool mobile of node "+b.nodeID) {
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
		mhWaitNode(t, admin, b.nodeID, 10*time.Second, "READY", func(n mhNode) bool { return n.Status == api.NodeReady })
		if ws := mhWorkspace(t, admin, w1); ws.State != api.WorkspaceAvailable || ws.NodeID != b.nodeID {
			t.Fatalf("before the crash: want W1 AVAILABLE on %s, got %s", b.nodeID, mhWSString(ws))
		}
		if len(mhQemuPIDs(b.dataDir)) == 0 {
			t.Fatalf("no QEMU of %s runs although W1 is AVAILABLE there", b.nodeID)
		}
		// The guest keeps writing to its layer until it is stopped.
		mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "(while :; do date >> /root/writer; date >> /data/writer; sync; sleep 0.2; done) >/dev/null 2>&1 &")
		b.partition()
		mhWaitNode(t, admin, b.nodeID, 20*time.Second, "NOT_READY with its session ended", func(n mhNode) bool {
			return n.Status == api.NodeNotReady && n.Session != nil && !n.Session.Alive
		})
		r := mhMust(t, admin, cliTimeout, "node", "isolate", b.nodeID, "--confirm-host-cannot-write", "--json")
		var res api.IsolateResult
		if err := decodeResult(r, &res); err != nil {
			t.Fatal(err)
		}
		if res.WorkspacesFailed != 1 || res.RetainedLayersReleased != 1 || res.VolumesReleased != 1 {
			t.Fatalf("isolate %s: want 1 Workspace failed, 1 retained layer and 1 Volume released, got %+v", b.nodeID, res)
		}
		ws := mhWorkspace(t, admin, w1)
		if ws.State != api.WorkspaceFailed || ws.Failure == nil || ws.Failure.Reason != api.FailureUnavailable || ws.NodeID != "" {
			t.Fatalf("after isolate: want W1 FAILED (UNAVAILABLE) with no node, got %s", mhWSString(ws))
		}
		if len(mhQemuPIDs(b.dataDir)) == 0 {
			t.Fatalf("the VM of cut-off %s ended before its layer was handed over", b.nodeID)
		}
		// No --node: the shared pool lets ctrl pick node-a, whose holder
		// record of the layer is node-b's cue.
		handover := time.Now()
		started := make(chan result, 1)
		go func() { started <- admin.kiboTimeout(mhBootTimeout, "workspace", "start", w1) }()
		if left := mhWaitNoQemu(t, b.dataDir, 20*time.Second); len(left) > 0 {
			t.Fatalf("QEMU of cut-off %s still runs 20s after W1 was handed to %s: %v", b.nodeID, a.nodeID, left)
		}
		t.Logf("TIMING handover to the old writer stopped: %s", time.Since(handover).Round(time.Millisecond))
		if r := <-started; r.code != 0 {
			t.Fatalf("start after isolate: %s", r)
		}
		if p := b.serveProc(); !p.logContains("storage object handed to another node") {
			t.Errorf("%s's log has no line about its layer handed over:\n%s", b.nodeID, tail(p.log, 30))
		}
		ws = mhWorkspace(t, admin, w1)
		if ws.State != api.WorkspaceAvailable || ws.NodeID != a.nodeID {
			t.Fatalf("start after isolate: want AVAILABLE on %s, got %s", a.nodeID, mhWSString(ws))
		}
		got := mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "cat", "/root/m", "/data/m")
		if got.stdout != "moved\non-volume\n" {
			t.Fatalf("after the restart on %s: /root/m and /data/m hold %q", a.nodeID, got.stdout)
		}
		// What node-b's writer put on the Volume is whole lines; stopped,
		// the file on disk is what the guest read and the filesystem is
		// clean: no write of the old holder came after the handover.
		r = mhMust(t, admin, 60*time.Second, "workspace", "exec", w1, "--", "sh", "-c", "wc -l < /data/writer; grep -vc '^[A-Z][a-z][a-z] ' /data/writer; sha256sum /data/writer")
		f := strings.Fields(r.stdout)
		if len(f) < 3 || f[0] == "0" || f[1] != "0" {
			t.Fatalf("/data/writer after the handover: lines, malformed lines, checksum: %q", r.stdout)
		}
		inGuest := f[2]
		v1 := mhVolume(t, admin, w1+"-1")
		mhMust(t, admin, mhBootTimeout, "workspace", "stop", w1)
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
		t.Logf("isolate and restart on %s in %s; /data/writer: %s lines, clean filesystem", a.nodeID, time.Since(t1).Round(time.Millisecond), f[0])

		// W2 (stopped; layer and Volume in the shared pool, last on node-b)
		// is deleted by node-a without waiting for node-b: no file is left.
		mhMust(t, admin, mhBootTimeout, "workspace", "delete", w2)
		v2 := mhVolume(t, admin, w2+"-1")
		mhMust(t, admin, 60*time.Second, "volume", "delete", v2.Name)
		for _, f := range []string{api.VolumeFilePath(shared, v2.VolumeID), filepath.Join(shared, "layers", w2+".qcow2")} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Errorf("%s after W2 and its Volume were deleted on %s: %v", f, a.nodeID, err)
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
		if err := decodeResult(mhMust(t, admin, cliTimeout, "volume", "delete", "solo", "--json"), &v); err != nil {
			t.Fatal(err)
		}
		if v.State != api.VolumeDeleting || v.Pending != nil || v.DeleteWaitsForPool != b.nodeID+":default" {
			t.Fatalf("delete of solo after isolate: want DELETING, waiting for pool %s:default, got %+v", b.nodeID, v)
		}
		soloFile := api.VolumeFilePath(filepath.Join(datadir.Dir(b.dataDir).StorageRoot(), "pools", "default"), solo.VolumeID)
		if _, err := os.Stat(soloFile); err != nil {
			t.Fatalf("solo's file while its delete waits: %v", err)
		}

		// The disk of "mobile" moves to node-a.
		if err := os.Rename(bMobile, aMobile); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 20*time.Second, "node-a reports pool mobile available", func() (bool, string) {
			var p api.StoragePool
			admin.mustKiboJSON(&p, "storage-pool", "get", "mobile")
			for _, m := range p.Nodes {
				if m.NodeID == a.nodeID && m.Available {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", p.Nodes)
		})
		r := mhMust(t, admin, mhBootTimeout, "workspace", "create", "--template", template.DefaultName, "--memory", "256MiB", "--volume", "mv:/mv", "-q")
		w3 := strings.TrimSpace(r.stdout)
		if ws := mhWorkspace(t, admin, w3); ws.NodeID != a.nodeID {
			t.Fatalf("the Workspace with mv: want it on %s, got %s", a.nodeID, mhWSString(ws))
		}
		if got := mhMust(t, admin, 60*time.Second, "workspace", "exec", w3, "--", "cat", "/mv/marker"); got.stdout != "moved disk\n" {
			t.Fatalf("/mv/marker on %s: %q", a.nodeID, got.stdout)
		}
		mhMust(t, admin, mhBootTimeout, "workspace", "delete", w3)

		// The disk of "gone" is lost; node-b comes back without it.
		os.RemoveAll(bGone)
		p := b.serveProc()
		b.heal()
		if _, ok := p.waitExit(60 * time.Second); !ok {
			t.Fatalf("isolated %s did not exit once it reached ctrl again:\n%s", b.nodeID, tail(p.log, 20))
		}
		mhStartServe(b, mhWriteConfig(t, b, shared))
		mhWaitNode(t, admin, b.nodeID, 60*time.Second, "READY with a new incarnation", func(n mhNode) bool { return n.Status == api.NodeReady && !n.Isolated })
		testenv.WaitFor(t, 30*time.Second, "solo deleted by node-b", func() (bool, string) {
			r := admin.kibo("volume", "get", "solo")
			return r.code == api.ExitNotFound, r.String()
		})
		if _, err := os.Stat(soloFile); !os.IsNotExist(err) {
			t.Errorf("solo's file after node-b came back and deleted it: %v", err)
		}

		var lost api.PoolLostResult
		if err := decodeResult(mhMust(t, admin, cliTimeout, "storage-pool", "declare-lost", "gone", "--confirm-data-lost", "--json"), &lost); err != nil {
			t.Fatal(err)
		}
		if lost.Volumes != 1 {
			t.Errorf("declare-lost gone: %+v, want 1 Volume lost", lost)
		}
		if v := mhVolume(t, admin, "gv"); v.State != api.VolumeLost {
			t.Errorf("gv after declare-lost: %+v", v)
		}
		if out := mhMust(t, admin, cliTimeout, "volume", "delete", "gv").stdout; !strings.Contains(out, "deleted") {
			t.Errorf("delete of a lost Volume: %q", out)
		}
	})
	// 7. An application on a third host, holding only the API URL, the CA
	// file and a key of its namespace.
	t.Run("RemoteClient", func(t *testing.T) { mhRemoteClient(t, l, a) })
	t.Logf("whole test %s", time.Since(t0).Round(time.Millisecond))
}
