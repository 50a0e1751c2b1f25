package cli

import (
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// NodeDrainCmd requests drain.
type NodeDrainCmd struct {
	WaitFlags
	NodeID          string        `arg:"" name:"node-id"`
	CommandID       string        `name:"command-id" help:"Idempotency key: a retry with the same key and inputs returns the first result."`
	ExpectedVersion *uint64       `name:"expected-version" help:"registration_version the node must still be at."`
	Wait            bool          `name:"wait" help:"Wait until the node is DRAINED (exit 0), --timeout passes (exit 16) or the drain is cancelled or the node revoked (exit 13)."`
	Interval        time.Duration `name:"interval" default:"1s" hidden:"" help:"Poll interval of --wait."`
}

func (c *NodeDrainCmd) Run(g *Globals) error {
	var n api.Node
	raw, err := g.call("POST", nodePath(c.NodeID, "drain"), api.NodeWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, &n)
	if err != nil {
		return err
	}
	if !c.Wait {
		if g.JSON {
			return g.printJSON(raw)
		}
		g.printf("node %s: drain requested; status %s, registration_version %d\n", n.NodeID, n.Status, n.RegistrationVersion)
		g.note("%s\n", emptyNodeHint(n.NodeID))
		return nil
	}
	final, err := c.wait(g, &n)
	if err != nil {
		return err
	}
	if g.JSON {
		return printResult(g, final)
	}
	g.printf("node %s: DRAINED (registration_version %d)\n", final.NodeID, final.RegistrationVersion)
	return nil
}

// wait polls until DRAINED; the drain request is never submitted again.
func (c *NodeDrainCmd) wait(g *Globals, n *api.Node) (*api.Node, error) {
	deadline := time.Now().Add(g.Timeout)
	for {
		switch {
		case n.Status == api.NodeDrained:
			return n, nil
		case n.Status == api.NodeRetired || n.Status == api.NodeRevoked:
			return nil, exitError{api.ExitFailedPrecondition, fmt.Sprintf("node %s was %s while waiting for DRAINED", n.NodeID, n.Status)}
		case !n.DrainRequested:
			return nil, exitError{api.ExitFailedPrecondition, fmt.Sprintf("drain of node %s was cancelled while waiting for DRAINED", n.NodeID)}
		}
		if !time.Now().Before(deadline) {
			instances, volumes := 0, 0
			if n.Report != nil {
				instances, volumes = n.Report.Instances, n.Report.Volumes
			}
			return nil, exitError{api.ExitTimedOut, fmt.Sprintf("node %s is still %s after %s (%d Instances, %d Volumes left); the drain request stays in place; %s, and check with kibo node get %s",
				n.NodeID, n.Status, g.Timeout, instances, volumes, emptyNodeHint(n.NodeID), n.NodeID)}
		}
		select {
		case <-g.ctx.Done():
			return nil, g.ctx.Err()
		case <-time.After(min(c.Interval, time.Until(deadline)+time.Millisecond)):
		}
		next, _, err := g.getNode(n.NodeID)
		if err != nil {
			if api.CodeOf(err) == api.CodeUnavailable {
				continue // a leader change while waiting is not the end of the wait
			}
			return nil, err
		}
		n = next
	}
}

// NodeCancelDrainCmd resumes scheduling.
type NodeCancelDrainCmd struct {
	NodeID          string  `arg:"" name:"node-id"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"registration_version the node must still be at."`
}

func (c *NodeCancelDrainCmd) Run(g *Globals) error {
	var n api.Node
	raw, err := g.call("POST", nodePath(c.NodeID, "cancel-drain"), api.NodeWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, &n)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("node %s: drain cancelled; status %s, registration_version %d\n", n.NodeID, n.Status, n.RegistrationVersion)
	return nil
}

// emptyNodeHint says how an operator empties a node: drain moves nothing
// (node-operations seed), so each Workspace is stopped, deleted or moved
// through a Transfer.
func emptyNodeHint(node string) string {
	return fmt.Sprintf("to empty it, list its Workspaces with kibo workspace list --node %s --all -q, then stop or delete each, or move it: kibo transfer export WS, kibo transfer import TRANSFER --node OTHER, kibo workspace delete WS", node)
}
