package units

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/ctxsleep"
)

// Spec describes one transient service.
type Spec struct {
	// Name is the unit name; it must end in ".service".
	Name        string
	Description string
	// Argv is the command; Argv[0] must be an absolute path.
	Argv []string
	// Slice places the unit; StartVMM always uses VMMSlice.
	Slice string
	// NetworkNamespacePath joins the service to a network namespace
	// created beforehand (e.g. /run/netns/kibotos-<instance>).
	NetworkNamespacePath string
	// LimitMEMLOCKInfinity sets LimitMEMLOCK=infinity (io_uring rings count
	// as locked memory of the VMM account).
	LimitMEMLOCKInfinity bool
	// OOMScoreAdjust is set when non-zero (the data plane uses -900).
	OOMScoreAdjust int32
	// Environment entries, "KEY=value".
	Environment []string
	// ExecStopPost runs after the main process ended, with systemd's
	// SERVICE_RESULT, EXIT_CODE and EXIT_STATUS in its environment (how
	// the VMM ended, kept after the unit is collected).
	ExecStopPost []string

	// User and Group run the service (ExecStart and ExecStopPost) as that
	// account instead of root; SupplementaryGroups are added to it.
	User                string
	Group               string
	SupplementaryGroups []string
	// NoNewPrivileges: no setuid, file capabilities or other privilege
	// gain for anything the service executes.
	NoNewPrivileges bool
	// UMask for files the service creates (its unix sockets); 0: systemd's
	// default 0022.
	UMask uint32
	// MemoryMax and TasksMax bound the unit's cgroup; 0: no limit set.
	MemoryMax uint64
	TasksMax  uint64
	// NoCapabilities empties the capability bounding and ambient sets
	// (CapabilityBoundingSet= and AmbientCapabilities= empty): with
	// NoNewPrivileges nothing the service executes can regain any.
	NoCapabilities bool
	// ReadOnlyFilesystem mounts the whole file system read-only for the
	// service (ProtectSystem=strict), but for ReadWritePaths. Systemd sets
	// up a mount namespace for it, whatever PrivateMounts says.
	ReadOnlyFilesystem bool
	ReadWritePaths     []string
	// InaccessiblePaths are hidden from the service (each must exist, or
	// the start fails with status 226/NAMESPACE).
	InaccessiblePaths []string

	// Background runs the service at the lowest CPU and I/O priority
	// (Nice=BackgroundNice, CPUWeight=1, IOWeight=1): work nobody waits
	// for, such as booting a warm guest, must not slow the VMs users wait
	// on. The weights count where systemd has the cpu and io controllers
	// (each service is a cgroup of its own, where a nice value only ranks
	// the cgroup's own processes); the nice value counts everywhere else.
	Background bool
}

// BackgroundNice is the nice value of a Background service.
const BackgroundNice = 19

// VMMStopTimeout is a VMM unit's TimeoutStopSec.
const VMMStopTimeout = 5 * time.Second

// StartVMM starts an Instance's VMM as a transient service in VMMSlice with
// the properties of the process model: Type=exec, Restart=no,
// KillMode=control-group, OOMPolicy=kill. It returns once the VMM has been
// exec'd, with the InvocationID, MainPID and ControlGroup read back.
func (m *Manager) StartVMM(ctx context.Context, spec Spec) (Unit, error) {
	spec.Slice = VMMSlice
	// A VMM ends within moments of SIGTERM; one that does not is stuck
	// (most often on storage), and waiting systemd's default 90 s twice
	// (SIGTERM, then the final SIGKILL) only delays the node's own wait
	// for the cgroup to empty ("instance cleanup pending").
	return m.start(ctx, spec, prop("OOMPolicy", "kill"), prop("TimeoutStopUSec", uint64(VMMStopTimeout/time.Microsecond)))
}

// StartService starts any other kibotos service (data plane, egress) through
// the same path as StartVMM; spec.Slice is required.
func (m *Manager) StartService(ctx context.Context, spec Spec) (Unit, error) {
	if spec.Slice == "" {
		return Unit{}, fmt.Errorf("units: start unit %s: no slice given (use DataPlaneSlice or EgressSlice)", spec.Name)
	}
	return m.start(ctx, spec)
}

