package cli

import (
	"github.com/kibotos/kibotos/api"
)

// WorkspaceStartCmd is `workspace start`.
type WorkspaceStartCmd struct {
	WaitFlags
	ID              string  `arg:"" name:"workspace"`
	Node            string  `name:"node" help:"Start on this node only; never falls back to another."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the start."`
}

func (c *WorkspaceStartCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "start", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), NodeID: c.Node}, api.WorkspaceAvailable, c.NoWait, "started")
}

// workspaceWrite posts a write and waits for the state it leads to.
func workspaceWrite(g *Globals, id, verb string, req api.WorkspaceWriteRequest, want string, noWait bool, done string) error {
	var ws api.Workspace
	raw, err := g.call("POST", workspacePath(id, verb), req, &ws)
	if err != nil {
		return err
	}
	if !noWait {
		final, err := waitWorkspace(g, id, want)
		if err != nil {
			return err
		}
		if final == nil { // deleted
			if g.JSON {
				return printResult(g, map[string]string{"workspace_id": id, "state": "DELETED"})
			}
			g.printf("workspace %s deleted\n", id)
			return nil
		}
		ws, raw = *final, nil
	}
	return printWorkspaceResult(g, raw, &ws, false, done)
}

// WorkspaceStopCmd is `workspace stop`.
type WorkspaceStopCmd struct {
	WaitFlags
	ID              string  `arg:"" name:"workspace"`
	Force           bool    `name:"force" help:"End the Instance without a clean guest stop (data not confirmed on disk); also for FAILED Workspaces."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the stop."`
}

func (c *WorkspaceStopCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "stop", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), Force: c.Force}, api.WorkspaceStopped, c.NoWait, "stopped")
}

// WorkspaceDeleteCmd is `workspace delete`.
type WorkspaceDeleteCmd struct {
	WaitFlags
	ID              string  `arg:"" name:"workspace"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the delete."`
}

func (c *WorkspaceDeleteCmd) Run(g *Globals) error {
	return workspaceWrite(g, c.ID, "delete", api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, "", c.NoWait, "deleting")
}
