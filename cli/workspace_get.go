package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceGetCmd is `workspace get`.
type WorkspaceGetCmd struct {
	ID   string `arg:"" name:"workspace"`
	Wide bool   `name:"wide" help:"Add the current Instance."`
}

func (c *WorkspaceGetCmd) Run(g *Globals) error {
	var ws api.Workspace
	raw, err := g.call("GET", workspacePath(c.ID), nil, &ws)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	renderWorkspace(g.stdout, &ws, c.Wide)
	return nil
}

func renderWorkspace(w io.Writer, ws *api.Workspace, wide bool) {
	line := kv{w}.line
	line("ID", "%s", ws.WorkspaceID)
	line("Namespace", "%s", api.ShownNamespace(ws.Namespace))
	line("State", "%s", ws.State)
	if ws.EndsAt != nil || ws.TimeoutSeconds > 0 {
		line("Ends", "%s", endsText(ws, time.Now()))
		line("Timeout", "%s after each start and resume", api.FormatTimeout(ws.TimeoutDuration()))
	}
	if ws.IdleTimeoutSeconds > 0 {
		line("Idle timeout", "%s", idleText(ws))
	}
	if ws.Idle != nil {
		line("Idle", "%s", idleFor(ws, time.Now()))
	}
	if ws.AutoResume {
		line("Auto-resume", "yes: exec, terminal, cp and port-forward resume it when PAUSED")
	}
	if f := ws.Failure; f != nil {
		if f.Stage != "" {
			line("Failure", "%s at %s: %s (%s)", f.Reason, f.Stage, f.Message, stamp(f.At))
		} else {
			line("Failure", "%s: %s (%s)", f.Reason, f.Message, stamp(f.At))
		}
	}
	line("Template", "%s", ws.Template)
	if ws.ForkedFrom != "" {
		line("Forked from", "%s", ws.ForkedFrom)
	}
	if ws.Platform != "" {
		line("Platform", "%s", ws.Platform)
	}
	line("CPU", "%s", ws.CPU)
	line("Memory", "%s", formatBytes(ws.MemoryBytes))
	line("Labels", "%s", dash(labelsColumn(ws.Labels)))
	// Names only: the values may be secrets, and only its guest has them.
	line("Environment", "%s", dash(strings.Join(ws.EnvNames, ",")))
	pol := ws.Network.Effective()
	line("Egress", "%s", egressColumn(pol))
	resolver := pol.Resolver
	if resolver == "" {
		resolver = "default"
	}
	line("Resolver", "%s", resolver)
	line("Allow", "%s", dash(strings.Join(pol.Allow, ",")))
	line("Deny", "%s", dash(strings.Join(pol.Deny, ",")))
	if ws.GuestNotResponding {
		line("Guest", "not responding (the node retries and reconfigures it once it answers; if it never does: kibo workspace stop --force %s, then start)", ws.WorkspaceID)
	}
	if d := ws.Denied; d != nil {
		line("Denied packets", "%d (reported %s)", d.Packets, stamp(d.ReportedAt))
	}
	line("Node", "%s", dash(ws.NodeID))
	if wide {
		line("Instance", "%s", dash(ws.InstanceID))
	}
	layer := "-"
	if l := ws.Layer; l != nil {
		layer = fmt.Sprintf("pool %s of node %s", api.LayerPoolID(l), l.NodeID)
		switch {
		case l.Lost:
			layer = fmt.Sprintf("lost with pool %s (declare-lost): delete the Workspace", api.LayerPoolID(l))
		case l.Held:
			layer += " (in use)"
		}
		if l.SizeBytes > 0 {
			layer += ", up to " + formatBytes(l.SizeBytes)
		}
	}
	line("Writable layer", "%s", layer)
	if s := ws.Snapshot; s != nil {
		switch {
		case s.Discarded:
			line("Snapshot", "discarded by a stop; its files in pool %s go with the next start or the delete", s.PoolID)
		case s.From != "":
			line("Snapshot", "of workspace %s (%s in pool %s, taken at %s): the first start restores it", s.From, formatBytes(s.SizeBytes), s.PoolID, stamp(s.TakenAt))
		default:
			line("Snapshot", "%s in pool %s, taken on node %s at %s (QEMU %s, %s, %d MiB)", formatBytes(s.SizeBytes), s.PoolID, s.NodeID, stamp(s.TakenAt), s.Compat.QEMUVersion, s.Compat.Accel, s.Compat.MemoryMiB)
		}
	}
	if e := ws.LastError; e != nil {
		line("Last error", "%s failed at %s: %s", e.Reason, stamp(e.At), e.Message)
	}
	label := "Volumes"
	for _, m := range ws.Volumes {
		line(label, "%s at %s (%s)", m.Name, m.Path, m.VolumeID)
		label = "" // one label for the list
	}
	if p := ws.DeleteWaitsForPool; p != "" {
		line("Delete waits", "for a node that reaches pool %s to remove the files (the node comes back, the pool's disk moves to another host, or kibo storage-pool declare-lost %s)", p, p)
	}
	if p := ws.Pending; p != nil {
		line("Pending", "%s on node %s since %s", p.Kind, p.NodeID, stamp(p.IssuedAt))
		if p.Network != nil {
			line("Requested", "%s", policySummary(p.Network.Effective()))
		}
	}
	if c := ws.NetworkChange; c != nil && c.Outcome != "ok" {
		line("Network change", "failed on node %s at %s: %s", c.NodeID, stamp(c.At), c.Error)
	}
	if ws.StopUnconfirmed {
		line("Last stop", "not confirmed to have reached disk")
	}
	line("Version", "%d", ws.Version)
	line("Created", "%s", stamp(ws.CreatedAt))
	line("Updated", "%s", stamp(ws.UpdatedAt))
}

func labelsColumn(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}
