// Package qemu owns how Kibotos runs a micro-VM under QEMU: the
// qemu-system-x86_64 -M microvm command line (Platform kernel + initramfs,
// virtio-mmio devices, virtio-serial guest channels on host unix sockets,
// QMP) and the choice of accelerator, and a small QMP client for what the
// node asks of a running VMM (block_resize). It builds argv, reads host
// facts and talks to a QMP socket it is given; it never starts or kills
// processes by itself.
package qemu

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DefaultBinary is the QEMU system emulator (Debian: qemu-system-x86).
const DefaultBinary = "qemu-system-x86_64"

// Config describes one micro-VM.
type Config struct {
	Binary    string // default DefaultBinary
	Accel     Accel  // kvm or tcg, as resolved by SelectAccel
	CPU       string // default "host" under KVM, "max" under TCG
	MemoryMiB int    // default 256
	VCPUs     int    // default 1

	Kernel string // uncompressed PVH vmlinux
	Initrd string
	// KernelArgs are appended to the base command line.
	KernelArgs []string
	// TSCKHz is passed as tsc_early_khz= under TCG, where it is required
	// (see Host.TSCKHz).
	TSCKHz int

	// ConsoleLog receives the guest serial console (ttyS0) as a file QEMU
	// appends to without bound. Launches of earlier builds used it; set
	// ConsoleSocket instead.
	ConsoleLog string
	// ConsoleSocket makes the serial console a unix socket QEMU listens
	// on (server=on,wait=off): the node reads it into a size-capped log.
	// While no client is connected QEMU drops what the guest writes; a
	// slow client throttles the guest's UART instead of growing anything.
	ConsoleSocket string
	// Sandbox enables QEMU's seccomp filter with every optional group
	// denied: obsolete system calls, set*uid/capabilities (elevateprivileges),
	// fork/exec (spawn) and scheduler/affinity changes (resourcecontrol).
	Sandbox bool
	// Channels are named virtio-serial ports, each a unix socket QEMU
	// listens on; the guest sees /dev/virtio-ports/<Name>.
	Channels []Channel
	Disks    []Disk
	NIC      *NIC
	// QMPSocket, if set, is a unix socket QEMU listens on for QMP.
	QMPSocket string
	// Incoming makes QEMU wait for a saved state (-incoming defer) instead
	// of booting: QMP.Load loads it and QMP.Cont starts its vCPUs (-S).
	// The devices must be those of the saved VM, in the same order.
	Incoming bool
}

// Channel is one guest channel.
type Channel struct {
	Name   string
	Socket string
}

// Disk is a virtio-blk device. The guest names them vda, vdb, ... in the
// order the kernel probes the virtio-mmio slots, which is not the order
// given here: a guest that must tell disks apart looks for their Serial.
type Disk struct {
	ID       string // default disk<N>
	Path     string
	Format   string // default raw
	ReadOnly bool
	// Serial, if set, is the disk's virtio-blk serial, which the guest
	// reads from /sys/block/vdX/serial: 1 to MaxSerialLen characters of
	// letters, digits, '.', '_' and '-'.
	Serial string
	// Backing, for a qcow2 disk, is its raw backing image, given on the
	// command line so the path stored in the qcow2 header does not matter:
	// a layer in a shared pool was created on another node, whose
	// template images live under another storage root.
	Backing string
	// Bases, for a qcow2 disk with Backing, are qcow2 images between the
	// disk and Backing, nearest first: the frozen layer a fork of a
	// paused Workspace and its source both write over.
	Bases []string
}

// NIC is a virtio-net device on an existing tap.
type NIC struct {
	Tap string
	MAC string // optional, 52:54:00:xx:xx:xx
}

