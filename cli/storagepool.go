package cli

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// StoragePoolCmd groups the storage-pool commands. Nodes declare pools in
// their configuration; ctrl holds each pool's capacity and its objects.
type StoragePoolCmd struct {
	List        StoragePoolListCmd        `cmd:"" help:"List storage pools: sharing, member nodes, capacity, used and available room."`
	Get         StoragePoolGetCmd         `cmd:"" help:"Show one storage pool with each member node's view of it."`
	SetCapacity StoragePoolSetCapacityCmd `cmd:"" name:"set-capacity" help:"Set the room a pool's objects (retained layers, Volumes) may take; a pool without one takes no new objects."`
	DeclareLost StoragePoolDeclareLostCmd `cmd:"" name:"declare-lost" help:"End every object of a pool no node has any more (the disk is gone): its layers are lost, their Workspaces can be deleted."`
}

func poolPath(id string, verb ...string) string {
	p := "/v1/storage-pools/" + url.PathEscape(id)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}

// capacityColumn shows a pool's capacity, "-" when ctrl has none.
func capacityColumn(n *uint64) string {
	if n == nil {
		return "-"
	}
	return formatBytes(*n)
}

func sharedColumn(p *api.StoragePool) string {
	if p.Shared {
		return "shared"
	}
	return "standalone"
}

// nodesColumn lists the members, "-" for none; short lists in full.
func nodesColumn(p *api.StoragePool, all bool) string {
	if len(p.Nodes) == 0 {
		return "-"
	}
	ids := make([]string, 0, len(p.Nodes))
	for _, m := range p.Nodes {
		id := m.NodeID
		if !m.Available {
			id += "(unavailable)"
		}
		ids = append(ids, id)
	}
	if !all && len(ids) > 3 {
		return strings.Join(ids[:3], ",") + fmt.Sprintf(",+%d", len(ids)-3)
	}
	return strings.Join(ids, ",")
}

// StoragePoolListCmd is `storage-pool list`.
type StoragePoolListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Pools per page (0: all)."`
	PageToken string `name:"page-token" help:"Continue after a previous page."`
	Wide      bool   `name:"wide" help:"List every member node and add the LAYERS, VOLUMES and VERSION columns."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the pool ids."`
}

func (c *StoragePoolListCmd) Run(g *Globals) error {
	var out api.StoragePoolList
	return runList(g, listCall{path: "/v1/storage-pools", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "pools"}, &out,
		func() ([]string, string) {
			ids := make([]string, len(out.Pools))
			for i, p := range out.Pools {
				ids[i] = p.PoolID
			}
			return ids, out.NextPageToken
		},
		func() {
			header := []string{"ID", "SHARED", "NODES", "CAPACITY", "USED", "AVAILABLE"}
			if c.Wide {
				header = append(header, "LAYERS", "VOLUMES", "VERSION")
			}
			t := newTable(g.stdout, header...)
			for i := range out.Pools {
				p := &out.Pools[i]
				row := []string{p.PoolID, sharedColumn(p), nodesColumn(p, c.Wide), capacityColumn(p.CapacityBytes), formatBytes(p.UsedBytes), capacityColumn(p.AvailableBytes)}
				if c.Wide {
					row = append(row, itoa(p.Layers), itoa(p.Volumes), strconv.FormatUint(p.Version, 10))
				}
				t.row(row...)
			}
			t.flush()
		})
}

// StoragePoolGetCmd is `storage-pool get`.
type StoragePoolGetCmd struct {
	Pool string `arg:"" name:"pool" help:"Pool id (kibo storage-pool list)."`
}

func (c *StoragePoolGetCmd) Run(g *Globals) error {
	var p api.StoragePool
	raw, err := g.call("GET", poolPath(c.Pool), nil, &p)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	line := func(label, format string, args ...any) {
		g.printf("%-16s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("ID", "%s", p.PoolID)
	line("Sharing", "%s", sharedColumn(&p))
	if p.CapacityBytes == nil {
		line("Capacity", "- (not set: no new objects; kibo storage-pool set-capacity %s SIZE)", p.PoolID)
	} else {
		line("Capacity", "%s", formatBytes(*p.CapacityBytes))
	}
	line("Used", "%s (%d retained layers, %d Volumes)", formatBytes(p.UsedBytes), p.Layers, p.Volumes)
	line("Available", "%s", capacityColumn(p.AvailableBytes))
	line("Version", "%d", p.Version)
	line("Created", "%s", stamp(p.CreatedAt))
	if len(p.Conflicting) > 0 {
		line("Conflicting", "%s (declare it with the pool's sharing to become members)", strings.Join(p.Conflicting, ","))
	}
	if len(p.Nodes) == 0 {
		line("Nodes", "none: no admitted node declares it (move its disk to a host that declares the id, or kibo storage-pool declare-lost %s)", p.PoolID)
		return nil
	}
	g.printf("Nodes:\n")
	t := newTable(g.stdout, "  NODE_ID", "AVAILABLE", "PATH", "FS_FREE", "REPORTED", "REASON")
	for _, m := range p.Nodes {
		t.row("  "+m.NodeID, strconv.FormatBool(m.Available), m.Path, formatBytes(m.FreeBytes), stamp(m.ReportedAt), dash(m.Reason))
	}
	t.flush()
	return nil
}

// StoragePoolSetCapacityCmd is `storage-pool set-capacity`.
type StoragePoolSetCapacityCmd struct {
	Pool            string  `arg:"" name:"pool" help:"Pool id (kibo storage-pool list)."`
	Size            string  `arg:"" name:"size" help:"Capacity, such as 500GiB or 2TiB (from 1B to 1EiB)."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the pool must still be at."`
}

func (c *StoragePoolSetCapacityCmd) Run(g *Globals) error {
	size, err := parseSize(c.Size)
	if err != nil {
		return usagef("storage pool %s: size %q: %v", c.Pool, c.Size, err)
	}
	var p api.StoragePool
	raw, err := g.call("POST", poolPath(c.Pool, "capacity"), api.PoolCapacityRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), CapacityBytes: size}, &p)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("storage pool %s: capacity %s, used %s, available %s (version %d)\n", p.PoolID, capacityColumn(p.CapacityBytes), formatBytes(p.UsedBytes), capacityColumn(p.AvailableBytes), p.Version)
	return nil
}

// StoragePoolDeclareLostCmd is `storage-pool declare-lost`.
type StoragePoolDeclareLostCmd struct {
	Pool            string  `arg:"" name:"pool" help:"Pool id (kibo storage-pool list)."`
	ConfirmDataLost bool    `name:"confirm-data-lost" help:"Required: you assert the pool's disk is gone; its objects end for good."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the pool must still be at."`
}

func (c *StoragePoolDeclareLostCmd) Run(g *Globals) error {
	if !c.ConfirmDataLost {
		return usagef("storage pool %s: declare-lost ends its objects for good; add --confirm-data-lost when the disk is really gone", c.Pool)
	}
	var res api.PoolLostResult
	raw, err := g.call("POST", poolPath(c.Pool, "declare-lost"), api.PoolDeclareLostRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), ConfirmDataLost: true}, &res)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("storage pool %s declared lost: %d retained layers and %d Volumes lost\n", res.PoolID, res.RetainedLayers, res.Volumes)
	if len(res.Workspaces) > 0 {
		g.printf("their Workspaces can only be deleted: %s\n", strings.Join(res.Workspaces, " "))
	}
	return nil
}
