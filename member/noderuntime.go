package member

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/metrics"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// Service managers a node can run its VMM units under.
const (
	SystemdAuto    = "auto"    // the host's systemd when PID 1 is systemd, else none (serve) or private (dev)
	SystemdHost    = "host"    // the host's systemd (/run/systemd/private)
	SystemdPrivate = "private" // a private systemd started by this process: VMs end with it
	SystemdDev     = "dev"     // a private systemd that outlives the process (kibotos dev): attached on restart
	SystemdNone    = "none"    // no Instances on this node
)

// HostHasSystemd reports whether PID 1 is systemd (sd_booted's test).
func HostHasSystemd() bool {
	_, err := os.Stat("/run/systemd/system")
	return err == nil
}

// openNodeRuntime connects to the service manager chosen by mode and opens
// the Instance runtime, taking over what a previous node process left
// running. It returns nil, nil when the node runs without one.
func openNodeRuntime(ctx context.Context, o Options, nodeID string, steps *metrics.Steps, log *slog.Logger) (*runtime.Runtime, *units.Manager, func(), error) {
	d, mode, accel, network, logFormat := o.DataDir, o.Systemd, o.Accel, o.Network, o.LogFormat
	if mode == SystemdAuto {
		mode = SystemdNone
		if HostHasSystemd() {
			mode = SystemdHost
		}
	}
	var target units.Target
	cleanup := func() {}
	switch mode {
	case SystemdNone:
		log.Warn("node runtime disabled: this host's PID 1 is not systemd, so VMM units have no service manager; run kibotos dev, or serve with --systemd private")
		return nil, nil, cleanup, nil
	case SystemdHost:
		t, err := units.HostTarget()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("node runtime: %w", err)
		}
		target = t
	case SystemdPrivate:
		if err := privsd.Available(); err != nil {
			return nil, nil, nil, fmt.Errorf("node runtime: a private systemd cannot run here: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		sd, err := privsd.Start(sctx, filepath.Join(d.NodeDir(), "systemd"))
		cancel()
		if err != nil {
			return nil, nil, nil, fmt.Errorf("node runtime: start private systemd: %w", err)
		}
		if sd.EndedLeftover != 0 {
			log.Warn("ended the private systemd a previous process of this node left running when it died, with its VMs: they were to end with that process", "systemd_pid", sd.EndedLeftover)
		}
		log.Warn("VMM units run under a private systemd started by this process: they end when it ends", "systemd_pid", sd.PID)
		target, cleanup = sd.Target(), func() { sd.Stop() }
	case SystemdDev:
		if err := privsd.Available(); err != nil {
			// The cluster still runs; the node just cannot start VMs.
			log.Warn("node runtime disabled: a private systemd cannot run here", "err", err)
			return nil, nil, cleanup, nil
		}
		sd, err := devSystemd(ctx, d)
		if err != nil {
			return nil, nil, nil, err
		}
		log.Info("VMM units run under the dev cluster's private systemd; it keeps running when kibotos dev stops (kibotos dev down ends it)", "systemd_pid", sd.PID)
		// Released, not stopped: it outlives this process, which only
		// ends its watch of it.
		target, cleanup = sd.Target(), sd.Release
	default:
		return nil, nil, nil, fmt.Errorf("node runtime: --systemd %q is not auto, host, private or none", mode)
	}
	m, err := units.Connect(ctx, target)
	if err != nil {
		cleanup()
		return nil, nil, nil, fmt.Errorf("node runtime: %w", err)
	}
	own := ""
	if sha, err := platform.SelfSHA256(); err != nil {
		log.Warn("own executable unreadable: no Platform is this node's own", "err", err)
	} else if in := platform.Own(d.StorageRoot(), sha); in != nil {
		own = in.ID
	} else {
		log.Warn("no Platform has this kibotos as its guest agent: Workspaces cannot start here until kibotos platform build runs with it", "agent_sha256", sha)
	}
	if err := os.RemoveAll(earlierWarmMemoryDir(d)); err != nil {
		log.Warn("memory of an earlier build's warm guests not freed", "dir", earlierWarmMemoryDir(d), "err", err)
	}
	cfg := runtime.Config{StorageRoot: d.StorageRoot(), NodeID: nodeID, Units: m, Accel: accel, Logger: log, OwnInstallation: own, Network: network,
		Observe: steps.Observe, MachineLogsMaxBytes: o.MachineLogsMax,
		Pools: []runtime.PoolDir{{ID: api.PrivatePoolID(nodeID), Path: agent.DefaultPoolPath(d)}}}
	for _, p := range o.Pools {
		cfg.Pools = append(cfg.Pools, runtime.PoolDir{ID: p.ID, Path: p.Path, Shared: p.Shared})
	}
	var sup *egress.Supervisor
	if network != nil {
		// Without it the node runs, but refuses policies naming an Egress
		// or a Resolver (and says why).
		if sup, err = openEgress(ctx, d, m, logFormat, o.EgressWarm, log); err != nil {
			log.Warn("egress process unavailable: Workspaces whose policy names an Egress or a Resolver cannot start here", "err", err)
			cfg.EgressUnavailable = err
		} else {
			cfg.Egress = sup
		}
	}
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		if sup != nil {
			sup.Close()
		}
		m.Close()
		cleanup()
		return nil, nil, nil, err
	}
	if sup != nil {
		switchEgressBuild(ctx, sup, log)
	}
	return rt, m, func() {
		rt.Close() // VMMs keep running; the next node process takes them over
		if sup != nil {
			sup.Close() // so does the egress process
		}
		m.Close()
		cleanup()
	}, nil
}

