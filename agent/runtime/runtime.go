package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
)

// State is an Instance's state as the node sees it.
type State string

const (
	StateStarting State = "STARTING"
	StateRunning  State = "RUNNING"
	StateStopping State = "STOPPING"
	StateStopped  State = "STOPPED"
	StateFailed   State = "FAILED"
)

// ErrNoLongerRunning is the error of an Instance whose VMM ended without
// the node stopping it (the seeds quote it verbatim).
const ErrNoLongerRunning = "node reports the Instance as no longer running"

// ErrOOMKilled is the error of an Instance whose VMM host OOM killed (its
// unit's result oom-kill): ctrl stops such a Workspace rather than
// failing it (InstanceStatus.OOMKilled).
const ErrOOMKilled = "node reports the Instance as no longer running: host OOM killed the VMM"

// unitResultOOM is the result systemd gives a unit the kernel's OOM
// killer ended (OOMPolicy=kill ends the whole unit).
const unitResultOOM = "oom-kill"

// ErrUnknownInstance is the error of a call naming an Instance this node
// does not have.
var ErrUnknownInstance = errors.New("not found on this node")

// UnitPrefix names every VMM unit: kibotos-vmm-<instance id>.service.
const UnitPrefix = "kibotos-vmm-"

// UnitName is the VMM unit of an Instance.
func UnitName(instanceID string) string { return UnitPrefix + instanceID + ".service" }

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Config configures a Runtime.
type Config struct {
	StorageRoot string
	NodeID      string
	// Units is the systemd manager the VMM units live in; the caller owns it.
	Units *units.Manager
	// Accel is the QEMU accelerator setting (auto, kvm, tcg).
	Accel      qemu.Accel
	QEMUBinary string
	Logger     *slog.Logger
	// Backend replaces the QEMU backend built from Accel and QEMUBinary.
	Backend Backend
	// GuestTimeout bounds Start's wait for the guest agent; default 60s.
	GuestTimeout time.Duration
	// WatchInterval is how often running VMMs are checked; default 500ms.
	WatchInterval time.Duration
	// DiskFullInterval is how often running guests are asked whether a
	// full pool stopped them; default DefaultDiskFullInterval.
	DiskFullInterval time.Duration
	// KeepInstallations are installation ids (sha256-...) kept at Open even
	// when no Instance uses them, e.g. the Platform new Instances will use.
	// Every other installation no record references is removed.
	KeepInstallations []string
	// OwnInstallation is the id of the node's own Platform, the one its
	// executable is the guest agent of and new Instances start on (kept
	// like KeepInstallations). An Instance taken over on another Platform
	// keeps running only when that one is whole and of a release this
	// build drives (platform.Drivable); else it is FAILED, its VMM left
	// running for stop --force.
	OwnInstallation string
	// Release is this build's release for that judgement; default
	// buildinfo.Release (tests give another).
	Release *string
	// VMMUser is the account QEMU VMMs run as, created when missing;
	// default DefaultVMMUser.
	VMMUser string
	// MachineLogsMaxBytes bounds machine-logs/ (the log tails of ended
	// machines): past it, whole Instances' tails go, oldest first;
	// default DefaultMachineLogsMaxBytes.
	MachineLogsMaxBytes int64
	// ConsoleLogCap bounds the serial console kept per Instance (on disk,
	// console.log and console.log.1 together); default DefaultConsoleLogCap.
	ConsoleLogCap int64

	// Network is the node's [network] configuration; nil: Instances that
	// need a network are refused.
	Network *netpol.Config
	// HostNetNS is the path of the node's network namespace, where guest
	// traffic is routed and masqueraded; default this process's. Tests
	// give their own.
	HostNetNS string
	// DeniedInterval is how often denied counters are read (and the
	// rate limit of their log line); default DefaultDeniedInterval.
	DeniedInterval time.Duration
	// Observe, when set, is told how long steps took: StepBoot for each
	// Start that ended with the guest agent answering, each of its steps
	// that completed (StartSteps), StepTakeover for Open (metrics
	// histograms).
	Observe func(step string, d time.Duration)
	// Egress runs the egress process for policies naming an Egress or a
	// Resolver; nil: such policies are refused, saying EgressUnavailable
	// (why the node could not prepare it) when set.
	Egress            EgressRouter
	EgressUnavailable error
	// Pools are the node's storage pool directories. At Open, a running
	// Instance whose layer is in one is taken over only once the pool
	// opens, waiting at most PoolOpenWait (default DefaultPoolOpenWait);
	// past it the Instance is FAILED, its VMM left running.
	Pools        []PoolDir
	PoolOpenWait time.Duration

	// unconfinedVMM launches QEMU the way builds before VMM confinement
	// did (root, no seccomp, file console), so tests can make the
	// Instances an upgraded node must take over.
	unconfinedVMM bool
	// beforeSave, when set (tests), runs during a pause just before QEMU
	// saves the guest: the VMM's host PID.
	beforeSave func(hostPID int)
	// guestConn, when set (tests), stands between the node and each new
	// connection to a guest agent's channel (to lose a hello).
	guestConn func(net.Conn) net.Conn
}

