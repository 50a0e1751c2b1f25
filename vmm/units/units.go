// Package units owns the node's systemd transient units: the VMM service of
// every Instance and the data-plane and egress services. It talks to a systemd
// manager over its private D-Bus socket (the host's, or a private systemd's
// started by package privsd) and reads the unit cgroups directly from the host's
// cgroup2 mount.
//
// It must never find or kill processes by name: a unit is addressed by its
// unit name, and leftover processes are reported by PID, never signalled here.
// Units it starts outlive the Manager and the kibotos process (no stop
// dependency); a new Manager finds them again with List or Get.
package units

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Slices of kibotos units. Naming a slice "kibotos-vmm.slice" makes systemd
// create its parent kibotos.slice implicitly.
const (
	VMMSlice       = "kibotos-vmm.slice"
	DataPlaneSlice = "kibotos-dataplane.slice"
	EgressSlice    = "kibotos-egress.slice"
)

// HostSocket is the private bus socket of the host's own systemd.
const HostSocket = "/run/systemd/private"

var (
	// ErrNotFound: the manager has no such unit loaded.
	ErrNotFound = errors.New("unit not found")
	// ErrExists: a unit with that name is loaded and not finished.
	ErrExists = errors.New("unit already exists")
)

// Target says which systemd manager to talk to and how its view of the
// system maps onto the host's.
type Target struct {
	// Socket is the manager's private bus socket, or a proxy to it.
	Socket string
	// CgroupRoot is the host directory that the manager sees as the root of
	// its cgroup tree: the cgroup2 mount point for the host's systemd, the
	// cgroup namespace root for a private one. A unit's ControlGroup is
	// relative to it.
	CgroupRoot string
	// ManagerPID is the host PID of the manager (1 for the host's systemd).
	// MainPIDs are PIDs of the manager's PID namespace; this maps them.
	ManagerPID int
	// NetNSDir is the host directory that is the manager's /run/netns
	// (a private systemd has its own /run); empty for the host's systemd.
	NetNSDir string
	// LogDir, when set, receives the standard output and error of each
	// unit but the VMMs, appended to <LogDir>/<unit>.log. A private systemd has no journal:
	// without it what the data-plane and egress processes log is lost.
	// Empty for the host's systemd, whose journal keeps it.
	LogDir string
}

// HostTarget is the host's own systemd (PID 1).
func HostTarget() (Target, error) {
	root, err := Cgroup2Mount()
	if err != nil {
		return Target{}, err
	}
	return Target{Socket: HostSocket, CgroupRoot: root, ManagerPID: 1}, nil
}

// Manager starts, finds and stops units through one bus connection.
type Manager struct {
	target Target
	conn   *sd.Conn
	// pidLevel is the index in /proc/<pid>/status NSpid of the manager's PID namespace.
	pidLevel int
}

// StopSettle bounds how long Stop waits, after the stop job finished, for the
// unit's processes to disappear (systemd can report the job before the
// processes are reaped).
const StopSettle = 10 * time.Second

// Connect dials the manager of t. The connection is not tied to ctx beyond the
// dial; Close it when done. Closing it never stops units.
func Connect(ctx context.Context, t Target) (*Manager, error) {
	if t.Socket == "" || t.CgroupRoot == "" {
		return nil, fmt.Errorf("units: connect: target needs Socket and CgroupRoot (got %+v)", t)
	}
	if t.ManagerPID == 0 {
		t.ManagerPID = 1
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("units: connect %s: %w", t.Socket, err)
	}
	nspid, err := readNSpid(t.ManagerPID)
	if err != nil {
		return nil, fmt.Errorf("units: connect %s: manager PID %d: %w (is the manager running?)", t.Socket, t.ManagerPID, err)
	}
	conn, err := sd.NewConnection(func() (*godbus.Conn, error) { return dialPrivate(t.Socket) })
	if err != nil {
		return nil, fmt.Errorf("units: connect to systemd at %s: %w (is systemd running and are we root?)", t.Socket, err)
	}
	m := &Manager{target: t, conn: conn, pidLevel: len(nspid) - 1}
	// A dial succeeds on a stale socket file too: make one call to be sure.
	if _, err := conn.GetManagerProperty("Version"); err != nil {
		conn.Close()
		return nil, fmt.Errorf("units: systemd at %s does not answer: %w", t.Socket, err)
	}
	return m, nil
}

// dialPrivate opens systemd's private (peer-to-peer) bus: EXTERNAL auth with
// the numeric uid and no Hello, as go-systemd does for /run/systemd/private.
// No context: godbus would close the connection when the context ends.
func dialPrivate(socket string) (*godbus.Conn, error) {
	c, err := godbus.Dial("unix:path=" + socket)
	if err != nil {
		return nil, err
	}
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Target returns the target the manager was connected with.
func (m *Manager) Target() Target { return m.target }

// SliceCgroupPath is the host path of one of the kibotos slices' cgroup
// under this manager: systemd nests a slice under its dash-prefix
// (kibotos-vmm.slice in kibotos.slice), and a private manager's tree is
// not at the cgroup2 mount's root.
func (m *Manager) SliceCgroupPath(slice string) string {
	return filepath.Join(m.target.CgroupRoot, "kibotos.slice", slice)
}

// Close closes the bus connection. Units keep running.
func (m *Manager) Close() { m.conn.Close() }

// Unit is what the manager reports about one unit.
type Unit struct {
	Name        string
	Description string
	LoadState   string // loaded, not-found, ...
	ActiveState string // active, activating, deactivating, inactive, failed
	SubState    string
	// Result is the service result ("success", "exit-code", "signal", ...).
	Result string
	// InvocationID identifies this run of the unit: 32 hex characters.
	InvocationID string
	// MainPID is a PID of the manager's PID namespace; 0 when none.
	MainPID uint32
	// ControlGroup is relative to Target.CgroupRoot, e.g.
	// /kibotos.slice/kibotos-vmm.slice/<unit>.
	ControlGroup string
	Slice        string
	// ExecMainStatus is the exit status (or signal) of the main process, once it exited.
	ExecMainStatus int32
	// OOMScoreAdjust is the unit's configured value (services only). The
	// kernel may not have it: without CAP_SYS_RESOURCE systemd cannot lower
	// it and carries on.
	OOMScoreAdjust int32
	// What confines a service, as configured (systemd may be unable to
	// apply all of it: a private systemd without the memory and pids
	// controllers keeps MemoryMax and TasksMax as properties only).
	User            string
	NoNewPrivileges bool
	MemoryMax       uint64 // math.MaxUint64: infinity
	TasksMax        uint64 // math.MaxUint64: infinity
	LimitMEMLOCK    uint64 // math.MaxUint64: infinity
	// CapabilityBoundingSet is a bit mask (bit n: capability n); 0 is
	// none, systemd's default is all.
	CapabilityBoundingSet uint64
	ProtectSystem         string // "no", "yes", "full" or "strict"
	ReadWritePaths        []string
	InaccessiblePaths     []string
}

// Active reports whether the unit is running or about to.
func (u Unit) Active() bool {
	return u.ActiveState == "active" || u.ActiveState == "activating" || u.ActiveState == "reloading"
}
