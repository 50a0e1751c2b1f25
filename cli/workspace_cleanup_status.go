package cli

import (
	"github.com/kibotos/kibotos/api"
)

// WorkspaceCleanupStatusCmd is `workspace cleanup-status`.
type WorkspaceCleanupStatusCmd struct {
	ID string `arg:"" name:"workspace"`
}

func (c *WorkspaceCleanupStatusCmd) Run(g *Globals) error {
	var st api.CleanupStatus
	raw, err := g.call("GET", workspacePath(c.ID, "cleanup-status"), nil, &st)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("Workspace %s, Instance %s, node %s\n", st.WorkspaceID, dash(st.InstanceID), dash(st.NodeID))
	t := newTable(g.stdout, "ITEM", "STATE", "SOURCE", "OBSERVED", "SINCE")
	for _, it := range st.Items {
		obs, since := "-", "-"
		if it.ObservedAt != nil {
			obs = stamp(*it.ObservedAt)
		}
		if it.Since != nil {
			since = stamp(*it.Since)
		}
		t.row(it.Item, it.State, it.Source, obs, since)
	}
	t.flush()
	return nil
}
