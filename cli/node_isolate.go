package cli

import "github.com/kibotos/kibotos/api"

// NodeIsolateCmd declares a node's host dead or cut off from storage.
type NodeIsolateCmd struct {
	NodeID                 string  `arg:"" name:"node-id"`
	CommandID              string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion        *uint64 `name:"expected-version" help:"registration_version the node must still be at."`
	ConfirmHostCannotWrite bool    `name:"confirm-host-cannot-write" help:"Required: you assert this host is shut down or can no longer write to any of its storage pools."`
}

func (c *NodeIsolateCmd) Run(g *Globals) error {
	if !c.ConfirmHostCannotWrite {
		return usagef("isolate of node %s needs --confirm-host-cannot-write: you assert the host is shut down or cut off from its storage, and a wrong assertion corrupts data", c.NodeID)
	}
	var out api.IsolateResult
	raw, err := g.call("POST", nodePath(c.NodeID, "isolate"), api.NodeWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), ConfirmHostCannotWrite: true}, &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("node %s isolated: %d Volumes and %d retained writable layers released, %d Workspaces failed (UNAVAILABLE), %d pending commands failed\n",
		out.NodeID, out.VolumesReleased, out.RetainedLayersReleased, out.WorkspacesFailed, out.CommandsFailed)
	return nil
}
