package cli

import (
	"fmt"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceMoveCmd is `workspace move`: check, stop, start on the target.
type WorkspaceMoveCmd struct {
	WaitFlags
	ID        string `arg:"" name:"workspace"`
	Node      string `name:"node" required:"" help:"The node to start it on."`
	CommandID string `name:"command-id" help:"Idempotency key; the stop and the start use it with /stop and /start appended, so a rerun resumes."`
}

func (c *WorkspaceMoveCmd) Run(g *Globals) error {
	var ws api.Workspace
	if err := g.getConsistent(workspacePath(c.ID), &ws); err != nil {
		return err
	}
	var target api.Node
	if err := g.getConsistent(nodePath(c.Node), &target); err != nil {
		return err
	}
	if ws.State == api.WorkspaceAvailable && ws.NodeID == c.Node {
		return printWorkspaceResult(g, nil, &ws, false, "already on the target")
	}
	// Check: every object must be in a pool the target reaches.
	if err := c.checkReach(g, &ws, &target); err != nil {
		return err
	}
	stopID, startID := "", ""
	if c.CommandID != "" {
		stopID, startID = c.CommandID+"/stop", c.CommandID+"/start"
	}
	if ws.State == api.WorkspaceAvailable || ws.State == api.WorkspaceStopping {
		if _, err := g.call("POST", workspacePath(c.ID, "stop"), api.WorkspaceWriteRequest{WriteMeta: writeMeta(stopID, nil)}, nil); err != nil {
			return err
		}
		if _, err := waitWorkspace(g, c.ID, api.WorkspaceStopped); err != nil {
			return err
		}
	}
	var started api.Workspace
	if _, err := g.call("POST", workspacePath(c.ID, "start"), api.WorkspaceWriteRequest{WriteMeta: writeMeta(startID, nil), NodeID: c.Node}, &started); err != nil {
		return fmt.Errorf("%w; the Workspace is no longer running: start it again with kibo workspace start %s --node %s", err, c.ID, c.Node)
	}
	final, err := waitWorkspace(g, c.ID, api.WorkspaceAvailable)
	if err != nil {
		return fmt.Errorf("%w; start it again with kibo workspace start %s --node %s", err, c.ID, c.Node)
	}
	return printWorkspaceResult(g, nil, final, false, "moved")
}

// movedObject is one object of a Workspace a move checks.
type movedObject struct {
	what, pool string
	shared     bool
	maker      string // the node that made it (and alone uses a standalone pool)
}

// checkReach refuses a move whose target cannot use one of the
// Workspace's objects (its layer, its Volumes): the target must report
// the object's pool available, and the pool must be shared or have moved
// there (its old host retired or isolated), as ctrl's placement will
// require; an object being resized or deleted is not moved.
func (c *WorkspaceMoveCmd) checkReach(g *Globals, ws *api.Workspace, target *api.Node) error {
	var objs []movedObject
	if l := ws.Layer; l != nil {
		if l.Lost {
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: its writable layer was in pool %s, which was declared lost; the Workspace is unchanged", c.ID, api.LayerPoolID(l))}
		}
		objs = append(objs, movedObject{what: "its writable layer", pool: api.LayerPoolID(l), shared: l.Shared, maker: l.NodeID})
	}
	for _, m := range ws.Volumes {
		var v api.Volume
		if err := g.getConsistent(volumePath(m.VolumeID), &v); err != nil {
			return err
		}
		what := "its volume " + v.Name
		switch {
		case v.State == api.VolumeLost:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s was in pool %s, which was declared lost; the Workspace is unchanged", c.ID, what, v.PoolID)}
		case v.Pending != nil:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s has a %s in progress on node %s; move it once that completed; the Workspace is unchanged", c.ID, what, v.Pending.Kind, v.Pending.NodeID)}
		case !v.Made && ws.Layer == nil:
			continue // made where the Workspace first starts
		}
		objs = append(objs, movedObject{what: what, pool: v.PoolID, shared: v.Shared, maker: v.NodeID})
	}
	for _, o := range objs {
		if o.maker == c.Node {
			continue
		}
		refuse := func(why string) error {
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: %s is in pool %s, %s; the Workspace is unchanged", c.ID, o.what, o.pool, why)}
		}
		if !poolAvailable(target, o.pool) {
			return refuse("which node " + c.Node + " does not report available")
		}
		if o.shared {
			continue
		}
		var p api.StoragePool
		if err := g.getConsistent(poolPath(o.pool), &p); err != nil {
			return err
		}
		for _, m := range p.Nodes {
			if m.NodeID != o.maker {
				continue
			}
			var maker api.Node
			if err := g.getConsistent(nodePath(o.maker), &maker); err != nil {
				return err
			}
			if !maker.Isolated {
				return refuse("a standalone pool of node " + o.maker + ", which only it can use while it is a member")
			}
		}
	}
	return nil
}

func poolAvailable(n *api.Node, id string) bool {
	if n.Report == nil {
		return false
	}
	for _, p := range n.Report.Pools {
		if p.PoolID == id && p.Available {
			return true
		}
	}
	return false
}
