package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
)

// CheckUpgradeCmd is `kibotos check-upgrade`, run with the *target*
// build before it replaces the node's program: the quiescence of
// check-maintenance --operation upgrade, plus whether this build reads
// every record, has its runtime, can keep each running Instance's
// installation and speaks each running guest's protocol. --preview asks
// a live node the same per-item questions without its lock.
type CheckUpgradeCmd struct {
	Config     string `name:"config" type:"existingfile" help:"The node's TOML configuration (data_dir, [[storage.pools]])."`
	RuntimeDir string `name:"runtime-dir" required:"" help:"This build's own Platform: the directory kibotos platform build (run with this binary) printed, under the node's <storage root>/installations."`
	Preview    bool   `name:"preview" help:"Run beside a live node: no lock, nothing written; items that depend on the node being stopped are left to the check after it stopped."`
	Systemd    string `name:"systemd" default:"auto" enum:"auto,host,dev,none" help:"Where the VMM units run (as for check-maintenance)."`
}

func (c *CheckUpgradeCmd) Run(g *Globals) error {
	cfg, d, id, err := checkRuntimeConfig(g, c.Config)
	if err != nil {
		return err
	}
	var node []runtime.UpgradeItem
	switch {
	case id != nil:
		node = append(node, runtime.UpgradeItem{Verdict: runtime.VerdictOK, Object: "identity " + d.IdentityFile(), Detail: "node " + id.NodeID})
	case errors.Is(cfg.identityErr, recordfmt.ErrOutOfRange):
		node = append(node, runtime.UpgradeItem{Verdict: runtime.VerdictBlocked, Object: "identity " + d.IdentityFile(), Detail: cfg.identityErr.Error()})
	default:
		return api.Errorf(api.CodeFailedPrecondition, "data directory %s: %v: check --data-dir or data_dir in the configuration", d, cfg.identityErr)
	}
	for _, err := range agent.CheckNodeRecords(d) {
		node = append(node, runtime.UpgradeItem{Verdict: runtime.VerdictBlocked, Object: "node record", Detail: err.Error()})
	}
	sha, err := platform.SelfSHA256()
	if err != nil {
		return err
	}
	target := runtime.UpgradeTarget{Release: buildinfo.Release, RuntimeDir: c.RuntimeDir, AgentSHA256: sha,
		Executables: runtime.DefaultExecutables, MinProtocol: guestproto.MinProtocolVersion, MaxProtocol: guestproto.ProtocolVersion,
		Capabilities: guestproto.Capabilities, Preview: c.Preview}
	ctx, cancel := context.WithTimeout(g.ctx, 2*time.Minute)
	defer cancel()
	if !c.Preview {
		m, closeUnits, err := unitsOf(ctx, d, c.Systemd)
		if err != nil {
			return err
		}
		defer closeUnits()
		cfg.Units = m
	}
	rep, err := runtime.CheckUpgrade(ctx, cfg.Config, target)
	if errors.Is(err, runtime.ErrRuntimeInUse) {
		return api.Errorf(api.CodeFailedPrecondition, "%v (or ask with --preview)", err)
	}
	if err != nil {
		return err
	}
	rep.Items = append(node, rep.Items...)
	for _, it := range node {
		rep.OK = rep.OK && it.Verdict != runtime.VerdictBlocked
	}
	nodeID := "with an unreadable identity"
	if id != nil {
		nodeID = id.NodeID
	}
	if g.JSON {
		if err := g.printJSONValue(rep); err != nil {
			return err
		}
	} else {
		for _, it := range rep.Items {
			g.printf("%s: %s: %s\n", it.Verdict, it.Object, it.Detail)
		}
		if c.Preview {
			g.printf("%s\n", runtime.NotJudgedByPreview)
		}
	}
	what := "check-upgrade"
	if c.Preview {
		what += " --preview"
	}
	if !rep.OK {
		return exitError{api.ExitFailedPrecondition, fmt.Sprintf("%s: node %s cannot be taken over by kibotos %s yet; deal with the lines marked blocked: first", what, nodeID, buildinfo.ReleaseName())}
	}
	g.note("%s: kibotos %s can take node %s over (%d items checked)\n", what, buildinfo.ReleaseName(), nodeID, len(rep.Items))
	return nil
}
