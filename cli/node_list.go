package cli

import (
	"fmt"
	"strconv"

	"github.com/kibotos/kibotos/api"
)

// NodeListCmd lists nodes, sorted by node id on the server.
type NodeListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Nodes per page (0: all)."`
	PageToken string `name:"page-token" help:"Token of the page to read, from the previous page."`
	Wide      bool   `name:"wide" help:"Add the REG_VERSION column."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the node ids."`
}

func (c *NodeListCmd) Run(g *Globals) error {
	var out api.NodeList
	return runList(g, listCall{path: "/v1/nodes", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "nodes"}, &out,
		func() ([]string, string) {
			ids := make([]string, len(out.Nodes))
			for i, n := range out.Nodes {
				ids[i] = n.NodeID
			}
			return ids, out.NextPageToken
		},
		func() {
			header := []string{"NODE_ID", "STATUS", "RELEASE", "CLOCK", "INSTANCES", "CPU_ALLOC/SCHED", "MEM_ALLOC/SCHED", "MEM_TIGHT"}
			if c.Wide {
				header = append(header, "REG_VERSION")
			}
			t := newTable(g.stdout, header...)
			for i := range out.Nodes {
				n := &out.Nodes[i]
				row := []string{n.NodeID, n.Status, dash(n.Release), clockColumn(n), instancesColumn(n), cpuColumn(n), memColumn(n), memTightColumn(n)}
				if c.Wide {
					row = append(row, strconv.FormatUint(n.RegistrationVersion, 10))
				}
				t.row(row...)
			}
			t.flush()
		})
}

func instancesColumn(n *api.Node) string {
	if n.Report == nil {
		return "-"
	}
	return strconv.Itoa(n.Report.Instances)
}

func cpuColumn(n *api.Node) string {
	if n.Report == nil || n.Schedulable == nil {
		return "-"
	}
	return fmt.Sprintf("%s/%s", n.Report.Allocated.CPU, n.Schedulable.CPU)
}

func memColumn(n *api.Node) string {
	if n.Report == nil || n.Schedulable == nil {
		return "-"
	}
	return formatBytes(n.Report.Allocated.MemoryBytes) + "/" + formatBytes(n.Schedulable.MemoryBytes)
}

// memTightColumn reads the list's memory_tight: a list carries no host_usage.
func memTightColumn(n *api.Node) string {
	if n.MemoryTight == nil {
		return "-"
	}
	return yesNo(*n.MemoryTight)
}
