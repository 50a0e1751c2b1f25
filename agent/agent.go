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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent/hostusage"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/progress"
	"github.com/kibotos/kibotos/vmm/template"
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

	mu         sync.Mutex
	overcommit *api.Multipliers
	sessionID  string
	send       func(api.SessionMsg) error // of the live session, nil when disconnected
	// resultReports: the live session's leader takes the report owed
	// after a task in the task's result message (api.SessionMsg).
	resultReports bool
	// credentialKey verifies data-plane credentials; ctrl sends it at welcome.
	credentialKey []byte
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

// DefaultPoolPath is the directory of the node's private pool.
func DefaultPoolPath(d datadir.Dir) string { return filepath.Join(d.StorageRoot(), "pools", "default") }

// checkPools validates the configured pools: valid unique ids, absolute
// paths, and a default pool that exists. Another node's private pool
// ("node-a:default") may be declared: its disk was moved here.
func checkPools(cfg *Config) error {
	own := api.PrivatePoolID(cfg.NodeID)
	seen := map[string]bool{api.LegacyPrivatePool: true, own: true}
	for _, p := range cfg.Pools {
		switch {
		case p.ID == "" || seen[p.ID]:
			return fmt.Errorf("storage pool %q: ids must be non-empty and unique (\"default\" and %q are the node's own pool)", p.ID, own)
		case api.ValidPoolID(p.ID) != nil:
			return fmt.Errorf("storage pool %q: use 1-63 lowercase letters, digits, '.', '_' or '-' (or NODE:default for the moved private pool of another node)", p.ID)
		case api.PrivatePoolOwner(p.ID) != "" && p.Shared:
			return fmt.Errorf("storage pool %s: a node's private pool is never shared; remove shared = true", p.ID)
		case !filepath.IsAbs(p.Path):
			return fmt.Errorf("storage pool %s: path %q is not absolute", p.ID, p.Path)
		}
		seen[p.ID] = true
	}
	if cfg.DefaultPool == own {
		cfg.DefaultPool = ""
	}
	if cfg.DefaultPool != "" && !seen[cfg.DefaultPool] {
		return fmt.Errorf("default pool %q is not configured: add it under [[storage.pools]] or leave default_pool empty", cfg.DefaultPool)
	}
	return nil
}

// poolPath is the directory of pool id, "" when the node has no such pool.
func (a *Agent) poolPath(id string) string {
	if id == "" || id == api.LegacyPrivatePool || id == api.PrivatePoolID(a.cfg.NodeID) {
		return DefaultPoolPath(a.cfg.DataDir)
	}
	for _, p := range a.cfg.Pools {
		if p.ID == id {
			return p.Path
		}
	}
	return ""
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

// watchInstances pushes a full report whenever what the node runs changes,
// so ctrl's counts (drain, placement) do not wait for the next sync.
func (a *Agent) watchInstances(ctx context.Context, first api.Report) {
	a.noteSent(first)
	lastDataPlane := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// Without the ended-Instance records: they are read from disk and
		// travel with the report the change triggers anyway.
		r := a.buildReport(false)
		a.notePools(r.Pools)
		last, lastPush := a.lastSent()
		changed := r.Instances != last.Instances || r.Allocated != last.Allocated || reportedStates(r) != reportedStates(last) ||
			!slices.Equal(r.Warm, last.Warm)
		// New denied counts alone are pushed, but not more often than
		// the interval: each report is a Raft entry.
		if changed || deniedCounts(r) != deniedCounts(last) && time.Since(lastPush) >= a.cfg.DeniedReportInterval {
			a.PushReport() // one that fails is tried again at the next tick
		}
		// The seed: the node resends its state to the data plane at least
		// every 15 seconds (a restarted data plane gets it that way).
		// One such push at a time: against a data plane that hangs, a
		// push a second would otherwise pile up behind the last.
		if (time.Since(lastDataPlane) >= 15*time.Second || !a.dataPlaneAlive(ctx) || a.dataTargetsChanged()) && a.dataPushing.CompareAndSwap(false, true) {
			lastDataPlane = time.Now()
			a.bg.spawn(ctx, func(ctx context.Context) {
				defer a.dataPushing.Store(false)
				a.updateDataPlane(ctx)
			})
		}
	}
}

