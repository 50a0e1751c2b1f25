package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BaseKernelArgs start every guest command line: the console on the serial
// port (which Firecracker writes to its stdout), reboot through the
// keyboard controller (Firecracker exits when the guest reboots), reboot at
// once on panic, and no PCI probing (devices are virtio-mmio).
var BaseKernelArgs = []string{"console=ttyS0", "reboot=k", "panic=1", "pci=off", "quiet"}

// Paths inside the jail, as the jailed Firecracker sees them.
const (
	JailKernel    = "/vmlinux"
	JailInitrd    = "/initrd"
	JailDisk      = "/disk.raw"
	JailConfig    = "/vm-config.json"
	JailAPISocket = "/api.sock"
	JailVsock     = "/vsock.sock"
)

// DefaultGuestCID is the guest's vsock CID (0-2 are reserved; each VM has
// its own vsock device, so every guest can use the same one).
const DefaultGuestCID = 3

// maxSocketPath is sun_path minus its NUL.
const maxSocketPath = 107

// Backend runs Firecracker under the jailer, configured by a --config-file
// so that the VMM boots the guest with no API call, and reaches the guest
// agent over hybrid vsock. It has the method set of agent/runtime's
// Backend with this package's Instance and Files in place of runtime.Spec
// and runtime.Paths, plus Prepare and Remove, which the runtime has no
// hook for yet (see the package documentation).
type Backend struct {
	Jailer      string // absolute
	Firecracker string // absolute; the name must contain "firecracker"
	UID, GID    int    // Firecracker runs as these (never 0)
	// ChrootBaseDir holds the jails; it must be on the filesystem of the
	// Instance directories, since writable disks are hard-linked into it.
	ChrootBaseDir string
	CgroupVersion int    // 0: 2
	ParentCgroup  string // optional, relative
	// AgentPort is the guest vsock port the guest agent listens on.
	AgentPort uint32
	// GuestCID defaults to DefaultGuestCID.
	GuestCID uint32
	// KernelArgs are appended to BaseKernelArgs.
	KernelArgs []string
}

// Instance is what the backend needs of runtime.Spec.
type Instance struct {
	ID        string
	VCPUs     int
	MemoryMiB int
	Kernel    string // host path of an uncompressed vmlinux (ELF)
	Initrd    string // host path, optional
	NetNS     string // network namespace handle to join, optional
	NICs      []NIC
}

// NIC is a virtio-net device on an existing tap (inside NetNS if given).
type NIC struct {
	Tap string
	MAC string // optional
}

// Files mirror runtime.Paths: the Instance's own files, on the host.
type Files struct {
	Dir         string
	Console     string // made a symlink to VMMLog: Firecracker writes the serial console to its stdout
	VMMLog      string
	AgentSocket string // made a symlink to the jail's vsock socket
	Control     string // made a symlink to the jail's API socket
	Disk        string // writable raw disk, optional; hard-linked into the jail
}

// NewBackend resolves both binaries; it fails where they are not installed
// (as on the machines this package was written on).
func NewBackend(jailer, firecracker string, uid, gid int, agentPort uint32) (*Backend, error) {
	if jailer == "" {
		jailer = "jailer"
	}
	if firecracker == "" {
		firecracker = "firecracker"
	}
	var paths [2]string
	for i, bin := range []string{jailer, firecracker} {
		p, err := exec.LookPath(bin)
		if err != nil {
			return nil, fmt.Errorf("firecracker backend: %s not found: %w (install the jailer and firecracker binaries of one Firecracker release)", bin, err)
		}
		if paths[i], err = filepath.Abs(p); err != nil {
			return nil, fmt.Errorf("firecracker backend: %w", err)
		}
	}
	b := &Backend{Jailer: paths[0], Firecracker: paths[1], UID: uid, GID: gid, AgentPort: agentPort}
	if err := b.check(); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Backend) check() error {
	if b.AgentPort == 0 {
		return errors.New("firecracker backend: no guest agent vsock port")
	}
	if b.ChrootBaseDir != "" && !filepath.IsAbs(b.ChrootBaseDir) {
		return fmt.Errorf("firecracker backend: chroot base dir %q: want an absolute path", b.ChrootBaseDir)
	}
	return nil
}

// Name implements runtime.Backend.
func (*Backend) Name() string { return "firecracker" }

func (b *Backend) jailerOptions(in Instance) JailerOptions {
	return JailerOptions{
		Jailer:          b.Jailer,
		ExecFile:        b.Firecracker,
		ID:              in.ID,
		UID:             b.UID,
		GID:             b.GID,
		ChrootBaseDir:   b.ChrootBaseDir,
		NetNS:           in.NetNS,
		CgroupVersion:   b.CgroupVersion,
		ParentCgroup:    b.ParentCgroup,
		FirecrackerArgs: []string{"--api-sock", JailAPISocket, "--config-file", JailConfig},
	}
}

// Jail is where the VM of Instance id is jailed.
func (b *Backend) Jail(id string) Jail {
	return JailOf(JailerOptions{ExecFile: b.Firecracker, ID: id, ChrootBaseDir: b.ChrootBaseDir})
}

// ExecPath is the executable of the unit's main process once the jailer
// exec'd Firecracker: the jailer's copy inside the jail, not b.Firecracker
// and not b.Jailer.
func (b *Backend) ExecPath(id string) string { return b.Jail(id).ExecPath() }