func (spec Spec) validate() error {
	if !strings.HasSuffix(spec.Name, ".service") || len(spec.Name) <= len(".service") {
		return fmt.Errorf("units: unit name %q must end in .service", spec.Name)
	}
	if !strings.HasSuffix(spec.Slice, ".slice") {
		return fmt.Errorf("units: start unit %s: slice %q must end in .slice", spec.Name, spec.Slice)
	}
	if len(spec.Argv) == 0 || !filepath.IsAbs(spec.Argv[0]) {
		return fmt.Errorf("units: start unit %s: command %q must start with an absolute path", spec.Name, spec.Argv)
	}
	return nil
}

func prop(name string, v any) sd.Property {
	return sd.Property{Name: name, Value: godbus.MakeVariant(v)}
}

func (spec Spec) properties(extra ...sd.Property) []sd.Property {
	desc := spec.Description
	if desc == "" {
		desc = "kibotos " + spec.Name
	}
	ps := []sd.Property{
		sd.PropDescription(desc),
		// false: a failed exec fails the start job. true would mean
		// "ignore failure" (the "-" prefix) and the job would report done.
		sd.PropExecStart(spec.Argv, false),
		prop("Type", "exec"),
		prop("Restart", "no"),
		prop("KillMode", "control-group"),
		prop("PrivateMounts", false),
		// Failed units are unloaded too, so the same name can start again.
		prop("CollectMode", "inactive-or-failed"),
		sd.PropSlice(spec.Slice),
	}
	if spec.NetworkNamespacePath != "" {
		ps = append(ps, prop("NetworkNamespacePath", spec.NetworkNamespacePath))
	}
	if spec.LimitMEMLOCKInfinity {
		ps = append(ps, prop("LimitMEMLOCK", uint64(math.MaxUint64)))
	}
	if spec.OOMScoreAdjust != 0 {
		ps = append(ps, prop("OOMScoreAdjust", spec.OOMScoreAdjust))
	}
	if len(spec.ExecStopPost) > 0 {
		p := sd.PropExecStart(spec.ExecStopPost, false)
		p.Name = "ExecStopPost" // same signature a(sasb) as ExecStart
		ps = append(ps, p)
	}
	if len(spec.Environment) > 0 {
		ps = append(ps, prop("Environment", spec.Environment))
	}
	if spec.User != "" {
		ps = append(ps, prop("User", spec.User))
	}
	if spec.Group != "" {
		ps = append(ps, prop("Group", spec.Group))
	}
	if len(spec.SupplementaryGroups) > 0 {
		ps = append(ps, prop("SupplementaryGroups", spec.SupplementaryGroups))
	}
	if spec.NoNewPrivileges {
		ps = append(ps, prop("NoNewPrivileges", true))
	}
	if spec.UMask != 0 {
		ps = append(ps, prop("UMask", spec.UMask))
	}
	if spec.MemoryMax != 0 {
		ps = append(ps, prop("MemoryMax", spec.MemoryMax))
	}
	if spec.TasksMax != 0 {
		ps = append(ps, prop("TasksMax", spec.TasksMax))
	}
	if spec.NoCapabilities {
		ps = append(ps, prop("CapabilityBoundingSet", uint64(0)), prop("AmbientCapabilities", uint64(0)))
	}
	if spec.ReadOnlyFilesystem {
		ps = append(ps, prop("ProtectSystem", "strict"))
	}
	if len(spec.ReadWritePaths) > 0 {
		ps = append(ps, prop("ReadWritePaths", spec.ReadWritePaths))
	}
	if len(spec.InaccessiblePaths) > 0 {
		ps = append(ps, prop("InaccessiblePaths", spec.InaccessiblePaths))
	}
	if spec.Background {
		ps = append(ps, prop("Nice", int32(BackgroundNice)), prop("CPUWeight", uint64(1)), prop("IOWeight", uint64(1)))
	}
	return append(ps, extra...)
}

