package runtime

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"

	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// Backend is what differs between VMMs: the command line and how the node
// reaches the guest agent. QEMU (microvm, virtio-serial channel) is the
// one implemented (docs/explanations/vmm-backends.md: why there is no
// Firecracker).
type Backend interface {
	// Name is recorded in the launch record.
	Name() string
	// Argv is the VMM command, binary first as an absolute path.
	Argv(spec Spec, paths Paths) ([]string, error)
	// GuestConn opens the raw byte stream to the guest agent's channel.
	GuestConn(ctx context.Context, paths Paths) (net.Conn, error)
}

// Paths are the files of one Instance, all inside its directory.
type Paths struct {
	Dir         string
	Console     string // guest serial console
	VMMLog      string // the VMM's stdout and stderr
	AgentSocket string // guest agent channel of the node
	Control     string // VMM control socket (QMP)
	Disk        string // writable raw disk
	Tap         string // tap in the Instance's network namespace; "" for none
	Layer       string // retained writable layer (qcow2 over a template image); "" for none
	// LayerBases are the frozen qcow2 bases between Layer and its template
	// image, nearest first (a fork's or its source's layer; see fork.go).
	LayerBases []string
	// DataSocket is the guest agent's data-plane channel. The node never
	// connects to it: the data-plane process is its one client (a QEMU
	// socket chardev serves one client at a time).
	DataSocket string
	// ConsoleSocket is the serial console of a confined VMM, which the
	// node reads into Console; "": QEMU writes Console itself.
	ConsoleSocket string
}

// confinedPaths are the files of an Instance whose VMM runs as the VMM
// account: those of instancePaths and the serial console's socket. The
// sockets stay in the Instance directory (a subdirectory would push them
// past the 107-byte unix socket limit under long storage roots); the
// directory is sticky, so the account can create its sockets there but
// never rename or remove the node's files (launch record, console log).
func confinedPaths(dir string) Paths {
	p := instancePaths(dir)
	p.ConsoleSocket = filepath.Join(dir, "ttyS0.sock")
	return p
}

// pathsOf are the files of the launch rec describes.
func pathsOf(dir string, rec *LaunchRecord) Paths {
	if rec != nil && rec.Confinement != nil {
		return confinedPaths(dir)
	}
	return instancePaths(dir)
}

func instancePaths(dir string) Paths {
	return Paths{
		Dir:         dir,
		Console:     filepath.Join(dir, "console.log"),
		VMMLog:      filepath.Join(dir, "vmm.log"),
		AgentSocket: filepath.Join(dir, "agent.sock"),
		DataSocket:  filepath.Join(dir, "data.sock"),
		Control:     filepath.Join(dir, "qmp.sock"),
		Disk:        filepath.Join(dir, "disk.raw"),
	}
}

// AgentPortName is the virtio-serial port the guest agent listens on (the
// default of `kibotos guest-agent --port-name`).
const AgentPortName = "kibotos.agent"

// QEMU is the qemu-system-x86_64 -M microvm backend.
type QEMU struct {
	Binary string // absolute path
	Accel  qemu.Accel
	TSCKHz int
}

// NewQEMU resolves the binary and the accelerator (auto picks TCG where KVM
// cannot run a stock guest kernel) and says why in choice.
func NewQEMU(binary string, accel qemu.Accel) (*QEMU, qemu.Choice, error) {
	if binary == "" {
		binary = qemu.DefaultBinary
	}
	path, err := exec.LookPath(binary)
	if err != nil {
		return nil, qemu.Choice{}, fmt.Errorf("qemu backend: %s not found: %w (install the Debian package qemu-system-x86)", binary, err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, qemu.Choice{}, err
	}
	choice, err := qemu.SelectAccel(accel, qemu.Host{})
	if err != nil {
		return nil, qemu.Choice{}, fmt.Errorf("qemu backend: %w", err)
	}
	b := &QEMU{Binary: path, Accel: choice.Accel}
	if choice.Accel == qemu.AccelTCG {
		if b.TSCKHz, err = (qemu.Host{}).TSCKHz(); err != nil {
			return nil, choice, fmt.Errorf("qemu backend: TCG needs the host TSC frequency: %w", err)
		}
	}
	return b, choice, nil
}

// Name implements Backend.
func (*QEMU) Name() string { return "qemu" }

// Argv implements Backend.
func (q *QEMU) Argv(spec Spec, p Paths) ([]string, error) {
	cfg := qemu.Config{
		Binary:    q.Binary,
		Accel:     q.Accel,
		TSCKHz:    q.TSCKHz,
		MemoryMiB: spec.MemoryMiB,
		VCPUs:     spec.VCPUs,
		Kernel:    spec.Installation.Kernel(),
		Initrd:    spec.Installation.Initrd(),
		// A confined launch: console on a socket the node caps, seccomp.
		ConsoleSocket: p.ConsoleSocket,
		Sandbox:       p.ConsoleSocket != "",
		Channels:      []qemu.Channel{{Name: AgentPortName, Socket: p.AgentSocket}},
		QMPSocket:     p.Control,
		Incoming:      spec.Restore != nil,
	}
	// The data plane's channel; InstanceStatus reports its socket because
	// it is on this command line.
	if p.DataSocket != "" {
		cfg.Channels = append(cfg.Channels, qemu.Channel{Name: guestproto.DataPortName, Socket: p.DataSocket})
	}
	if p.Layer != "" {
		cfg.Disks = append(cfg.Disks, qemu.Disk{ID: "layer", Path: p.Layer, Format: "qcow2", Backing: spec.RootImage, Bases: p.LayerBases, Serial: LayerSerial})
	}
	if p.Disk != "" {
		cfg.Disks = append(cfg.Disks, qemu.Disk{ID: "writable", Path: p.Disk, Format: "raw"})
	}
	for _, v := range spec.Volumes {
		cfg.Disks = append(cfg.Disks, qemu.Disk{ID: volumeDriveID(v.Serial), Path: v.Path, Format: "raw", Serial: v.Serial})
	}
	if p.Tap != "" {
		cfg.NIC = &qemu.NIC{Tap: p.Tap}
	}
	if cfg.ConsoleSocket == "" {
		cfg.ConsoleLog = p.Console
	}
	return cfg.Argv()
}

// GuestConn implements Backend: the channel is a unix socket QEMU serves
// one client at a time.
func (*QEMU) GuestConn(ctx context.Context, p Paths) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", p.AgentSocket)
}
