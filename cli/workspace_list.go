package cli

import (
	"net/url"
	"sort"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceListCmd is `workspace list`.
type WorkspaceListCmd struct {
	State     []string          `name:"state" help:"Only these states (repeat or comma-separate)."`
	Label     map[string]string `name:"label" help:"Only Workspaces with label KEY=VALUE; repeat: all must match."`
	Pool      string            `name:"pool" help:"Only Workspaces whose writable layer is in this storage pool (kibo storage-pool list)."`
	Node      string            `name:"node" help:"Only the Workspaces executing on this node (not combinable with filters)."`
	Instance  string            `name:"instance" help:"Only the Workspace executing with this Instance (not combinable with filters)."`
	All       bool              `name:"all" help:"Include STOPPED Workspaces, and read every page."`
	Quiet     bool              `short:"q" name:"quiet" help:"Print only Workspace IDs, one per line."`
	Wide      bool              `name:"wide" help:"Add the INSTANCE, NODE and ENDS columns."`
	PageSize  int               `name:"page-size" default:"100" help:"Workspaces per page."`
	PageToken string            `name:"page-token" help:"Continue after a previous page."`
}

func (c *WorkspaceListCmd) Run(g *Globals) error {
	if c.Node != "" && c.Instance != "" {
		return usagef("--node and --instance are exclusive: give one")
	}
	if (c.Node != "" || c.Instance != "") && (len(c.State) > 0 || len(c.Label) > 0 || c.Pool != "") {
		return usagef("--node and --instance cannot be combined with --state, --label or --pool")
	}
	q := url.Values{}
	for _, s := range c.State {
		q.Add("state", s)
	}
	keys := make([]string, 0, len(c.Label))
	for k := range c.Label {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+c.Label[k])
	}
	if c.Node != "" {
		q.Set("node", c.Node)
	}
	if c.Instance != "" {
		q.Set("instance", c.Instance)
	}
	if c.Pool != "" {
		q.Set("pool", c.Pool)
	}
	if c.All {
		q.Set("all", "true")
	}
	q.Set("page_size", itoa(c.PageSize))
	token := c.PageToken
	var all api.WorkspaceList
	for {
		if token != "" {
			q.Set("page_token", token)
		}
		var page api.WorkspaceList
		raw, err := g.call("GET", "/v1/workspaces?"+q.Encode(), nil, &page)
		if err != nil {
			return err
		}
		if g.JSON && !c.All {
			return g.printJSON(raw)
		}
		all.Workspaces = append(all.Workspaces, page.Workspaces...)
		all.NextPageToken = page.NextPageToken
		if !c.All || page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
	}
	if g.JSON {
		return printResult(g, all)
	}
	if c.Quiet {
		for _, ws := range all.Workspaces {
			g.printf("%s\n", ws.WorkspaceID)
		}
		return nil
	}
	header := g.namespaceFirst("NAMESPACE", []string{"ID", "STATE", "TEMPLATE", "CPU", "MEMORY", "LABELS"})
	if c.Wide {
		header = append(header, "INSTANCE", "NODE", "ENDS")
	}
	t := newTable(g.stdout, header...)
	now := time.Now()
	for _, ws := range all.Workspaces {
		cols := g.namespaceFirst(api.ShownNamespace(ws.Namespace), []string{ws.WorkspaceID, ws.State, ws.Template, ws.CPU.String(), formatBytes(ws.MemoryBytes), dash(labelsColumn(ws.Labels))})
		if c.Wide {
			cols = append(cols, dash(ws.InstanceID), dash(ws.NodeID), endsColumn(&ws, now))
		}
		t.row(cols...)
	}
	t.flush()
	if all.NextPageToken != "" {
		g.note("more Workspaces: --page-token %s\n", all.NextPageToken)
	}
	return nil
}
