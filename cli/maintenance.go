package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// CheckMaintenanceCmd is `kibotos check-maintenance`: run with the node
// service stopped, before replacing (upgrade) or uninstalling (remove) the
// program. It only reads; exit 0 when the operation may go ahead, 13 when
// something blocks it (listed), or when a node process still runs.
type CheckMaintenanceCmd struct {
	Operation string `name:"operation" required:"" enum:"upgrade,remove" help:"upgrade: Instances may keep running if every record matches its unit; remove: nothing may run or be held."`
	Config    string `name:"config" type:"existingfile" help:"The node's TOML configuration (data_dir, [[storage.pools]])."`
	Systemd   string `name:"systemd" default:"auto" enum:"auto,host,dev,none" help:"Where the VMM units run: auto (the host's systemd when PID 1 is systemd, else kibotos dev's private one if it runs), host, dev, or none (they ended with a private systemd)."`
}

func (c *CheckMaintenanceCmd) Run(g *Globals) error {
	cfg, d, id, err := checkRuntimeConfig(g, c.Config)
	if err != nil {
		return err
	}
	if id == nil {
		return api.Errorf(api.CodeFailedPrecondition, "data directory %s: %v: check --data-dir or data_dir in the configuration", d, cfg.identityErr)
	}
	ctx, cancel := context.WithTimeout(g.ctx, time.Minute)
	defer cancel()
	m, closeUnits, err := unitsOf(ctx, d, c.Systemd)
	if err != nil {
		return err
	}
	defer closeUnits()
	cfg.Units = m
	rep, err := runtime.CheckMaintenance(ctx, cfg.Config, c.Operation)
	if errors.Is(err, runtime.ErrRuntimeInUse) {
		return api.Errorf(api.CodeFailedPrecondition, "%v", err)
	}
	if err != nil {
		return err
	}
	if g.JSON {
		if err := g.printJSONValue(rep); err != nil {
			return err
		}
	} else {
		t := newTable(g.stdout, "OBJECT", "STATE", "BLOCKS", "DETAIL")
		for _, it := range rep.Items {
			blocks := "no"
			if it.Blocking {
				blocks = "yes"
			}
			t.row(it.Object, it.State, blocks, it.Detail)
		}
		t.flush()
	}
	if !rep.OK {
		return exitError{api.ExitFailedPrecondition, fmt.Sprintf("check-maintenance --operation %s: node %s is not ready for it; deal with the items marked BLOCKS above first", c.Operation, id.NodeID)}
	}
	g.note("check-maintenance --operation %s: node %s may go ahead (%d items checked)\n", c.Operation, id.NodeID, len(rep.Items))
	return nil
}

// checkConfig is the runtime configuration a check reads, and why the
// node's identity could not be read (id nil).
type checkConfig struct {
	runtime.Config
	identityErr error
}

// checkRuntimeConfig loads what the checks read of a node: its data
// directory, identity and pools. An unreadable identity is returned as
// identityErr with a nil id (check-upgrade reports it as an item).
func checkRuntimeConfig(g *Globals, config string) (checkConfig, datadir.Dir, *datadir.Identity, error) {
	fc, d, err := loadNodeConfig(g, config)
	if err != nil {
		return checkConfig{}, d, nil, err
	}
	pools, err := poolsFrom(config, fc)
	if err != nil {
		return checkConfig{}, d, nil, err
	}
	id, idErr := d.LoadIdentity()
	nodeID := ""
	if id != nil {
		nodeID = id.NodeID
	}
	cfg := runtime.Config{StorageRoot: d.StorageRoot(), NodeID: nodeID,
		Pools: []runtime.PoolDir{{ID: api.PrivatePoolID(nodeID), Path: agent.DefaultPoolPath(d)}}}
	for _, p := range pools {
		cfg.Pools = append(cfg.Pools, runtime.PoolDir{ID: p.ID, Path: p.Path, Shared: p.Shared})
	}
	return checkConfig{Config: cfg, identityErr: idErr}, d, id, nil
}

// unitsOf connects to the service manager the node's VMM units run
// under (mode: --systemd), without starting one; nil when there is none.
func unitsOf(ctx context.Context, d datadir.Dir, mode string) (*units.Manager, func(), error) {
	none := func() {}
	if mode == member.SystemdAuto {
		mode = member.SystemdNone
		if member.HostHasSystemd() {
			mode = member.SystemdHost
		} else if sd, err := privsd.Attach(ctx, member.DevSystemdDir(d)); err == nil {
			return connectPrivsd(ctx, sd)
		}
	}
	switch mode {
	case member.SystemdHost:
		t, err := units.HostTarget()
		if err != nil {
			return nil, none, err
		}
		return connectUnits(ctx, t)
	case member.SystemdDev:
		sd, err := privsd.Attach(ctx, member.DevSystemdDir(d))
		if err != nil {
			return nil, none, fmt.Errorf("kibotos dev's private systemd: %w", err)
		}
		return connectPrivsd(ctx, sd)
	}
	return nil, none, nil
}

// connectPrivsd connects to kibotos dev's private systemd, which keeps
// running after this command: the cleanup (or a failed connect) lets it go.
func connectPrivsd(ctx context.Context, sd *privsd.Instance) (*units.Manager, func(), error) {
	m, done, err := connectUnits(ctx, sd.Target())
	if err != nil {
		sd.Release()
		return nil, done, err
	}
	return m, func() { done(); sd.Release() }, nil
}

func connectUnits(ctx context.Context, t units.Target) (*units.Manager, func(), error) {
	m, err := units.Connect(ctx, t)
	if err != nil {
		return nil, func() {}, err
	}
	return m, func() { m.Close() }, nil
}
