package member

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/metrics"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Package member is the composition root of a member process: it opens the
// cluster server, the node runtime, the data-plane and egress processes,
// the node agent and the metrics listener, wires them to each other and
// runs them until the member stops. The CLI only parses flags and the
// configuration file into Options.

// Options are what serve and dev decide about a member.
type Options struct {
	DataDir  datadir.Dir
	Bind     string
	Capacity api.Resources
	Timings  cluster.Timings
	// ClockSkew is what the host clock is off by, as the member sees it
	// (tests); ClockSkewFile, when set, holds it and is read again every
	// second (the fault harness steps a host's clock so).
	ClockSkew     time.Duration
	ClockSkewFile string
	OnReady       func(context.Context, *cluster.Server) // runs beside the member, which waits for it to return
	Systemd       string                                 // see openNodeRuntime
	Accel         qemu.Accel
	// DataPlaneListen is the data-plane address; default advertise port+2.
	DataPlaneListen string
	Pools           []agent.PoolConfig
	// Network is the node's [network]; nil: Workspaces cannot start here.
	Network *netpol.Config
	// EgressWarm is [network] egress_warm_connections (dev: the default).
	EgressWarm  int
	DefaultPool string
	// DeniedReport is the agent's DeniedReportInterval; 0: its default.
	DeniedReport time.Duration
	// MetricsListen is [metrics] listen: "" for the default, "none".
	MetricsListen string
	// LogFormat is text or json, for the member and the processes it starts.
	LogFormat string
	// MachineLogsMax is [logs] machine_logs_max_bytes; 0: the default.
	MachineLogsMax int64
	// Artifacts is [artifacts] (checked); URL "": no artifact store.
	Artifacts artifacts.Config
	// Warm are the warm guests of [templates.NAME] (dev: --warm).
	Warm []agent.WarmConfig
	// API is [api]: the API listener for applications (ctrl members).
	API cluster.APIConfig
	// E2B is [e2b]: the E2B API listener (ctrl members).
	E2B cluster.E2BConfig
}

