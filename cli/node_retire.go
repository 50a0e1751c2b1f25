package cli

import (
	"bufio"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/api"
)

// NodeRetireCmd retires a node for good.
type NodeRetireCmd struct {
	NodeID          string  `arg:"" name:"node-id"`
	Yes             bool    `name:"yes" help:"Do not ask for confirmation (needed without a terminal)."`
	CommandID       string  `name:"command-id" help:"Idempotency key; needs --expected-version."`
	ExpectedVersion *uint64 `name:"expected-version" help:"registration_version the node must still be at."`
}

func isTerminal(fd uintptr) bool {
	_, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
	return err == nil
}

func (c *NodeRetireCmd) Run(g *Globals) error {
	if c.CommandID != "" && c.ExpectedVersion == nil {
		return api.Errorf(api.CodeInvalidArgument, "retire of node %s: --command-id needs --expected-version too, so a replay has the same inputs", c.NodeID)
	}
	if !c.Yes {
		if g.stdin == nil || !isTerminal(g.stdin.Fd()) {
			return usagef("retire of node %s is permanent and needs confirmation: run it in a terminal or add --yes", c.NodeID)
		}
		g.note("Retire node %s? It can never register again. Type the node id to confirm: ", c.NodeID)
		line, _ := bufio.NewReader(g.stdin).ReadString('\n')
		if strings.TrimSpace(line) != c.NodeID {
			return exitError{api.ExitAborted, "retire of node " + c.NodeID + " not confirmed; nothing changed"}
		}
	}
	var n api.Node
	raw, err := g.call("POST", nodePath(c.NodeID, "retire"), api.NodeWriteRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion)}, &n)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("node %s: %s\n", n.NodeID, n.Status)
	return nil
}