func (m *Manager) start(ctx context.Context, spec Spec, extra ...sd.Property) (Unit, error) {
	if err := spec.validate(); err != nil {
		return Unit{}, err
	}
	// A VMM's output goes to its Instance's own log (the runtime's
	// machine logs), which outlives the unit.
	if dir := m.target.LogDir; dir != "" && spec.Slice != VMMSlice {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Unit{}, fmt.Errorf("units: start unit %s: its log directory: %w", spec.Name, err)
		}
		// Opened by the manager before the service runs: a service on a
		// read-only file system, or not root, still writes it.
		out := filepath.Join(dir, spec.Name+".log")
		extra = append(extra, prop("StandardOutputFileToAppend", out), prop("StandardErrorFileToAppend", out))
	}
	props := spec.properties(extra...)
	ch := make(chan string, 1)
	_, err := m.conn.StartTransientUnitContext(ctx, spec.Name, "fail", props, ch)
	if isDBusError(err, "org.freedesktop.systemd1.UnitExists") {
		// A finished unit that is not collected yet still holds the name.
		if err = m.reclaim(ctx, spec.Name); err != nil {
			return Unit{}, err
		}
		_, err = m.conn.StartTransientUnitContext(ctx, spec.Name, "fail", props, ch)
	}
	if err != nil {
		return Unit{}, fmt.Errorf("units: start unit %s: %w", spec.Name, err)
	}
	var result string
	select {
	case result = <-ch:
	case <-ctx.Done():
		return Unit{}, fmt.Errorf("units: start unit %s: waiting for the start job: %w (the unit may still start: check it with Get)", spec.Name, ctx.Err())
	}
	if result != "done" {
		detail := "unit already collected"
		if u, err := m.Get(ctx, spec.Name); err == nil {
			detail = fmt.Sprintf("state %s/%s, result %s, exit status %d", u.ActiveState, u.SubState, u.Result, u.ExecMainStatus)
		}
		return Unit{}, fmt.Errorf("units: start unit %s: start job %s (%s): check that %s exists and runs and that netns %q exists; the manager's log says why (journalctl -u %s)",
			spec.Name, result, detail, spec.Argv[0], spec.NetworkNamespacePath, spec.Name)
	}
	u, err := m.Get(ctx, spec.Name)
	if err != nil {
		return Unit{}, fmt.Errorf("units: start unit %s: started but could not be read back (did it exit at once?): %w", spec.Name, err)
	}
	return u, nil
}

// reclaim frees a unit name held by a finished unit; a live unit is ErrExists.
func (m *Manager) reclaim(ctx context.Context, name string) error {
	u, err := m.Get(ctx, name)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if u.ActiveState != "failed" && u.ActiveState != "inactive" {
		return fmt.Errorf("units: start unit %s: %w (state %s, MainPID %d, invocation %s): take it over or stop it first",
			name, ErrExists, u.ActiveState, u.MainPID, u.InvocationID)
	}
	if err := m.conn.ResetFailedUnitContext(ctx, name); err != nil && !isDBusError(err, "org.freedesktop.systemd1.NoSuchUnit") {
		return fmt.Errorf("units: start unit %s: reset the finished unit holding the name: %w", name, err)
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if _, err := m.Get(ctx, name); isNotFound(err) {
			return nil
		}
		if err := ctxsleep.Sleep(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("units: start unit %s: waiting for the finished unit to be collected: %w", name, err)
		}
	}
	return fmt.Errorf("units: start unit %s: %w: the finished unit was not collected within 2s (try systemctl reset-failed %s)", name, ErrExists, name)
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func isDBusError(err error, name string) bool {
	var de godbus.Error
	if errors.As(err, &de) {
		return de.Name == name
	}
	var dep *godbus.Error
	return errors.As(err, &dep) && dep.Name == name
}

// Foreground gives a running Background service the priorities of any
// other (a warm guest a Workspace now owns): its CPU and I/O weights
// systemd's default again, every thread of its processes nice 0.
func (m *Manager) Foreground(ctx context.Context, u Unit) error {
	if err := m.conn.SetUnitPropertiesContext(ctx, u.Name, true, prop("CPUWeight", uint64(100)), prop("IOWeight", uint64(100))); err != nil {
		return fmt.Errorf("units: weights of unit %s: %w", u.Name, err)
	}
	ps, err := m.Processes(u)
	if err != nil {
		return err
	}
	for _, p := range ps {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.HostPID))
		if err != nil {
			continue // ended meanwhile
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, 0); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("units: nice value of thread %d of unit %s: %w", tid, u.Name, err)
			}
		}
	}
	return nil
}
