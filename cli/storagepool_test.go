package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// Storage pools through the CLI: a node's private pool appears under its
// id with capacity "-" and takes no Workspace (15, nothing created) until
// set-capacity; the template's image size is charged to it; declare-lost
// refuses a pool a node still has.
func TestStoragePoolCommands(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NoPoolCapacity: true, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails: no VMs
		r.TemplateBytes = map[string]uint64{"kibotos-coding": 3 << 30}
	}})
	list := squash(e.mustRun("storage-pool", "list"))
	if want := "ID SHARED NODES CAPACITY USED AVAILABLE node-1:default standalone node-1 - 0.0B -"; list != want {
		t.Fatalf("list:\n%q\nwant\n%q", list, want)
	}
	e.expectExit(api.ExitResourceExhausted, "no capacity set (kibo storage-pool set-capacity POOL SIZE)",
		"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q")
	if ids := e.mustRun("workspace", "list", "-q"); ids != "" {
		t.Fatalf("a refused create left Workspaces: %q", ids)
	}
	get := e.mustRun("storage-pool", "get", "node-1:default")
	if !strings.Contains(get, "Capacity:        - (not set: no new objects; kibo storage-pool set-capacity node-1:default SIZE)") || !strings.Contains(get, "node-1") {
		t.Fatalf("get:\n%s", get)
	}

	e.expectExit(api.ExitUsage, `size "lots": not a size`, "storage-pool", "set-capacity", "node-1:default", "lots")
	e.expectExit(api.ExitInvalidArgument, "capacity 0 is out of range", "storage-pool", "set-capacity", "node-1:default", "0")
	e.expectExit(api.ExitNotFound, "storage pool nowhere does not exist", "storage-pool", "set-capacity", "nowhere", "1GiB")
	e.expectExit(api.ExitVersionMismatch, "storage pool node-1:default is at version 1, not the expected 7", "storage-pool", "set-capacity", "node-1:default", "1GiB", "--expected-version", "7")
	if out := e.mustRun("storage-pool", "set-capacity", "node-1:default", "5GiB", "--expected-version", "1"); out != "storage pool node-1:default: capacity 5.0GiB, used 0.0B, available 5.0GiB (version 2)\n" {
		t.Fatalf("set-capacity: %q", out)
	}
	e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q", "--command-id", "w1")
	if list := squash(e.mustRun("storage-pool", "list", "--wide")); !strings.Contains(list, "node-1:default standalone node-1 5.0GiB 3.0GiB 2.0GiB 1 0 2") {
		t.Fatalf("list after one layer:\n%s", list)
	}
	e.expectExit(api.ExitResourceExhausted, "storage pool is full",
		"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q")

	e.expectExit(api.ExitUsage, "add --confirm-data-lost", "storage-pool", "declare-lost", "node-1:default")
	e.expectExit(api.ExitFailedPrecondition, "storage pool node-1:default is still declared by node node-1", "storage-pool", "declare-lost", "node-1:default", "--confirm-data-lost")
	e.expectExit(api.ExitInvalidArgument, "storage pool id \"Bad Pool\" is not valid", "storage-pool", "get", "Bad Pool")
}

// workspace list --pool shows a pool's Workspaces; move checks the
// layer's pool before it stops anything: a layer in node-1's private pool
// cannot go to node-2, which does not reach it.
func TestMoveChecksTheLayersPool(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed; the start fails: no VMs
	}})
	ws := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--node", "node-1", "--no-wait", "-q"))
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		w := e.wsJSON(ws)
		return w.State == api.WorkspaceFailed && w.Layer != nil, w.State
	})
	before := e.wsJSON(ws)
	// Which Workspaces a pool holds.
	if ids := e.mustRun("workspace", "list", "--all", "--pool", "node-1:default", "-q"); strings.TrimSpace(ids) != ws {
		t.Errorf("workspace list --pool node-1:default: %q, want %s", ids, ws)
	}
	if ids := e.mustRun("workspace", "list", "--all", "--pool", "node-2:default", "-q"); ids != "" {
		t.Errorf("workspace list --pool node-2:default: %q, want none", ids)
	}
	e.expectExit(api.ExitInvalidArgument, `storage pool id "Bad" is not valid`, "workspace", "list", "--pool", "Bad")
	e.expectExit(api.ExitUsage, "cannot be combined with --state, --label or --pool", "workspace", "list", "--node", "node-1", "--pool", "node-1:default")
	e.expectExit(api.ExitFailedPrecondition, "its writable layer is in pool node-1:default, which node node-2 does not report available; the Workspace is unchanged",
		"workspace", "move", ws, "--node", "node-2")
	if after := e.wsJSON(ws); after.Version != before.Version {
		t.Errorf("a refused move changed the Workspace: version %d → %d", before.Version, after.Version)
	}
}