// Runtime runs the Instances of one node. Open takes over what a previous
// node process left running; Close leaves every VMM running.
type Runtime struct {
	cfg     Config
	log     *slog.Logger
	units   *units.Manager
	backend Backend
	// installations are Open's checks of the running Instances'
	// installations, started before takeover needs them.
	installations *installationChecks
	// vmm is the account confined VMMs run as; nil: VMMs run unconfined
	// (a backend without it, or the test hook).
	vmm *vmmAccount
	// net is the node side of Instance networks.
	net *nodeNetwork
	// qemuVersion is the QEMU binary's version ("" for another backend),
	// what a restore must match: asked (`--version`, a few hundred ms on
	// a loaded host) beside Open's other work, read through version().
	qemuVersion     string
	qemuVersionDone chan struct{}

	instancesDir, registryDir, logsDir string
	lock                               *os.File

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	instances map[string]*instance

	closeOnce sync.Once
	closeErr  error
}

// instance is one Instance; mu guards everything below it.
type instance struct {
	id    string
	paths Paths

	mu         sync.Mutex
	rec        *LaunchRecord
	state      State
	err        string
	how        string // how it ended, for the registry
	guest      *guestproto.Client
	responding bool
	changed    chan struct{} // closed and replaced when guest or state changes
	stopGuest  context.CancelFunc
	guestDone  chan struct{}
	logsCopied bool
	// configured: the guest has this node run's configuration (Start
	// gave it; after a takeover syncGuest does, once).
	configured bool
	// denied counts the packets its rule table dropped by policy.
	denied deniedCount
	// diskFull: a full pool stopped its guest, and the node said so.
	diskFull bool
	// consoleDone is closed when the console reader ended; nil: none.
	consoleDone chan struct{}
	// keepSession: the guest loop leaves its session open as it ends, in
	// held (a resident warm guest's, for the Instance that adopts it).
	keepSession bool
	held        *guestproto.Client
	// resident: a warm guest kept with its vCPUs stopped (BootResident).
	resident *Resident
}

// notify wakes waiters on guest or state changes; in.mu must be held.
func (in *instance) notify() {
	close(in.changed)
	in.changed = make(chan struct{})
}

// Open prepares the runtime directories under cfg.StorageRoot, deletes
// temporary files of interrupted writes unread, and takes over the VMMs of
// the previous node process. It fails, changing nothing, when a launch
// record does not match its running unit or a kibotos-vmm unit has no record.
func Open(ctx context.Context, cfg Config) (*Runtime, error) {
	t0 := time.Now()
	if cfg.StorageRoot == "" || cfg.Units == nil {
		return nil, errors.New("runtime: open: Config needs StorageRoot and Units")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.GuestTimeout == 0 {
		cfg.GuestTimeout = 60 * time.Second
	}
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = 500 * time.Millisecond
	}
	if cfg.DiskFullInterval <= 0 {
		cfg.DiskFullInterval = DefaultDiskFullInterval
	}
	if cfg.VMMUser == "" {
		cfg.VMMUser = DefaultVMMUser
	}
	if cfg.ConsoleLogCap <= 0 {
		cfg.ConsoleLogCap = DefaultConsoleLogCap
	}
	if cfg.DeniedInterval <= 0 {
		cfg.DeniedInterval = DefaultDeniedInterval
	}
	if cfg.MachineLogsMaxBytes <= 0 {
		cfg.MachineLogsMaxBytes = DefaultMachineLogsMaxBytes
	}
	rt := &Runtime{
		cfg:          cfg,
		log:          cfg.Logger,
		units:        cfg.Units,
		backend:      cfg.Backend,
		instancesDir: filepath.Join(cfg.StorageRoot, "runtime", "instances"),
		registryDir:  RegistryDir(cfg.StorageRoot),
		logsDir:      filepath.Join(cfg.StorageRoot, "machine-logs"),
		instances:    map[string]*instance{},
	}
	for _, d := range []string{rt.instancesDir, rt.registryDir, rt.logsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runtime: open: %w", err)
		}
	}
	if err := rt.acquireLock(); err != nil {
		return nil, err
	}
	// The running Instances' installations are verified (every file
	// hashed) while the rest of Open goes on; takeover waits for them.
	rt.installations = rt.startInstallationChecks()
	ok := false
	defer func() {
		if !ok {
			rt.abandonOpen()
		}
	}()
	rt.keepMachineLogsWithinQuota("")
	n, err := storagepool.SweepLocal(rt.instancesDir, rt.registryDir, rt.logsDir)
	if err != nil {
		return nil, fmt.Errorf("runtime: open: %w", err)
	}
	if n > 0 {
		rt.log.Info("temporary files of interrupted writes removed", "count", n)
	}
	if rt.backend == nil {
		b, choice, err := NewQEMU(cfg.QEMUBinary, cfg.Accel)
		if err != nil {
			return nil, fmt.Errorf("runtime: open: %w", err)
		}
		rt.log.Info("qemu accelerator selected", "accel", choice.Accel, "reason", choice.Reason)
		rt.backend = b
	}
	if q, ok := rt.backend.(*QEMU); ok && !cfg.unconfinedVMM {
		a, err := ensureVMMAccount(ctx, cfg.VMMUser)
		if err != nil {
			return nil, err
		}
		changed, err := a.ensureVMMDevices(q.Accel == qemu.AccelKVM)
		if err != nil {
			return nil, err
		}
		if len(changed) > 0 {
			rt.log.Warn("VMM device permissions set to the udev defaults", "devices", changed, "vmm_user", a.name)
		}
		rt.vmm = &a
	}
	rt.qemuVersionDone = make(chan struct{})
	if q, ok := rt.backend.(*QEMU); ok {
		rt.wg.Go(func() {
			defer close(rt.qemuVersionDone)
			v, err := binaryVersion(q.Binary)
			if err != nil {
				// Nothing can be paused or resumed here; the rest runs.
				rt.log.Warn("QEMU version unknown: no pause or resume on this node", "err", err)
			}
			rt.qemuVersion = v
		})
	} else {
		close(rt.qemuVersionDone)
	}
	if rt.net, err = openNodeNetwork(ctx, cfg.Network, cfg.HostNetNS, rt.units.Target(), rt.log); err != nil {
		return nil, err
	}
	for _, w := range rt.net.warnings {
		rt.log.Warn("network configuration", "warning", w)
	}
	// The runtime's own goroutines (watchers, guest loops, a takeover's
	// wait for a guest) live until Close, not until Open's caller gives
	// up on Open: its values, not its cancellation.
	rt.ctx, rt.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := rt.takeover(ctx); err != nil {
		// What the takeover started ends before the network it uses.
		rt.cancel()
		rt.wg.Wait()
		rt.net.close()
		return nil, err
	}
	ok = true
	// The egress process (adopted, or started again) gets the routes of
	// what was taken over.
	if err := rt.syncEgress(ctx); err != nil {
		rt.log.Error("egress routes not restored at takeover", "err", err)
	}
	rt.finishNetworkSwitches()
	rt.removeUnusedInstallations()
	rt.wg.Add(3)
	go rt.watch()
	go rt.watchDenied()
	go rt.watchDiskFull()
	rt.observe(StepTakeover, t0)
	rt.log.Info("runtime opened", "instances", len(rt.instances), "took", time.Since(t0).Round(time.Microsecond))
	return rt, nil
}