// reportedStates is what of a report is worth a push when it changes: the
// Instances' states, the templates and the pools' availability (ctrl
// places nothing that needs an unavailable pool). Denied counts and free
// bytes are not: they change all the time and ride along with the next
// report.
func reportedStates(r api.Report) string {
	var b strings.Builder
	for _, st := range r.InstanceStates {
		fmt.Fprintf(&b, "%s %s %q %t;", st.InstanceID, st.State, st.Error, st.GuestNotResponding)
	}
	for _, p := range r.Pools {
		fmt.Fprintf(&b, "%s %t;", p.PoolID, p.Available)
	}
	fmt.Fprint(&b, r.Templates, r.TemplateBytes, r.TemplateDigests)
	return b.String()
}

// DefaultDeniedReportInterval is Config.DeniedReportInterval's default.
const DefaultDeniedReportInterval = 30 * time.Second

// deniedCounts are a report's denied counts, to tell whether they changed.
func deniedCounts(r api.Report) string {
	var b strings.Builder
	for _, st := range r.InstanceStates {
		fmt.Fprintf(&b, "%s %d;", st.InstanceID, st.DeniedPackets)
	}
	return b.String()
}

func (a *Agent) now() int64 { return time.Now().Add(time.Duration(a.skew.Load())).UnixNano() }

// SetClockSkew changes Config.ClockSkew: tests of a clock that drifted
// off and comes back.
func (a *Agent) SetClockSkew(d time.Duration) { a.skew.Store(int64(d)) }

// connectOnce finds the leader and runs one session; it returns when the
// session ends.
func (a *Agent) connectOnce(ctx context.Context) error {
	addrs := a.cfg.CtrlAddrs()
	if len(addrs) == 0 {
		return errors.New("no ctrl member known")
	}
	var lastErr error
	tried := map[string]bool{}
	for i := 0; i < len(addrs) && i < 8; i++ {
		addr := addrs[i]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		leader, err := a.session(ctx, addr)
		if leader != "" && !tried[leader] {
			addrs = append(addrs[:i+1], append([]string{leader}, addrs[i+1:]...)...)
		}
		if err == nil || errors.Is(err, ErrIsolated) || errors.Is(err, ErrStale) || ctx.Err() != nil {
			return err
		}
		lastErr = err
	}
	return lastErr
}

