package clusterlab

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

// BootTimeout bounds one command that waits for a VM to boot (about 4 s
// of CPU under TCG; two may boot at once on two cores).
const BootTimeout = 90 * time.Second

// NodeReport is the part of `kibo node get --json` this test looks at.
type NodeReport struct {
	NodeID         string `json:"node_id"`
	Status         string `json:"status"`
	DrainRequested bool   `json:"drain_requested"`
	Isolated       bool   `json:"isolated"`
	Session        *struct {
		Alive bool `json:"alive"`
	} `json:"session"`
	Report *struct {
		Instances        int        `json:"instances"`
		Pools            []api.Pool `json:"pools"`
		DefaultPool      string     `json:"default_pool"`
		DataPlaneAddress string     `json:"data_plane_address"`
	} `json:"report"`
	Overcommit *struct {
		CPU          api.Milli `json:"cpu"`
		Acknowledged bool      `json:"acknowledged"`
	} `json:"overcommit"`
	Schedulable *api.Resources `json:"schedulable"`
}

// ReadyForWorkspaces: READY, reported (with the shared pool and a data
// plane) and its overcommit values acknowledged: ctrl places nothing on a
// node before.
func ReadyForWorkspaces(n NodeReport) bool {
	if n.Status != api.NodeReady || n.Report == nil || n.Report.DataPlaneAddress == "" || n.Overcommit == nil || !n.Overcommit.Acknowledged {
		return false
	}
	for _, p := range n.Report.Pools {
		if p.PoolID == "shared" && p.Shared && p.Available {
			return n.Report.DefaultPool == "shared"
		}
	}
	return false
}

// WaitNodeReport polls `node get --consistent` through admin until cond holds.
func WaitNodeReport(t *testing.T, admin *Host, id string, d time.Duration, what string, cond func(NodeReport) bool) NodeReport {
	t.Helper()
	var got NodeReport
	testenv.WaitFor(t, d, "node "+id+" "+what, func() (bool, string) {
		var n NodeReport
		if err := admin.KiboJSON(&n, "node", "get", id, "--consistent"); err != nil {
			return false, err.Error()
		}
		got = n
		return cond(n), n.String()
	})
	return got
}

// GetWorkspace reads one Workspace; it fails the test when it cannot.
func GetWorkspace(t *testing.T, admin *Host, id string) api.Workspace {
	t.Helper()
	var ws api.Workspace
	if err := admin.KiboJSON(&ws, "workspace", "get", id, "--consistent"); err != nil {
		t.Fatal(err)
	}
	return ws
}

func WorkspaceString(ws api.Workspace) string {
	s := fmt.Sprintf("%s state=%s node=%q instance=%q version=%d", ws.WorkspaceID, ws.State, ws.NodeID, ws.InstanceID, ws.Version)
	if ws.Failure != nil {
		s += fmt.Sprintf(" failure{%s: %s}", ws.Failure.Reason, ws.Failure.Message)
	}
	if ws.Layer != nil {
		s += fmt.Sprintf(" layer{node=%s pool=%s shared=%v held=%v}", ws.Layer.NodeID, ws.Layer.PoolID, ws.Layer.Shared, ws.Layer.Held)
	}
	if ws.Pending != nil {
		s += fmt.Sprintf(" pending{%s on %s}", ws.Pending.Kind, ws.Pending.NodeID)
	}
	return s
}

// WaitWorkspace polls until the Workspace is in state (FAILED ends the
// wait early unless it is the state asked for).
func WaitWorkspace(t *testing.T, admin *Host, id, state string, d time.Duration) api.Workspace {
	t.Helper()
	var got api.Workspace
	testenv.WaitFor(t, d, "workspace "+id+" "+state, func() (bool, string) {
		var ws api.Workspace
		if err := admin.KiboJSON(&ws, "workspace", "get", id, "--consistent"); err != nil {
			return false, err.Error()
		}
		got = ws
		if ws.State == api.WorkspaceFailed && state != api.WorkspaceFailed {
			t.Fatalf("workspace %s is FAILED while waiting for %s: %s", id, state, WorkspaceString(ws))
		}
		return ws.State == state, WorkspaceString(ws)
	})
	return got
}

// ListAll is `workspace list --all -q`, sorted.
func ListAll(t *testing.T, admin *Host, extra ...string) []string {
	t.Helper()
	r := admin.Kibo(append([]string{"workspace", "list", "--all", "-q", "--consistent"}, extra...)...)
	if r.Code != 0 {
		t.Fatal(r)
	}
	ids := strings.Fields(r.Stdout)
	slices.Sort(ids)
	return ids
}

// Must runs the CLI through h and fails the test unless it exits 0.
func Must(t *testing.T, h *Host, timeout time.Duration, args ...string) Result {
	t.Helper()
	r := h.KiboTimeout(timeout, args...)
	if r.Code != 0 {
		t.Fatal(r)
	}
	return r
}

// ExpectExit runs the CLI through h and fails the test unless it exits
// with code.
func ExpectExit(t *testing.T, h *Host, code int, what string, args ...string) Result {
	t.Helper()
	r := h.KiboTimeout(BootTimeout, args...)
	if r.Code != code {
		t.Fatalf("%s: want exit %d, got %s", what, code, r)
	}
	return r
}

func (n NodeReport) String() string {
	s := fmt.Sprintf("%s status=%s drain_requested=%v isolated=%v", n.NodeID, n.Status, n.DrainRequested, n.Isolated)
	if n.Session != nil {
		s += fmt.Sprintf(" alive=%v", n.Session.Alive)
	}
	if n.Report != nil {
		s += fmt.Sprintf(" instances=%d data_plane=%q", n.Report.Instances, n.Report.DataPlaneAddress)
	}
	if n.Overcommit != nil {
		s += fmt.Sprintf(" overcommit{cpu=%s acked=%v}", n.Overcommit.CPU, n.Overcommit.Acknowledged)
	}
	if n.Schedulable != nil {
		s += fmt.Sprintf(" schedulable_cpu=%s", n.Schedulable.CPU)
	}
	return s
}
