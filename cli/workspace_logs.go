package cli

import (
	"io"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceLogsCmd is `workspace logs`: the machine log (guest console,
// or the VMM's own log) of a Workspace's Instance, read from the node
// that keeps it.
type WorkspaceLogsCmd struct {
	ID       string `arg:"" name:"workspace"`
	Instance string `name:"instance" placeholder:"ID" help:"An Instance of the Workspace, e.g. an ended one (default: the current or latest; kibo workspace get shows it)."`
	Tail     int    `name:"tail" short:"n" placeholder:"N" help:"Only the last N lines of what is read (default: all)."`
	Limit    string `name:"limit-bytes" default:"256KiB" placeholder:"SIZE" help:"Read at most the last SIZE of the log, at most 1MiB."`
	VMM      bool   `name:"vmm" help:"The VMM's own log instead of the guest console."`
}

func (c *WorkspaceLogsCmd) Run(g *Globals) error {
	limit, err := parseSize(c.Limit)
	if err != nil || limit < 1 || limit > api.MachineLogMaxBytes {
		return usagef("--limit-bytes %q: give a size from 1 to 1MiB", c.Limit)
	}
	if c.Tail < 0 || c.Tail > api.MachineLogMaxLines {
		return usagef("--tail %d: give a number of lines from 1 to %d", c.Tail, api.MachineLogMaxLines)
	}
	v := api.MachineLogQuery{MaxBytes: int64(limit), Lines: c.Tail}.Values()
	if c.Instance != "" {
		v.Set("instance", c.Instance)
	}
	var l api.MachineLog
	raw, err := g.call("GET", workspacePath(c.ID, "logs")+"?"+v.Encode(), nil, &l)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	text, cut, name := l.Console, l.ConsoleTruncated, "console"
	if c.VMM {
		text, cut, name = l.VMM, l.VMMTruncated, "VMM log"
	}
	if cut {
		g.note("(earlier %s output of instance %s not shown: --tail, --limit-bytes)\n", name, l.InstanceID)
	}
	if !l.Live {
		g.note("(instance %s has ended: the %s tail node %s kept)\n", l.InstanceID, name, l.NodeID)
	}
	_, err = io.WriteString(g.stdout, text)
	return err
}