// BaseKernelArgs start every guest command line: serial console, reboot by
// triple fault and immediate reboot on panic. QEMU resets the VM and boots
// the same kernel again: a guest restarts inside its VMM, and the node
// tells the new boot its launch-time configuration.
var BaseKernelArgs = []string{"console=ttyS0", "reboot=t", "panic=-1", "quiet"}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	macRE    = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)
	serialRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,20}$`)
)

// MaxSerialLen is the longest virtio-blk serial: the device answers the
// guest's GET_ID with 20 bytes (VIRTIO_BLK_ID_BYTES) and QEMU silently
// cuts a longer one, which would then match nothing the node asked for.
const MaxSerialLen = 20

// ValidSerial says what is wrong with a virtio-blk serial, nil if nothing.
func ValidSerial(s string) error {
	if !serialRE.MatchString(s) {
		return fmt.Errorf("disk serial %q: want 1 to %d letters, digits, '.', '_' or '-'", s, MaxSerialLen)
	}
	return nil
}

// SandboxOptions is the -sandbox value of Config.Sandbox. QEMU 7.2 names
// the obsolete-syscall group "obsolete" (not "obtain").
const SandboxOptions = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// maxSocketPath is sun_path minus its NUL.
const maxSocketPath = 107

// KernelCmdline is the -append string.
func (c *Config) KernelCmdline() string {
	args := append([]string(nil), BaseKernelArgs...)
	if c.Accel == AccelTCG && c.TSCKHz > 0 {
		args = append(args, "tsc_early_khz="+strconv.Itoa(c.TSCKHz))
	}
	return strings.Join(append(args, c.KernelArgs...), " ")
}

// Argv is the full command, binary first.
func (c *Config) Argv() ([]string, error) {
	args, err := c.Args()
	if err != nil {
		return nil, err
	}
	bin := c.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	return append([]string{bin}, args...), nil
}

// Args is the QEMU argument list.
func (c *Config) Args() ([]string, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	cpu := c.CPU
	if cpu == "" {
		cpu = "max"
		if c.Accel == AccelKVM {
			cpu = "host"
		}
	}
	mem, smp := c.MemoryMiB, c.VCPUs
	if mem == 0 {
		mem = 256
	}
	if smp == 0 {
		smp = 1
	}
	a := []string{
		"-M", "microvm", "-accel", string(c.Accel), "-cpu", cpu,
		"-m", strconv.Itoa(mem), "-smp", strconv.Itoa(smp),
		"-nodefaults", "-no-user-config", "-nographic",
		"-kernel", c.Kernel,
		"-initrd", c.Initrd,
		"-append", c.KernelCmdline(),
	}
	if c.ConsoleSocket != "" {
		a = append(a, "-chardev", "socket,id=console,path="+c.ConsoleSocket+",server=on,wait=off", "-serial", "chardev:console")
	} else {
		a = append(a, "-serial", "file:"+c.ConsoleLog)
	}
	if c.Sandbox {
		a = append(a, "-sandbox", SandboxOptions)
	}
	if len(c.Channels) > 0 {
		a = append(a, "-device", "virtio-serial-device")
		for _, ch := range c.Channels {
			id := "ch-" + ch.Name
			a = append(a,
				"-chardev", "socket,id="+id+",path="+ch.Socket+",server=on,wait=off",
				"-device", "virtserialport,chardev="+id+",name="+ch.Name)
		}
	}
	for i, d := range c.Disks {
		id := d.ID
		if id == "" {
			id = "disk" + strconv.Itoa(i)
		}
		format := d.Format
		if format == "" {
			format = "raw"
		}
		drive := "file=" + d.Path + ",if=none,id=" + id + ",format=" + format
		if d.Backing != "" {
			prefix := ",backing."
			for _, b := range d.Bases {
				drive += prefix + "driver=qcow2" + prefix + "file.filename=" + b
				prefix += "backing."
			}
			drive += prefix + "driver=raw" + prefix + "file.filename=" + d.Backing
		}
		if d.ReadOnly {
			drive += ",readonly=on"
		}
		dev := "virtio-blk-device,drive=" + id
		if d.Serial != "" {
			dev += ",serial=" + d.Serial
		}
		a = append(a, "-drive", drive, "-device", dev)
	}
	if c.NIC != nil {
		a = append(a, "-netdev", "tap,id=net0,ifname="+c.NIC.Tap+",script=no,downscript=no")
		dev := "virtio-net-device,netdev=net0"
		if c.NIC.MAC != "" {
			dev += ",mac=" + strings.ToLower(c.NIC.MAC)
		}
		a = append(a, "-device", dev)
	}
	if c.QMPSocket != "" {
		a = append(a, "-qmp", "unix:"+c.QMPSocket+",server=on,wait=off")
	}
	if c.Incoming {
		// -S: the vCPUs wait for a cont once the state is loaded, which
		// the caller sends when it trusts the state.
		a = append(a, "-S", "-incoming", "defer")
	}
	return a, nil
}

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch c.Accel {
	case AccelKVM:
	case AccelTCG:
		if c.TSCKHz <= 0 {
			bad("accel tcg needs TSCKHz (tsc_early_khz): without it the guest hangs calibrating the TSC")
		}
	default:
		bad("accel %q: resolve auto with SelectAccel first; want kvm or tcg", c.Accel)
	}
	if c.MemoryMiB < 0 || c.VCPUs < 0 {
		bad("memory %d MiB, %d vCPUs: must not be negative", c.MemoryMiB, c.VCPUs)
	}
	path := func(what, p string, socket bool) {
		switch {
		case p == "":
			bad("%s: no path", what)
		case strings.ContainsAny(p, ",\n"):
			// A comma would split QEMU's option string.
			bad("%s %q: path contains a comma or newline", what, p)
		case socket && len(p) > maxSocketPath:
			bad("%s %q: %d bytes, longer than a unix socket path (%d)", what, p, len(p), maxSocketPath)
		}
	}
	path("kernel", c.Kernel, false)
	path("initrd", c.Initrd, false)
	switch {
	case c.ConsoleSocket != "" && c.ConsoleLog != "":
		bad("console: give a console socket or a console log file, not both")
	case c.ConsoleSocket != "":
		path("console socket", c.ConsoleSocket, true)
	default:
		path("console log", c.ConsoleLog, false)
	}
	for _, a := range c.KernelArgs {
		if a == "" || strings.ContainsAny(a, " \t\n") {
			bad("kernel arg %q: empty or contains whitespace", a)
		}
	}
	seen := map[string]bool{}
	for _, ch := range c.Channels {
		if !nameRE.MatchString(ch.Name) {
			bad("channel name %q: want letters, digits, '.', '_' or '-'", ch.Name)
		}
		if seen[ch.Name] {
			bad("channel %q given twice", ch.Name)
		}
		seen[ch.Name] = true
		path("channel "+ch.Name+" socket", ch.Socket, true)
	}
	ids, serials := map[string]bool{}, map[string]bool{}
	for i, d := range c.Disks {
		if d.ID != "" && !nameRE.MatchString(d.ID) {
			bad("disk id %q: want letters, digits, '.', '_' or '-'", d.ID)
		}
		id := d.ID
		if id == "" {
			id = "disk" + strconv.Itoa(i)
		}
		if ids[id] {
			bad("disk id %q given twice", id)
		}
		ids[id] = true
		if d.Serial != "" {
			if err := ValidSerial(d.Serial); err != nil {
				bad("disk %s: %v", id, err)
			} else if serials[d.Serial] {
				bad("disk %s: serial %q given twice", id, d.Serial)
			}
			serials[d.Serial] = true
		}
		if d.Format != "" && d.Format != "raw" && d.Format != "qcow2" {
			bad("disk %s format %q: want raw or qcow2", id, d.Format)
		}
		path("disk "+id, d.Path, false)
		if d.Backing != "" {
			if d.Format != "qcow2" {
				bad("disk %s: a backing image needs format qcow2", id)
			}
			path("disk "+id+" backing", d.Backing, false)
		}
		if len(d.Bases) > 0 && d.Backing == "" {
			bad("disk %s: bases need a backing image", id)
		}
		for _, b := range d.Bases {
			path("disk "+id+" base", b, false)
		}
	}
	if c.NIC != nil {
		if !nameRE.MatchString(c.NIC.Tap) || len(c.NIC.Tap) > 15 {
			bad("tap %q: want an interface name of at most 15 characters", c.NIC.Tap)
		}
		if c.NIC.MAC != "" && !macRE.MatchString(c.NIC.MAC) {
			bad("mac %q: want xx:xx:xx:xx:xx:xx", c.NIC.MAC)
		}
	}
	if c.QMPSocket != "" {
		path("qmp socket", c.QMPSocket, true)
	} else if c.Incoming {
		bad("incoming: a restore is loaded over QMP; give a QMP socket")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("qemu config: %w", err)
	}
	return nil
}
