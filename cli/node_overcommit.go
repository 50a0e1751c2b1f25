package cli

import (
	"strconv"

	"github.com/kibotos/kibotos/api"
)

// NodeOvercommitCmd groups the overcommit commands.
type NodeOvercommitCmd struct {
	Get        OvercommitGetCmd        `cmd:"" help:"Show the cluster default and every node's effective multipliers."`
	SetDefault OvercommitSetDefaultCmd `cmd:"" name:"set-default" help:"Change the cluster-wide default multipliers."`
	Set        OvercommitSetCmd        `cmd:"" help:"Change one node's multipliers; 'default' returns an item to the cluster default."`
}

// OvercommitGetCmd shows multipliers.
type OvercommitGetCmd struct{}

func (c *OvercommitGetCmd) Run(g *Globals) error {
	var out api.OvercommitView
	raw, err := g.call("GET", "/v1/overcommit", nil, &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("Default: cpu %s, memory %s (version %d)\n\n", out.Default.CPU, out.Default.Memory, out.Default.Version)
	t := newTable(g.stdout, "NODE_ID", "CPU", "CPU_SOURCE", "MEMORY", "MEMORY_SOURCE", "ACKNOWLEDGED", "REG_VERSION")
	for _, n := range out.Nodes {
		o := n.Overcommit
		t.row(n.NodeID, o.CPU.String(), o.CPUSource, o.Memory.String(), o.MemorySource, yesNo(o.Acknowledged), strconv.FormatUint(n.RegistrationVersion, 10))
	}
	t.flush()
	return nil
}

// multiplierFlags are --cpu and --memory as given (nil: unchanged).
type multiplierFlags struct {
	CPU             *string `name:"cpu" help:"CPU multiplier: a decimal 0-16 with at most three places."`
	Memory          *string `name:"memory" help:"Memory multiplier: a decimal 0-16 with at most three places."`
	CommandID       string  `name:"command-id" help:"Idempotency key; needs --expected-version, --cpu and --memory."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Expected version."`
}

func (m *multiplierFlags) request() api.OvercommitSetRequest {
	return api.OvercommitSetRequest{WriteMeta: writeMeta(m.CommandID, m.ExpectedVersion), CPU: m.CPU, Memory: m.Memory}
}

// OvercommitSetDefaultCmd changes the cluster default.
type OvercommitSetDefaultCmd struct {
	multiplierFlags `embed:""`
}

func (c *OvercommitSetDefaultCmd) Run(g *Globals) error {
	var out api.OvercommitDefault
	raw, err := g.call("POST", "/v1/overcommit/default", c.request(), &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("Default: cpu %s, memory %s (version %d)\n", out.CPU, out.Memory, out.Version)
	return nil
}

// OvercommitSetCmd changes one node's multipliers.
type OvercommitSetCmd struct {
	NodeID          string `arg:"" name:"node-id"`
	multiplierFlags `embed:""`
}

func (c *OvercommitSetCmd) Run(g *Globals) error {
	var n api.Node
	raw, err := g.call("POST", nodePath(c.NodeID, "overcommit"), c.request(), &n)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	o := n.Overcommit
	g.printf("node %s: cpu %s (%s), memory %s (%s); registration_version %d; the node confirms the new values before ctrl places there\n",
		n.NodeID, o.CPU, o.CPUSource, o.Memory, o.MemorySource, n.RegistrationVersion)
	return nil
}
