package e2e

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
)

// testDrain: an operator on the node-only member's host drains a ctrl
// node (the write is forwarded to the leader), replays the command id and
// cancels the drain.
func testDrain(t *testing.T, c *clusterlab.Cluster) {
	target := c.Ctrls[1].NodeID
	cmdID := "e2e-drain-" + c.Prefix
	drain := func() (clusterlab.NodeView, bool) {
		r := c.Node.Kibo("node", "drain", target, "--command-id", cmdID, "--json")
		if r.Code != 0 {
			t.Fatal(r)
		}
		var n clusterlab.NodeView
		var body struct {
			Replayed bool `json:"replayed"`
		}
		if err := clusterlab.DecodeResult(r, &n); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(r.Stdout), &body); err != nil {
			t.Fatal(err)
		}
		return n, body.Replayed
	}
	first, replayed := drain()
	if !first.DrainRequested || replayed {
		t.Fatalf("first drain: want drain_requested and not replayed, got %s replayed=%v", first, replayed)
	}
	if n, err := c.Node.GetNode(target); err != nil || !n.DrainRequested {
		t.Fatalf("node get after drain: %s %v", n, err)
	}
	again, replayed := drain()
	if !replayed || again.RegistrationVersion != first.RegistrationVersion {
		t.Fatalf("replay of %s: want replayed with the first result (version %d), got %s replayed=%v", cmdID, first.RegistrationVersion, again, replayed)
	}
	if r := c.Node.Kibo("node", "cancel-drain", target); r.Code != 0 {
		t.Fatal(r)
	}
	clusterlab.WaitNode(t, c.Node, target, 5*time.Second, "READY with no drain requested", func(n clusterlab.NodeView) bool {
		return !n.DrainRequested && n.Status == api.NodeReady
	})
}

// testIsolate: isolate is refused while the node-only member holds its
// session; once it is cut off and its session ended, isolate succeeds, the
// old process is refused when the network heals and exits 13, and a
// restart (new incarnation) clears the isolation.
func testIsolate(t *testing.T, c *clusterlab.Cluster) {
	victim, admin := c.Node, c.Ctrls[0]
	before := clusterlab.WaitNode(t, admin, victim.NodeID, 10*time.Second, "READY", func(n clusterlab.NodeView) bool {
		return n.Status == api.NodeReady && n.Session != nil && n.Session.Alive
	})
	if r := admin.Kibo("node", "isolate", victim.NodeID, "--confirm-host-cannot-write"); r.Code != api.ExitFailedPrecondition {
		t.Fatalf("isolate with a live session: want exit %d, got %s", api.ExitFailedPrecondition, r)
	}

	victim.Partition()
	healed := false
	defer func() {
		if !healed {
			victim.Heal() // leave the network whole for whatever runs next
		}
	}()
	clusterlab.WaitNode(t, admin, victim.NodeID, 10*time.Second, "NOT_READY with its session ended", func(n clusterlab.NodeView) bool {
		return n.Status == api.NodeNotReady && n.Session != nil && !n.Session.Alive
	})
	if r := admin.Kibo("node", "isolate", victim.NodeID, "--confirm-host-cannot-write"); r.Code != 0 {
		t.Fatal(r)
	}
	if n, err := admin.GetNode(victim.NodeID, "--consistent"); err != nil || n.Status != api.NodeIsolated || !n.Isolated {
		t.Fatalf("after isolate: want ISOLATED, got %s %v", n, err)
	}

	old := victim.ServeProc()
	victim.Heal()
	healed = true
	// The agent backs off up to ~6.4 s between attempts while cut off.
	code, ok := old.WaitExit(20 * time.Second)
	if !ok {
		t.Fatalf("isolated member %s (pid %d) still runs 20s after the network healed", victim.NodeID, old.Cmd.Process.Pid)
	}
	if code != api.ExitFailedPrecondition || !old.LogContains("node isolated") {
		t.Fatalf("isolated member exited %d (want %d), log has \"node isolated\": %v", code, api.ExitFailedPrecondition, old.LogContains("node isolated"))
	}

	victim.StartServe()
	after := clusterlab.WaitNode(t, admin, victim.NodeID, 15*time.Second, "READY again with a new incarnation", func(n clusterlab.NodeView) bool {
		return n.Status == api.NodeReady && !n.Isolated && n.Session != nil && n.Session.Alive
	})
	if after.Session.Incarnation <= before.Session.Incarnation {
		t.Fatalf("incarnation after restart %d, want more than %d", after.Session.Incarnation, before.Session.Incarnation)
	}
}