// KernelCmdline is the guest's boot_args.
func (b *Backend) KernelCmdline() string {
	return strings.Join(append(append([]string(nil), BaseKernelArgs...), b.KernelArgs...), " ")
}

// VMConfig is the --config-file of an Instance; its paths are inside the
// jail.
func (b *Backend) VMConfig(in Instance, f Files) (*VMConfig, error) {
	cid := b.GuestCID
	if cid == 0 {
		cid = DefaultGuestCID
	}
	c := &VMConfig{
		BootSource:    BootSource{KernelImagePath: JailKernel, BootArgs: b.KernelCmdline()},
		MachineConfig: MachineConfig{VCPUCount: in.VCPUs, MemSizeMiB: in.MemoryMiB},
		Vsock:         &Vsock{GuestCID: cid, UDSPath: JailVsock},
	}
	if in.Kernel == "" {
		return nil, fmt.Errorf("firecracker instance %s: no kernel", in.ID)
	}
	if in.Initrd != "" {
		c.BootSource.InitrdPath = JailInitrd
	}
	if f.Disk != "" {
		c.Drives = append(c.Drives, Drive{DriveID: "writable", PathOnHost: JailDisk})
	}
	for i, n := range in.NICs {
		c.NetworkInterfaces = append(c.NetworkInterfaces, NetworkInterface{IfaceID: fmt.Sprintf("eth%d", i), HostDevName: n.Tap, GuestMAC: n.MAC})
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("firecracker instance %s: %w", in.ID, err)
	}
	return c, nil
}

// Argv implements runtime.Backend: the jailer command, which execs
// Firecracker with --api-sock and --config-file inside the jail. It has no
// side effect; Prepare must have staged the jail before the command runs.
func (b *Backend) Argv(in Instance, f Files) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if _, err := b.VMConfig(in, f); err != nil {
		return nil, err
	}
	for _, s := range []string{f.AgentSocket, f.Control} {
		if len(s) > maxSocketPath {
			return nil, fmt.Errorf("firecracker instance %s: socket path %s is longer than %d bytes", in.ID, s, maxSocketPath)
		}
	}
	a, err := JailerArgv(b.jailerOptions(in))
	if err != nil {
		return nil, fmt.Errorf("firecracker instance %s: %w", in.ID, err)
	}
	return a, nil
}

// Prepare stages the jail of a new Instance, after its writable disk
// exists and before Argv's command runs: it creates the jail root, links
// the kernel and initrd (hard link, or a copy across filesystems) and the
// disk (hard link only, then owned by UID:GID — the Instance's disk file
// is that same inode), writes the config file, and points Files.Control,
// Files.AgentSocket and Files.Console at the jail's sockets and the VMM
// log. A jail left by an earlier VM of the same id is an error: Remove it
// first.
func (b *Backend) Prepare(in Instance, f Files) error {
	cfg, err := b.VMConfig(in, f)
	if err != nil {
		return err
	}
	data, err := cfg.JSON()
	if err != nil {
		return err
	}
	j := b.Jail(in.ID)
	if _, err := os.Lstat(j.Dir()); err == nil {
		return fmt.Errorf("firecracker instance %s: jail %s exists (left by an earlier VM?); remove it first", in.ID, j.Dir())
	}
	if err := os.MkdirAll(j.Root(), 0o755); err != nil {
		return fmt.Errorf("firecracker instance %s: %w", in.ID, err)
	}
	if err := j.Link(in.Kernel, JailKernel, true); err != nil {
		return err
	}
	if in.Initrd != "" {
		if err := j.Link(in.Initrd, JailInitrd, true); err != nil {
			return err
		}
	}
	if f.Disk != "" {
		if err := j.Link(f.Disk, JailDisk, false); err != nil {
			return err
		}
		if err := os.Lchown(j.HostPath(JailDisk), b.UID, b.GID); err != nil {
			return fmt.Errorf("firecracker instance %s: disk for uid %d: %w", in.ID, b.UID, err)
		}
	}
	if err := os.WriteFile(j.HostPath(JailConfig), data, 0o644); err != nil {
		return fmt.Errorf("firecracker instance %s: %w", in.ID, err)
	}
	links := [][2]string{
		{j.HostPath(JailAPISocket), f.Control},
		{j.HostPath(JailVsock), f.AgentSocket},
	}
	if f.Console != "" && f.VMMLog != "" && f.Console != f.VMMLog {
		links = append(links, [2]string{f.VMMLog, f.Console})
	}
	for _, l := range links {
		if l[1] == "" {
			continue
		}
		if err := os.Symlink(l[0], l[1]); err != nil {
			return fmt.Errorf("firecracker instance %s: %w", in.ID, err)
		}
	}
	return nil
}

// Remove deletes the jail of Instance id once its VMM has exited (the
// jailer leaves it behind). The Instance's own disk survives: the jail held
// another link to it.
func (b *Backend) Remove(id string) error { return b.Jail(id).Remove() }

// GuestConn implements runtime.Backend: the hybrid vsock handshake to the
// guest agent's port through Files.AgentSocket.
func (b *Backend) GuestConn(ctx context.Context, f Files) (net.Conn, error) {
	c, err := DialVsock(ctx, f.AgentSocket, b.AgentPort)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// API is a client for the Instance's Firecracker API socket (for
// SendCtrlAltDel and DescribeInstance after start).
func (b *Backend) API(f Files) *Client { return NewClient(f.Control) }
