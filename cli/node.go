package cli

import (
	"net/url"

	"github.com/kibotos/kibotos/api"
)

// NodeCmd groups the node commands.
type NodeCmd struct {
	List        NodeListCmd        `cmd:"" help:"List node registrations."`
	Get         NodeGetCmd         `cmd:"" help:"Show one node registration, its latest session, report and host usage."`
	Drain       NodeDrainCmd       `cmd:"" help:"Stop placing new Workspaces on a node."`
	CancelDrain NodeCancelDrainCmd `cmd:"" name:"cancel-drain" help:"Resume placing Workspaces on a node."`
	Isolate     NodeIsolateCmd     `cmd:"" help:"Declare that a node's host is shut down or cut off from its storage."`
	Retire      NodeRetireCmd      `cmd:"" help:"Retire a DRAINED or isolated node for good."`
	Overcommit  NodeOvercommitCmd  `cmd:"" help:"Get and set overcommit multipliers."`
}

func nodePath(id string, rest ...string) string {
	p := "/v1/nodes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// getNode reads one node.
func (g *Globals) getNode(id string) (*api.Node, []byte, error) {
	var n api.Node
	raw, err := g.call("GET", nodePath(id), nil, &n)
	if err != nil {
		return nil, nil, err
	}
	return &n, raw, nil
}
