// Package agent is the node side of a member: it holds the control session
// to the ctrl leader, reports the node's resources, pools and host usage,
// and applies what ctrl sends (overcommit values, isolation).
//
// It never writes cluster state directly: everything goes through the
// control session, and ctrl decides.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent/hostusage"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/progress"
)

// ErrIsolated is returned by Run when ctrl refused this incarnation as
// isolated: the node has destroyed its Instances and must exit, so that
// systemd starts it again with a new incarnation.
var ErrIsolated = errors.New("node incarnation is isolated")

// ErrStale is returned by Run when a newer incarnation of this node exists.
var ErrStale = errors.New("a newer incarnation of this node is running")

// Config configures the node agent.
type Config struct {
	DataDir datadir.Dir
	NodeID  string
	// Artifacts is the cluster's artifact store ([artifacts] url); nil:
	// templates stay where they were built.
	Artifacts artifacts.Store
	// FetchEgressCredentials asks ctrl, with the node's member
	// certificate, for one Egress revision's credentials.
	FetchEgressCredentials func(ctx context.Context, name string, rev uint64) (*api.EgressCredentials, error)
	// Capacity is what the host gives to VMs ([resources] in the config).
	Capacity api.Resources
	// CtrlAddrs lists ctrl API addresses, best first.
	CtrlAddrs func() []string
	// Dial opens a control-session connection to a ctrl member at an
	// address; it verifies that the member there is ctrl.
	Dial func(ctx context.Context, addr string) (*tls.Conn, error)
	// OnLeader, when set, learns the ctrl leader's address whenever a
	// session is established (only the leader accepts one).
	OnLeader       func(addr string)
	SessionTimeout time.Duration
	// DeniedReportInterval is the least time between two reports pushed
	// only because guests' denied counts changed (each report is a Raft
	// entry); default DefaultDeniedReportInterval.
	DeniedReportInterval time.Duration
	// FenceInterval is how often the holder records of the Instances'
	// layers are checked (default DefaultFenceInterval); HandoverWait how
	// long a start waits after taking a layer over from another node
	// (default three intervals).
	FenceInterval time.Duration
	HandoverWait  time.Duration
	Logger        *slog.Logger
	// ClockSkew is added to every timestamp the node sends (tests of the
	// 30 s clock rule; zero in production).
	ClockSkew time.Duration
	// SampleInterval of host usage; 10 s by default.
	SampleInterval time.Duration
	// AdjustReport, when set, edits every report before it is sent. It is a
	// test seam for held objects the node runtime does not create yet.
	AdjustReport func(*api.Report)
	// HoldTask, when set, sees every task ctrl sends first; one it returns
	// true for is neither executed nor answered. A test seam: ctrl's side
	// of a command its node has not answered yet, and what the task
	// carried.
	HoldTask func(api.WorkspaceTask) bool
	// Observe, when set, is told how long each completed step of a
	// Workspace start took (WorkspaceStartSteps; metrics histograms).
	Observe func(step string, d time.Duration)
	// PlatformAgent is the digest of the guest agent of the Platform new
	// Instances start on; "" is this executable's (platform.SelfSHA256).
	// Tests whose node is not the agent binary give the fixture's.
	PlatformAgent string
	// Runtime runs this node's Instances; nil on a node without a service
	// manager for VMMs (no Instances are counted or destroyed then).
	Runtime *runtime.Runtime
	// DataPlane is the node's data-plane process; nil: no exec, files or
	// port forwarding on this node.
	DataPlane DataPlane
	// Pools are storage pools besides the private "default" one (under
	// the storage root); DefaultPool names the one new layers go to.
	Pools       []PoolConfig
	DefaultPool string
	// Warm asks for warm guests ([templates.NAME] warm = N).
	Warm []WarmConfig
}

// PoolConfig is a configured storage pool. A shared pool is the same
// directory on every node that declares it (a shared filesystem), so a
// Workspace whose layer is there can start on any of them.
type PoolConfig struct {
	ID     string
	Path   string
	Shared bool
}

// Agent is the running node side.
type Agent struct {
	cfg         Config
	skew        atomic.Int64 // Config.ClockSkew, as SetClockSkew left it
	log         *slog.Logger
	incarnation uint64
	sampler     *hostusage.Sampler
	bg          background // every goroutine the agent starts
	idle        idleMeter  // when each running Instance was last in use (idle.go)

	mu         sync.Mutex
	overcommit *api.Multipliers
	sessionID  string
	send       func(api.SessionMsg) error // of the live session, nil when disconnected
	// resultReports: the live session's leader takes the report owed
	// after a task in the task's result message (api.SessionMsg).
	resultReports bool
	// credentialKeys verify data-plane credentials, the signing key first;
	// ctrl sends them at welcome (checked by welcomeKeys).
	credentialKeys [][]byte
	// dataPushed is the targets the data plane last took.
	dataPushed []DataTarget
	// dataPushing: watchInstances has a push under way.
	dataPushing atomic.Bool
	// draining: ctrl requested a drain; new Workspaces are refused here too.
	draining bool
	// lastAliveCheck of the data-plane process.
	lastAliveCheck time.Time
	// fetchMu serializes fetches of templates from the artifact store.
	fetchMu sync.Mutex
	// exports are the Transfer exports in progress (transfers.go).
	exports exports
	// sent is the last report a session took, whoever pushed it: the
	// watcher pushes only what changed since (a task's answer is
	// followed by a report of its own, and a second one a moment later
	// was one more Raft entry per task).
	sent struct {
		sync.Mutex
		report api.Report
		at     time.Time
	}
	// transfers are the publishes, fetches and imports running here, for
	// the operator's progress bars (Progress).
	transfers progress.Board
	// templates as last listed, valid while the directory's mtime is templatesMod.
	templates       localTemplates
	templatesMod    time.Time
	templatesListed time.Time

	tasks *tasks
	// commands is volume-commands.json: the commands on storage objects
	// run here.
	commands *commandLog
	// watched is what the report watcher last saw of each pool.
	watched map[string]*watchedPool
	// ended: what ctrl is told of the ended-Instance records.
	ended endedRecords
	// warm: the warm guests' counts (warm.go).
	warm warmState
}