// serviceCgroupCheck runs the node's start-up check of its own MainPID and
// service cgroup when the host runs systemd.
func serviceCgroupCheck(ctx context.Context) error {
	if !HostHasSystemd() {
		return nil
	}
	root, err := units.Cgroup2Mount()
	if err != nil {
		return nil // no cgroup2: nothing to check against
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	return agent.CheckServiceCgroup(root, string(self), os.Getpid(), func(unit string) (int, error) {
		return hostMainPID(ctx, unit)
	})
}

// hostMainPID asks the host's systemd for the MainPID of unit.
func hostMainPID(ctx context.Context, unit string) (int, error) {
	t, err := units.HostTarget()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := units.Connect(ctx, t)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	u, err := m.Get(ctx, unit)
	if err != nil {
		return 0, err
	}
	return int(u.MainPID), nil
}

// DevSystemdDir is where the dev cluster's private systemd lives.
func DevSystemdDir(d datadir.Dir) string { return filepath.Join(d.NodeDir(), "systemd") }

// devSystemd attaches to the dev cluster's private systemd, or starts it
// detached so VMs outlive this kibotos dev process.
func devSystemd(ctx context.Context, d datadir.Dir) (*privsd.Instance, error) {
	if err := privsd.Available(); err != nil {
		return nil, fmt.Errorf("node runtime: a private systemd cannot run here: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sd, err := privsd.Attach(sctx, DevSystemdDir(d))
	if errors.Is(err, privsd.ErrNotRunning) {
		sd, err = privsd.StartWith(sctx, DevSystemdDir(d), privsd.Options{Detached: true})
	}
	if err != nil {
		return nil, fmt.Errorf("node runtime: dev private systemd: %w", err)
	}
	return sd, nil
}

// NodeSocketDir is the node's socket directory, /run/kibotos/node by
// default as the process-model documentation has it. Another node on the
// same host (a data directory other than the system one) gets
// /run/kibotos/node-<scope>. A private systemd has its own /run, so
// there it is in the shared temporary directory: <tmp>/kibotos-<scope>/node.
func NodeSocketDir(d datadir.Dir, privateSystemd bool) string {
	scope := NodeScope(d)
	switch {
	case privateSystemd:
		return filepath.Join(os.TempDir(), "kibotos-"+scope, "node")
	case filepath.Clean(string(d)) == datadir.SystemDir:
		return "/run/kibotos/node"
	}
	return "/run/kibotos/node-" + scope
}

// EgressSocketDir is the socket directory of the node's egress processes:
// the node's socket directory with "-egress" added.
func EgressSocketDir(d datadir.Dir, privateSystemd bool) string {
	return NodeSocketDir(d, privateSystemd) + "-egress"
}

// DataPlaneSocketDir is the socket directory of the node's data-plane
// processes: dataplane/ in the node's socket directory, never the node's
// state directory (process-model documentation).
func DataPlaneSocketDir(d datadir.Dir, privateSystemd bool) string {
	return filepath.Join(NodeSocketDir(d, privateSystemd), "dataplane")
}

// earlierDataPlaneSocketDir is where builds before the node socket
// directory kept the data plane's control sockets and generation counter:
// a data-plane process they started is adopted there. It also names the
// node's scope (NodeScope), which did not move with it.
func earlierDataPlaneSocketDir(d datadir.Dir) string {
	return filepath.Join(d.NodeDir(), "dataplane")
}

// earlierEgressSocketDir is where builds before the node socket
// directory kept the egress control sockets: an egress process they
// started is adopted there.
func earlierEgressSocketDir(d datadir.Dir, privateSystemd bool) string {
	base := "/run/kibotos"
	if privateSystemd {
		base = os.TempDir()
	}
	return filepath.Join(base, "kibotos-egress-"+NodeScope(d))
}

// RemoveEgressSocketDirs removes the egress socket directories of a
// private systemd's node (its processes ended with it), the temporary
// directory holding them (and the data plane's, in the node socket
// directory there) and an earlier build's.
func RemoveEgressSocketDirs(d datadir.Dir) error {
	return errors.Join(os.RemoveAll(filepath.Dir(NodeSocketDir(d, true))), os.RemoveAll(earlierEgressSocketDir(d, true)))
}

// earlierWarmMemoryDir is where the node's warm guests kept their RAM
// while they waited saved, before warm guests were kept running
// (/dev/shm/kibotos-<scope>-warm): host memory the node frees as it
// starts.
func earlierWarmMemoryDir(d datadir.Dir) string {
	return filepath.Join("/dev/shm", "kibotos-"+NodeScope(d)+"-warm")
}

// NodeScope tells this node's units and directories from other nodes' on
// the host (the data plane's scope).
func NodeScope(d datadir.Dir) string {
	return dataplane.ScopeFor(earlierDataPlaneSocketDir(d))
}

// openEgress prepares the node's egress process supervisor (it starts the
// process only once a policy needs it). Its socket directory must be one
// both this process and the service manager see at the same path, and the
// kibotos-egress user can reach: /run/kibotos under the host's systemd; a
// private systemd has its own /run, so the shared /tmp then.
func openEgress(ctx context.Context, d datadir.Dir, m *units.Manager, logFormat string, warm int, log *slog.Logger) (*egress.Supervisor, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locate the kibotos executable: %w", err)
	}
	private := m.Target().ManagerPID > 1
	socketDir := EgressSocketDir(d, private)
	if err := os.MkdirAll(filepath.Dir(socketDir), 0o755); err != nil {
		return nil, err
	}
	return egress.OpenSupervisor(ctx, egress.SupervisorConfig{
		Units: m, Executable: exe, Scope: NodeScope(d),
		SocketDir:         socketDir,
		EarlierSocketDirs: []string{earlierEgressSocketDir(d, private)},
		StateDir:          filepath.Join(d.StorageRoot(), "state"),
		TCPListen:         "0.0.0.0:" + strconv.Itoa(runtime.EgressTCPPort),
		DNSListen:         runtime.EgressDNS.String(),
		LogFormat:         logFormat,
		WarmConnections:   warm,
		Logger:            log,
	})
}

// switchEgressBuild moves an adopted egress process of another build to a
// new generation of this one, once the runtime gave it the routes: the new
// one takes the sockets; the old one drains its connections when both
// builds are on one release line, else it is ended at once.
func switchEgressBuild(ctx context.Context, sup *egress.Supervisor, log *slog.Logger) {
	gens := sup.Generations()
	if len(gens) == 0 {
		return
	}
	serving := gens[len(gens)-1]
	if serving.Draining || (serving.Revision == buildinfo.SourceRevision() && serving.Release == buildinfo.ReleaseName()) {
		return // the node's own build (two releases stamped on one revision are two)
	}
	sameLine := buildinfo.SameLine(serving.Release, buildinfo.ReleaseName())
	log.Info("egress process of another build: switching to a new generation", "generation", serving.Number, "its_revision", serving.Revision,
		"its_release", serving.Release, "revision", buildinfo.SourceRevision(), "release", buildinfo.ReleaseName(), "same_release_line", sameLine)
	switchTo := sup.Switch
	if !sameLine {
		switchTo = sup.Replace
	}
	if err := switchTo(ctx); err != nil {
		log.Error("egress generation switch failed; the old generation keeps serving", "err", err)
	}
}

// machineLogReader serves `workspace logs` on this node from its runtime.
func machineLogReader(rt *runtime.Runtime) cluster.MachineLogReader {
	return func(id string, q api.MachineLogQuery) (api.MachineLog, error) {
		from, err := runtime.ParseConsoleCursor(q.After)
		if err != nil {
			return api.MachineLog{}, api.Errorf(api.CodeInvalidArgument, "%v", err)
		}
		l, err := rt.ReadMachineLog(id, from, q.MaxBytes)
		if errors.Is(err, runtime.ErrNoMachineLog) {
			return api.MachineLog{}, api.Errorf(api.CodeNotFound, "this node has no machine log of instance %s", id)
		}
		if err != nil {
			return api.MachineLog{}, err
		}
		return api.MachineLog{InstanceID: id, Live: l.Live, Running: l.Running, Console: string(l.Console.Data), ConsoleTruncated: l.Console.Truncated,
			VMM: string(l.VMM.Data), VMMTruncated: l.VMM.Truncated, ConsoleCursor: l.Cursor.String()}, nil
	}
}