// abandonOpen undoes a failed Open once what it started has ended: the
// installation checks and the QEMU version question run to their end (they
// take no context), and whatever a takeover started stops with rt.ctx.
// Only then is the lock let go, so no other node process sees this one's
// goroutines still at work.
func (rt *Runtime) abandonOpen() {
	if rt.cancel != nil {
		rt.cancel()
	}
	rt.wg.Wait()
	if c := rt.installations; c != nil {
		<-c.done
	}
	rt.lock.Close()
}

func (rt *Runtime) acquireLock() error {
	path := lockFile(rt.cfg.StorageRoot)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("runtime: open lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("runtime: %s is locked by another node process (%w): stop it first", path, err)
	}
	if err := writeLockHolder(f); err != nil {
		f.Close()
		return fmt.Errorf("runtime: record this node process in %s: %w", path, err)
	}
	rt.lock = f
	return nil
}

// Steps Config.Observe is told about.
const (
	StepBoot     = "boot"
	StepTakeover = "takeover"
)

func (rt *Runtime) observe(step string, since time.Time) {
	if rt.cfg.Observe != nil {
		rt.cfg.Observe(step, time.Since(since))
	}
}

// VMSliceCgroup is the host path of the cgroup every VMM unit of this
// node runs in (the host usage's VM items read it).
func (rt *Runtime) VMSliceCgroup() string {
	return rt.cfg.Units.SliceCgroupPath(units.VMMSlice)
}

// Close stops watching and closes guest sessions. VMMs keep running; a
// later Open takes them over.
func (rt *Runtime) Close() error {
	rt.closeOnce.Do(func() { rt.closeErr = rt.close() })
	return rt.closeErr
}

func (rt *Runtime) close() error {
	rt.cancel()
	rt.wg.Wait()
	rt.mu.Lock()
	for _, in := range rt.instances {
		in.mu.Lock()
		if in.guest != nil {
			in.guest.Close()
			in.guest = nil
		}
		in.mu.Unlock()
	}
	rt.mu.Unlock()
	rt.net.close()
	// The netlink sockets of the last rule commits close behind them.
	netpol.Settle()
	return rt.lock.Close()
}

func (rt *Runtime) get(id string) (*instance, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	in := rt.instances[id]
	if in == nil {
		return nil, fmt.Errorf("runtime: instance %s: %w", id, ErrUnknownInstance)
	}
	return in, nil
}