// New starts a new incarnation of the node.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DeniedReportInterval <= 0 {
		cfg.DeniedReportInterval = DefaultDeniedReportInterval
	}
	if cfg.FenceInterval <= 0 {
		cfg.FenceInterval = DefaultFenceInterval
	}
	if cfg.HandoverWait <= 0 {
		cfg.HandoverWait = 3 * cfg.FenceInterval
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 10 * time.Second
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = 10 * time.Second
	}
	inc, err := nextIncarnation(cfg.DataDir.NodeDir())
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(DefaultPoolPath(cfg.DataDir), 0o700); err != nil {
		return nil, fmt.Errorf("default storage pool %s: %w", DefaultPoolPath(cfg.DataDir), err)
	}
	if err := checkPools(&cfg); err != nil {
		return nil, err
	}
	// A node without a runtime has no VMs to count.
	var vmCgroup string
	if cfg.Runtime != nil {
		vmCgroup = cfg.Runtime.VMSliceCgroup()
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("node_id", cfg.NodeID), incarnation: inc,
		sampler: hostusage.NewSampler(hostusage.Config{Interval: cfg.SampleInterval, VMCgroup: vmCgroup})}
	a.skew.Store(int64(cfg.ClockSkew))
	a.idle.readCPU = hostusage.CgroupCPUUsec
	a.initTasks()
	if err := a.initWarm(); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.NodeID, err)
	}
	if a.commands, err = openCommandLog(cfg.DataDir.StorageRoot()); err != nil {
		return nil, fmt.Errorf("node %s: %w", cfg.NodeID, err)
	}
	a.log.Info("node starting", "incarnation", inc)
	return a, nil
}

// Incarnation is this process's incarnation.
func (a *Agent) Incarnation() uint64 { return a.incarnation }

// SessionID is the current control session id, "" when disconnected.
func (a *Agent) SessionID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessionID
}

// Run holds the control session until ctx ends, reconnecting as needed.
// It returns once every goroutine the agent started has returned: the
// commands in flight are cancelled with it.
func (a *Agent) Run(ctx context.Context) error {
	defer a.bg.end()
	stop := context.AfterFunc(ctx, a.bg.stop)
	defer stop()
	a.bg.spawn(ctx, a.sampler.Run)
	// The baseline is what the first session's full report will carry at
	// the latest, so the watcher pushes only later changes.
	first := a.buildReport(false)
	a.notePools(first.Pools)
	a.bg.spawn(ctx, func(ctx context.Context) { a.watchInstances(ctx, first) })
	a.bg.spawn(ctx, a.watchHolders)
	a.bg.spawn(ctx, a.sweepUnowned)
	// Warm guests, ready or being made, end when ctx ends, before Run
	// returns and the caller closes the runtime (which leaves VMMs
	// running): no Workspace's, they would outlive the node. They end
	// first: each ends through the runtime.
	warmCtx, stopWarm := context.WithCancel(ctx)
	warmDone := make(chan struct{})
	a.bg.spawn(ctx, func(context.Context) { defer close(warmDone); a.runWarm(warmCtx) })
	defer func() { stopWarm(); <-warmDone }()
	backoff := 200 * time.Millisecond
	for {
		err := a.connectOnce(ctx)
		switch {
		case errors.Is(err, ErrIsolated):
			a.log.Error("node isolated: destroying every Instance and exiting; the service manager restarts it with a new incarnation", "incarnation", a.incarnation)
			a.destroyAllInstances(ctx)
			return err
		case errors.Is(err, ErrStale):
			a.log.Error("control session refused", "err", err)
			return err
		case ctx.Err() != nil:
			return nil
		case err != nil:
			a.log.Debug("control session ended", "err", err)
		default:
			backoff = 200 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

// destroyAllInstances ends every Instance of this node: after isolate, ctrl
// has released their storage to others, so none may keep writing.
func (a *Agent) destroyAllInstances(ctx context.Context) {
	rt := a.cfg.Runtime
	if rt == nil {
		return
	}
	for _, st := range rt.List() {
		// Not cancelled with Run: after isolation every Instance must go,
		// even as the node shuts down, for ctrl gave their storage away.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := rt.Delete(dctx, st.ID)
		cancel()
		if err != nil {
			a.log.Error("instance not destroyed after isolation", "instance_id", st.ID, "err", err)
			continue
		}
		a.log.Info("instance destroyed after isolation", "instance_id", st.ID)
	}
}

func (a *Agent) now() int64 { return time.Now().Add(time.Duration(a.skew.Load())).UnixNano() }

// SetClockSkew changes Config.ClockSkew: tests of a clock that drifted
// off and comes back.
func (a *Agent) SetClockSkew(d time.Duration) { a.skew.Store(int64(d)) }

// DefaultCapacity is what a node gives to VMs when [resources] is silent:
// every CPU and 90% of memory (the rest is the host's).
func DefaultCapacity() api.Resources {
	var si unix.Sysinfo_t
	mem := uint64(0)
	if unix.Sysinfo(&si) == nil {
		mem = uint64(si.Totalram) * uint64(si.Unit) / 10 * 9
	}
	cpus := 1
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		cpus = set.Count()
	}
	return api.Resources{CPU: api.Milli(cpus * 1000), MemoryBytes: mem}
}