// Run serves the member of o.DataDir until ctx ends (the CLI ends it on
// SIGTERM and SIGINT). A node isolated by ctrl, or one whose incarnation
// is stale, ends with agent.ErrIsolated or agent.ErrStale after
// destroying its Instances, so that systemd restarts it; a member that
// halted because it cannot apply the Raft log ends with why.
func Run(ctx context.Context, log *slog.Logger, o Options) error {
	// What runs beside the member ends with it: the member's deferred
	// shutdowns run first, then these are cancelled and waited for.
	ctx, cancelOwned := context.WithCancel(ctx)
	var owned sync.WaitGroup
	defer func() {
		cancelOwned()
		owned.Wait()
	}()
	// Before anything else: under systemd this process must be its
	// service's MainPID, and no earlier member process may still run in
	// the service (then cluster.Open takes the data directory's lock).
	if err := serviceCgroupCheck(ctx); err != nil {
		return err
	}
	// Nor may an older release run on what a newer one wrote.
	if err := o.DataDir.CheckRelease(buildinfo.Release); err != nil {
		return err
	}
	if err := removeLeftoverAdmin(o.DataDir, log); err != nil {
		return err
	}
	// The store is ctrl's from the start (it removes Transfer archives).
	var store artifacts.Store
	if o.Artifacts.URL != "" {
		id, err := o.DataDir.LoadIdentity()
		if err != nil {
			return err
		}
		if store, err = artifacts.Open(o.Artifacts, id.NodeID); err != nil {
			return err
		}
		log.Info("artifact store", "url", store.String())
	}
	var skew atomic.Int64
	skew.Store(int64(o.ClockSkew))
	srv, err := cluster.Open(ctx, cluster.Config{DataDir: o.DataDir, Bind: o.Bind, Timings: o.Timings, Logger: log, Artifacts: store, API: o.API, E2B: o.E2B,
		ClockSkew: func() time.Duration { return time.Duration(skew.Load()) }})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	if err := o.DataDir.RecordRelease(buildinfo.Release); err != nil {
		return fmt.Errorf("data directory %s: record the release: %w", o.DataDir, err)
	}
	if o.OnReady != nil {
		owned.Go(func() { o.OnReady(ctx, srv) })
	}
	// What this member serves of its own: the node side (below, on a
	// node) and its metrics, handed over together by serveMetrics.
	var local cluster.Local
	agentErr := make(chan error, 1)
	agentRunning := false
	src := metrics.Sources{FSM: srv.FSM(), Raft: srv.Raft()}
	if src.FSM != nil {
		src.QuotaRefusals = srv.QuotaRefusals
	}
	if srv.FSM() != nil {
		src.ControlSessions = srv.ControlSessions
	}
	var node *agent.Agent
	if srv.Identity().HasRole(api.RoleNode) {
		src.Steps = metrics.NewSteps()
		rt, m, closeRuntime, err := openNodeRuntime(ctx, o, srv.NodeID(), src.Steps, log)
		if err != nil {
			return err
		}
		defer closeRuntime()
		if rt != nil {
			src.Instances, src.Destroyed, src.Egress, src.EgressByInstance, src.Names = rt.Owned, rt.EndedCount, rt.EgressTotals, rt.EgressByInstance, rt.NamesStats
			local.MachineLogs = machineLogReader(rt)
		}
		var dp agent.DataPlane
		if m != nil {
			listen := o.DataPlaneListen
			if listen == "" {
				if listen, err = defaultDataPlaneListen(srv.Identity().Advertise); err != nil {
					return err
				}
			}
			// The data-plane process is never stopped with the node: its
			// connections outlive a node restart.
			link, err := startDataPlane(ctx, o.DataDir, m, listen, srv.DataPlaneCertificate, srv.SigningCA, o.LogFormat, log)
			if err != nil {
				return err
			}
			dp, src.DataPlane, local.DataPlaneCert = link, link.Totals, link.Leaf
		}
		a, err := agent.New(agent.Config{DataDir: o.DataDir, NodeID: srv.NodeID(), Artifacts: store, Capacity: o.Capacity, CtrlAddrs: srv.CtrlAddrs,
			Dial: srv.SessionDial, OnLeader: srv.NoteLeader, SessionTimeout: o.Timings.SessionTimeout, Logger: log, ClockSkew: o.ClockSkew, Runtime: rt, DataPlane: dp,
			Pools: o.Pools, DefaultPool: o.DefaultPool, FetchEgressCredentials: srv.EgressCredentials, DeniedReportInterval: o.DeniedReport, Warm: o.Warm, Observe: src.Steps.Observe})
		if err != nil {
			return err
		}
		src.HostUsage, src.Warm = a.HostUsage, a.WarmGuests
		local.Templates, local.Platforms, local.Transfers, local.Progress = a.PublishTemplate, a.PublishPlatform, a, a.Progress
		agentRunning, node = true, a
		go func() { agentErr <- a.Run(ctx) }()
	}
	if o.ClockSkewFile != "" {
		owned.Go(func() {
			followClockSkew(ctx, o.ClockSkewFile, o.ClockSkew, log, func(d time.Duration) {
				skew.Store(int64(d))
				if node != nil {
					node.SetClockSkew(d)
				}
			})
		})
	}
	if err := serveMetrics(ctx, &owned, srv, src, local, o.MetricsListen, log); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		log.Info("member stopping")
		if agentRunning {
			// The node ends what it was making (a warm guest) first.
			select {
			case <-agentErr:
			case <-time.After(30 * time.Second):
				log.Warn("node did not stop within 30s; stopping anyway")
			}
		}
		return nil
	case <-srv.Halted():
		// The member stopped applying the Raft log (a newer release's
		// entry, or an internal failure) and shut itself down.
		return srv.HaltErr()
	case err := <-agentErr:
		if errors.Is(err, agent.ErrIsolated) || errors.Is(err, agent.ErrStale) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-srv.Halted():
			return srv.HaltErr()
		}
	}
}

// removeLeftoverAdmin deletes the host's operator certificate of a member
// that may not hold one (neither ctrl nor admitted as operator): builds
// before issue 44 gave one to every member, and whoever controls a worker
// host must not control the cluster. ctrl refuses such a certificate
// anyway; removing it leaves nothing to try.
func removeLeftoverAdmin(d datadir.Dir, log *slog.Logger) error {
	id, err := d.LoadIdentity()
	if err != nil {
		return err
	}
	if id.HasRole(api.RoleCtrl) || id.HasRole(api.RoleOperator) {
		return nil
	}
	removed, err := d.RemoveAdminCertificate()
	if removed {
		log.Warn("leftover operator certificate removed: this member is neither ctrl nor admitted as operator", "path", d.AdminCert())
	}
	return err
}
