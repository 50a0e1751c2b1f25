package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kibotos/kibotos/api"
)

// NodeGetCmd shows one node.
type NodeGetCmd struct {
	NodeID string `arg:"" name:"node-id"`
	Wide   bool   `name:"wide" help:"Add registration version, incarnation, session id and report version."`
}

func (c *NodeGetCmd) Run(g *Globals) error {
	n, raw, err := g.getNode(c.NodeID)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	renderNode(g.stdout, n, c.Wide)
	return nil
}

type section struct {
	w      *tabwriter.Writer
	indent string
}

func (s *section) line(label, format string, args ...any) {
	fmt.Fprintf(s.w, "%s%s:\t%s\n", s.indent, label, fmt.Sprintf(format, shown(args)...))
}

func renderNode(w io.Writer, n *api.Node, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	top := &section{w: tw}
	top.line("Node", "%s", n.NodeID)
	top.line("Status", "%s", n.Status)
	top.line("Roles", "%s", strings.Join(n.Roles, ","))
	top.line("Address", "%s", dash(n.Address))
	top.line("Admission", "%s (since %s)", n.Admission, stamp(n.AdmittedAt))
	drain := "no"
	if n.DrainRequested && n.DrainRequestedAt != nil {
		drain = "yes (since " + stamp(*n.DrainRequestedAt) + ")"
	}
	top.line("Drain requested", "%s", drain)
	iso := "no"
	if n.Isolated {
		iso = fmt.Sprintf("yes (incarnation %d, since %s)", n.IsolatedIncarnation, stamp(*n.IsolatedAt))
	}
	top.line("Isolated", "%s", iso)
	if n.Retired {
		top.line("Retired", "yes (since %s)", stamp(*n.RetiredAt))
	}
	top.line("Release", "%s", dash(n.Release))
	top.line("Source revision", "%s", dash(n.Revision))
	if o := n.Overcommit; o != nil {
		ack := "acknowledged by the node"
		if !o.Acknowledged {
			ack = "not yet acknowledged by the node"
		}
		top.line("Overcommit", "cpu %s (%s), memory %s (%s), %s", o.CPU, o.CPUSource, o.Memory, o.MemorySource, ack)
	}
	if s := n.Schedulable; s != nil {
		top.line("Schedulable", "cpu %s, memory %s", s.CPU, formatBytes(s.MemoryBytes))
	} else {
		top.line("Schedulable", "-")
	}
	if wide {
		top.line("Registration version", "%d", n.RegistrationVersion)
	}

	fmt.Fprintln(tw, "\nLatest session")
	sub := &section{w: tw, indent: "  "}
	if s := n.Session; s == nil {
		sub.line("Session", "-")
	} else {
		if wide {
			sub.line("Incarnation", "%d", s.Incarnation)
			sub.line("Session ID", "%s", s.SessionID)
		}
		sub.line("Node version", "%s (revision %s)", dash(s.Release), dash(s.Revision))
		if s.Alive {
			sub.line("Alive", "yes (since %s)", stamp(s.StartedAt))
		} else {
			ended := "-"
			if s.EndedAt != nil {
				ended = stamp(*s.EndedAt)
			}
			sub.line("Alive", "no (ended %s: %s)", ended, dash(s.EndReason))
		}
		if ck := s.Clock; ck != nil {
			over := ""
			if ck.Over {
				over = " (over)"
			}
			sub.line("Clock skew", "%s%s, uncertainty %s, measured %s", formatSkew(ck.OffsetNS), over, strings.TrimPrefix(formatSkew(ck.UncertaintyNS), "+"), stamp(ck.MeasuredAt))
			sub.line("Kernel time sync", "%s", ck.KernelSync)
		} else {
			sub.line("Clock skew", "-")
		}
	}

	fmt.Fprintln(tw, "\nLatest full report")
	if r := n.Report; r == nil {
		sub.line("Report", "-")
	} else {
		if wide {
			sub.line("Report version", "%d", r.ReportVersion)
		}
		sub.line("Reported at", "%s", stamp(r.ReportedAt))
		sub.line("Capacity", "cpu %s, memory %s", r.Capacity.CPU, formatBytes(r.Capacity.MemoryBytes))
		sub.line("Allocated", "cpu %s, memory %s", r.Allocated.CPU, formatBytes(r.Allocated.MemoryBytes))
		sub.line("Instances", "%d", r.Instances)
		sub.line("Volumes", "%d", r.Volumes)
		sub.line("Retained layers", "%d", r.RetainedLayers)
		sub.line("Templates", "%s", dash(strings.Join(r.Templates, ", ")))
		sub.line("Data plane", "%s", dash(r.DataPlaneAddress))
		for _, w := range r.Warm {
			v := fmt.Sprintf("%d of %d ready (cpu %s, memory %s), %d starts from them", w.Ready, w.Wanted, w.CPU, formatBytes(w.MemoryBytes), w.Starts)
			if w.Error != "" {
				v += "; " + w.Error
			}
			sub.line("Warm "+w.Template, "%s", v)
		}
		for _, p := range r.Pools {
			kind := ""
			if p.Shared {
				kind = " (shared)"
			}
			if p.Available {
				sub.line("Pool "+p.PoolID+kind, "available, %s free of %s", formatBytes(p.FreeBytes), formatBytes(p.CapacityBytes))
			} else {
				sub.line("Pool "+p.PoolID, "unavailable: %s", dash(p.Reason))
			}
		}
	}

	fmt.Fprintln(tw, "\nHost usage")
	if u := n.HostUsage; u == nil {
		sub.line("Sampled at", "-")
	} else {
		sub.line("Sampled at", "%s", stamp(u.SampledAt))
		vmCPU := "-"
		if u.VMCPUCores != nil {
			vmCPU = fmt.Sprintf("%.2f cores", *u.VMCPUCores)
		}
		sub.line("VM CPU", "%s", vmCPU)
		sub.line("VM memory", "%s", optBytes(u.VMMemoryBytes))
		avail := optBytes(u.MemoryAvailableBytes)
		if u.MemoryAvailableBytes != nil && u.MemoryTotalBytes != nil {
			avail += " of " + formatBytes(*u.MemoryTotalBytes)
		}
		sub.line("Memory available", "%s", avail)
		tight := "no"
		if u.MemoryTight {
			tight = "yes"
			if u.MemoryTightSince != nil {
				tight += " (since " + stamp(*u.MemoryTightSince) + ")"
			}
		}
		sub.line("Memory tight", "%s", tight)
		sub.line("CPU idle", "%s", pct(u.CPUIdle))
		sub.line("CPU pressure", "some %s, full %s", pct(u.CPUPressureSome), pct(u.CPUPressureFull))
		sub.line("Memory pressure", "some %s, full %s", pct(u.MemoryPressureSome), pct(u.MemoryPressureFull))
	}
	tw.Flush()
}
