package cli

import (
	"io"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceLogsCmd is `workspace logs`: the machine log (guest console,
// or the VMM's own log) of a Workspace's Instance, read from the node
// that keeps it.
type WorkspaceLogsCmd struct {
	ID       string `arg:"" name:"workspace"`
	Instance string `name:"instance" placeholder:"ID" help:"An Instance of the Workspace, e.g. an ended one (default: the current or latest; kibo workspace get shows it)."`
	Tail     int    `name:"tail" placeholder:"N" help:"Only the last N lines of what is read (default: all)."`
	Limit    string `name:"limit-bytes" default:"256KiB" placeholder:"SIZE" help:"Read at most the last SIZE of the log, at most 1MiB."`
	VMM      bool   `name:"vmm" help:"The VMM's own log instead of the guest console."`
	Follow   bool   `name:"follow" short:"f" help:"Then keep printing the console as the guest writes it, until the Instance stops."`
}

// followInterval is how often --follow asks for more.
const followInterval = time.Second

func (c *WorkspaceLogsCmd) Run(g *Globals) error {
	limit, err := parseSize(c.Limit)
	if err != nil || limit < 1 || limit > api.MachineLogMaxBytes {
		return usagef("--limit-bytes %q: give a size from 1 to 1MiB", c.Limit)
	}
	if c.Tail < 0 || c.Tail > api.MachineLogMaxLines {
		return usagef("--tail %d: give a number of lines from 1 to %d (0: all)", c.Tail, api.MachineLogMaxLines)
	}
	if c.Follow && (c.VMM || g.JSON) {
		return usagef("--follow prints the guest console as it grows: not with --vmm or --json")
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
	if _, err := io.WriteString(g.stdout, text); err != nil || !c.Follow {
		return err
	}
	return followConsole(g, c.ID, l, int64(limit))
}

// followConsole prints what the guest writes to its console after l,
// asking every followInterval from l's cursor, until the Instance no
// longer runs.
func followConsole(g *Globals, ws string, l api.MachineLog, limit int64) error {
	t := time.NewTicker(followInterval)
	defer t.Stop()
	for l.Running {
		select {
		case <-g.ctx.Done():
			return nil
		case <-t.C:
		}
		v := api.MachineLogQuery{MaxBytes: limit, After: l.ConsoleCursor}.Values()
		v.Set("instance", l.InstanceID)
		var next api.MachineLog
		if _, err := g.call("GET", workspacePath(ws, "logs")+"?"+v.Encode(), nil, &next); err != nil {
			return err
		}
		if !next.Live {
			break // removed between two reads: what it wrote last is in its kept tail
		}
		if next.ConsoleTruncated {
			g.note("(console output of instance %s skipped: more than --limit-bytes between two reads)\n", l.InstanceID)
		}
		if _, err := io.WriteString(g.stdout, next.Console); err != nil {
			return err
		}
		l = next
	}
	g.note("(instance %s no longer runs: kibo workspace logs %s --instance %s shows what it kept)\n", l.InstanceID, ws, l.InstanceID)
	return nil
}