// session runs one control session against addr. It returns the leader's
// address when addr redirected.
func (a *Agent) session(ctx context.Context, addr string) (redirect string, err error) {
	conn, err := a.cfg.Dial(ctx, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	enc := json.NewEncoder(conn)
	dec := api.NewSessionDecoder(conn)
	var wmu sync.Mutex
	send := func(m api.SessionMsg) error {
		wmu.Lock()
		defer wmu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		return enc.Encode(m)
	}
	if err := send(api.SessionMsg{Type: api.MsgHello, NodeID: a.cfg.NodeID, Incarnation: a.incarnation,
		Release: buildinfo.ReleaseName(), Revision: buildinfo.SourceRevision()}); err != nil {
		return "", err
	}
	conn.SetReadDeadline(time.Now().Add(a.cfg.SessionTimeout + 5*time.Second))
	var first api.SessionMsg
	if err := dec.Decode(&first); err != nil {
		return "", err
	}
	switch first.Type {
	case api.MsgRedirect:
		return first.Leader, fmt.Errorf("%s is not the ctrl leader (%s)", addr, first.Message)
	case api.MsgRefused:
		return "", a.refusal(first)
	case api.MsgWelcome:
	default:
		return "", fmt.Errorf("unexpected %q from %s", first.Type, addr)
	}
	a.mu.Lock()
	a.sessionID, a.send, a.resultReports = first.SessionID, send, first.ResultReports
	if len(first.CredentialKey) > 0 {
		a.credentialKey = first.CredentialKey
	}
	a.mu.Unlock()
	a.bg.spawn(ctx, a.updateDataPlane)
	defer func() {
		a.mu.Lock()
		a.sessionID, a.send, a.resultReports = "", nil, false
		a.mu.Unlock()
	}()
	a.log.Info("control session established", "session_id", first.SessionID, "ctrl", addr, "incarnation", a.incarnation)
	if a.cfg.OnLeader != nil {
		a.cfg.OnLeader(addr) // only the leader accepts sessions
	}
	for {
		conn.SetReadDeadline(time.Now().Add(a.cfg.SessionTimeout))
		var m api.SessionMsg
		if err := dec.Decode(&m); err != nil {
			return "", fmt.Errorf("control session %s: %w", first.SessionID, err)
		}
		recv := a.now()
		switch m.Type {
		case api.MsgPing:
			err = send(api.SessionMsg{Type: api.MsgPong, T1: m.T1, T2: recv, T3: a.now()})
		case api.MsgSync:
			err = a.sendReport(send, func(r *api.SessionMsg) {
				r.KernelSync, r.T1, r.T2, r.T3 = kernelSync(), m.T1, recv, a.now()
			})
		case api.MsgOvercommit:
			if m.Overcommit != nil {
				a.mu.Lock()
				v := *m.Overcommit
				a.overcommit = &v
				a.mu.Unlock()
				a.log.Info("overcommit values applied", "cpu", v.CPU.String(), "memory", v.Memory.String())
				err = send(api.SessionMsg{Type: api.MsgOvercommitAck, Overcommit: &v})
			}
		case api.MsgForget:
			if rt := a.cfg.Runtime; rt != nil && len(m.Forget) > 0 {
				if err := rt.ForgetEnded(m.Forget); err != nil {
					a.log.Warn("ended-instance records not deleted", "err", err)
				}
			}
			a.keepUnrecognized(m.Unrecognized)
		case api.MsgNodeState:
			if m.Draining != nil {
				a.mu.Lock()
				changed := a.draining != *m.Draining
				a.draining = *m.Draining
				a.mu.Unlock()
				if changed {
					a.log.Info("drain request changed: new Workspaces are refused while draining", "draining", *m.Draining)
				}
			}
		case api.MsgTask:
			if m.Task != nil && (a.cfg.HoldTask == nil || !a.cfg.HoldTask(*m.Task)) {
				a.handleTask(ctx, *m.Task)
			}
		case api.MsgVolumeTask:
			if m.VolumeTask != nil {
				a.handleVolumeTask(ctx, *m.VolumeTask)
			}
		case api.MsgRefused:
			return "", a.refusal(m)
		}
		if err != nil {
			return "", err
		}
	}
}

func (a *Agent) refusal(m api.SessionMsg) error {
	switch m.Refusal {
	case api.RefusalIsolated:
		return fmt.Errorf("%w: %s", ErrIsolated, m.Message)
	case api.RefusalStale:
		return fmt.Errorf("%w: %s", ErrStale, m.Message)
	default:
		a.log.Warn("control session refused", "refusal", m.Refusal, "reason", m.Message)
		return fmt.Errorf("control session refused: %s", m.Message)
	}
}

// buildReport is the node's report: capacity, what its Instances hold
// (CPU, memory, retained layers, Volumes), pools; a full one (withEnded,
// sent by sendReport only) also the ended-Instance records.
func (a *Agent) buildReport(withEnded bool) api.Report {
	r := api.Report{
		Capacity:    a.cfg.Capacity,
		Pools:       []api.Pool{poolStatus(api.PrivatePoolID(a.cfg.NodeID), DefaultPoolPath(a.cfg.DataDir))},
		DefaultPool: api.NormalizePoolID(a.cfg.NodeID, a.cfg.DefaultPool),
	}
	for _, p := range a.cfg.Pools {
		st := poolStatus(p.ID, p.Path)
		st.Shared = p.Shared
		r.Pools = append(r.Pools, st)
	}
	if dp := a.cfg.DataPlane; dp != nil {
		r.DataPlaneAddress = dp.Address()
	}
	l := a.templateNames()
	r.Templates, r.TemplateBytes, r.TemplateDigests = l.names, l.sizes, l.digests
	if withEnded {
		// Full reports only: the watcher's look every second needs none.
		r.Resume = a.resumeInfo()
	}
	r.Warm = a.warmReport()
	if withEnded {
		// ctrl stores the cleanup conclusion of each, then has it deleted.
		r.Ended, r.EndedComplete = a.endedReport()
	}
	if rt := a.cfg.Runtime; rt != nil {
		for _, st := range rt.Owned() {
			r.InstanceStates = append(r.InstanceStates, api.InstanceState{InstanceID: st.ID, State: string(st.State), Error: st.Error, DeniedPackets: st.DeniedPackets,
				OOMKilled:          st.State == runtime.StateFailed && st.Error == runtime.ErrOOMKilled,
				GuestNotResponding: st.State == runtime.StateRunning && !st.GuestResponding})
			if st.State == runtime.StateStopped {
				continue // a stopped Instance holds no CPU or memory
			}
			// A FAILED Instance still holds its reservations until destroyed.
			r.Instances++
			r.Allocated.CPU += api.Milli(st.VCPUs * 1000)
			r.Allocated.MemoryBytes += uint64(st.MemoryMiB) << 20
			// So does it its objects: drain waits for them too.
			r.Volumes += len(st.Volumes)
			if st.LayerPath != "" {
				r.RetainedLayers++
			}
		}
	}
	// Ready warm guests hold their memory until a start adopts one as a
	// Workspace's: placement must not count it free.
	for _, w := range r.Warm {
		r.Allocated.MemoryBytes += uint64(w.Ready) * w.MemoryBytes
	}
	if a.cfg.AdjustReport != nil {
		a.cfg.AdjustReport(&r)
	}
	return r
}

// templateNames lists the templates built on this node (ctrl places a
// Workspace only where its template is). The list is read again only when
// the templates directory changed: a build or delete renames or removes
// an entry there, and the report watcher asks every second.
func (a *Agent) templateNames() localTemplates {
	root := a.cfg.DataDir.StorageRoot()
	st, statErr := os.Stat(template.Dir(root))
	a.mu.Lock()
	// Listed again at least every 10 s anyway: a file system with coarse
	// timestamps can hide a change made in the second of the last listing.
	if statErr == nil && st.ModTime().Equal(a.templatesMod) && time.Since(a.templatesListed) < 10*time.Second {
		l := a.templates
		a.mu.Unlock()
		return l
	}
	a.mu.Unlock()
	ts, err := template.List(root)
	if err != nil && len(ts) == 0 {
		a.log.Debug("templates not listed", "err", err)
	}
	var l localTemplates
	for _, t := range ts {
		if len(l.names) == 0 || l.names[len(l.names)-1] != t.Name { // sorted by name
			l.names = append(l.names, t.Name)
		}
		// A new layer goes over the latest build; charge the largest.
		if t.ImageBytes > 0 {
			if l.sizes == nil {
				l.sizes = map[string]uint64{}
			}
			l.sizes[t.Name] = max(l.sizes[t.Name], uint64(t.ImageBytes))
		}
		if t.ImageDigest != "" && !slices.Contains(l.digests, t.ImageDigest) && len(l.digests) < api.MaxNodeTemplateDigests {
			l.digests = append(l.digests, t.ImageDigest)
		}
	}
	if statErr == nil && err == nil {
		a.mu.Lock()
		a.templates, a.templatesMod, a.templatesListed = l, st.ModTime(), time.Now()
		a.mu.Unlock()
	}
	return l
}

// localTemplates is what a report says of the node's templates: names,
// image sizes, and the digests of the images it holds verified copies of
// (published or fetched through the artifact store).
type localTemplates struct {
	names   []string
	sizes   map[string]uint64
	digests []string
}

// PushReport sends a full report now instead of at the next sync, as the
// node does when what it holds changes. It reports whether a session took it.
func (a *Agent) PushReport() bool {
	a.mu.Lock()
	send := a.send
	a.mu.Unlock()
	if send == nil {
		return false
	}
	return a.sendReport(send, nil) == nil
}

// noteSent records r as the last report a session took.
func (a *Agent) noteSent(r api.Report) {
	a.sent.Lock()
	a.sent.report, a.sent.at = r, time.Now()
	a.sent.Unlock()
}

// lastSent is the last report a session took and when.
func (a *Agent) lastSent() (api.Report, time.Time) {
	a.sent.Lock()
	defer a.sent.Unlock()
	return a.sent.report, a.sent.at
}

// hostUsage is the latest sample, nil before the first.
// HostUsage is the latest host usage sample, nil before the first.
func (a *Agent) HostUsage() *api.HostUsage { return a.hostUsage() }

func (a *Agent) hostUsage() *api.HostUsage {
	u := api.HostUsage(a.sampler.Latest())
	if u.SampledAt.IsZero() {
		return nil
	}
	return &u
}

func poolStatus(id, path string) api.Pool {
	p := api.Pool{PoolID: id, Path: path}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		p.Reason = err.Error()
		return p
	}
	p.Available = true
	p.CapacityBytes = st.Blocks * uint64(st.Bsize)
	p.FreeBytes = st.Bavail * uint64(st.Bsize)
	return p
}

// kernelSync is what adjtimex says of the host's time synchronization.
func kernelSync() string {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	switch {
	case err != nil:
		return "unknown"
	case state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0:
		return "unsynchronized"
	default:
		return "synchronized"
	}
}

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
