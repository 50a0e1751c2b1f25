package cli

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/kibotos/kibotos/api"
)

// NodeListCmd lists nodes, sorted by node id on the server.
type NodeListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Nodes per page (0: all)."`
	PageToken string `name:"page-token" help:"Token of the page to read, from the previous page."`
	Wide      bool   `name:"wide" help:"Add the REG_VERSION column."`
}

func (c *NodeListCmd) Run(g *Globals) error {
	if c.PageSize < 0 {
		return usagef("--page-size must be 0 or more")
	}
	q := url.Values{}
	if c.PageSize > 0 {
		q.Set("page_size", strconv.Itoa(c.PageSize))
	}
	if c.PageToken != "" {
		q.Set("page_token", c.PageToken)
	}
	path := "/v1/nodes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out api.NodeList
	var into any = &out
	if g.JSON {
		into = nil // printed as received
	}
	raw, err := g.call("GET", path, nil, into)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
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
	if out.NextPageToken != "" {
		g.note("more nodes: --page-token %s\n", out.NextPageToken)
	}
	return nil
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

func memTightColumn(n *api.Node) string {
	if n.HostUsage == nil {
		return "-"
	}
	return yesNo(n.HostUsage.MemoryTight)
}
