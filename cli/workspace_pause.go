package cli

import (
	"fmt"

	"github.com/kibotos/kibotos/api"
)

// WorkspacePauseCmd is `workspace pause`.
type WorkspacePauseCmd struct {
	WaitFlags
	ID              string  `arg:"" name:"workspace"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the pause."`
}

func (c *WorkspacePauseCmd) Run(g *Globals) error {
	var ws api.Workspace
	raw, err := g.call("POST", workspacePath(c.ID, "pause"), api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, &ws)
	if err != nil {
		return err
	}
	if !c.NoWait && ws.State == api.WorkspacePausing {
		accepted := ws.Version
		final, err := pollWorkspace(g, c.ID, func(cur *api.Workspace) (bool, error) {
			switch {
			case cur == nil:
				return false, fmt.Errorf("workspace %s was deleted", c.ID)
			case cur.State == api.WorkspacePaused:
				return true, nil
			case cur.State == api.WorkspaceFailed:
				return false, failedError(cur)
			case cur.State == api.WorkspaceAvailable && cur.LastError != nil && cur.Version > accepted:
				// Not saved: the guest runs on.
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s was not paused and runs on: %s", c.ID, cur.LastError.Message)}
			}
			return false, nil
		})
		if err != nil {
			return err
		}
		ws, raw = *final, nil
	}
	return printWorkspaceResult(g, raw, &ws, false, "paused")
}

// WorkspaceResumeCmd is `workspace resume`: a start of a PAUSED Workspace.
type WorkspaceResumeCmd struct {
	WaitFlags
	ID              string  `arg:"" name:"workspace"`
	Node            string  `name:"node" help:"Resume on this node only (it must reach the pool and restore the snapshot); never falls back to another."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool    `name:"no-wait" help:"Return once ctrl accepted the resume."`
}

func (c *WorkspaceResumeCmd) Run(g *Globals) error {
	var ws api.Workspace
	if err := g.getConsistent(workspacePath(c.ID), &ws); err != nil {
		return err
	}
	if ws.State != api.WorkspacePaused && ws.State != api.WorkspaceAvailable {
		return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s is %s: resume needs PAUSED; start it with kibo workspace start %s", c.ID, ws.State, c.ID)}
	}
	req := api.WorkspaceWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), NodeID: c.Node}
	raw, err := g.call("POST", workspacePath(c.ID, "start"), req, &ws)
	if err != nil {
		return err
	}
	if !c.NoWait {
		started := ws.Version
		final, err := pollWorkspace(g, c.ID, func(cur *api.Workspace) (bool, error) {
			switch {
			case cur == nil:
				return false, fmt.Errorf("workspace %s was deleted", c.ID)
			case cur.State == api.WorkspaceAvailable:
				return true, nil
			case cur.State == api.WorkspaceFailed:
				return false, failedError(cur)
			case cur.State == api.WorkspacePaused && cur.LastError != nil && cur.Version > started:
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s was not resumed and stays PAUSED: %s", c.ID, cur.LastError.Message)}
			}
			return false, nil
		})
		if err != nil {
			return err
		}
		ws, raw = *final, nil
	}
	return printWorkspaceResult(g, raw, &ws, false, "resumed")
}
