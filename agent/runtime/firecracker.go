package runtime

import (
	"context"
	"fmt"
	"net"

	"github.com/kibotos/kibotos/vmm/firecracker"
)

// Firecracker adapts vmm/firecracker to Backend and Stager. It has only
// been run against fakes: no firecracker or jailer binary exists on the
// machines this was written on (see vmm/firecracker's package doc).
//
// It gives the guest no data-plane channel yet: Paths.DataSocket is not
// handed to vmm/firecracker, so no launch carries it and
// InstanceStatus.DataSocket stays "" (a second hybrid-vsock port for
// guestproto.DataPortName would be the way to add one).
type Firecracker struct{ FC *firecracker.Backend }

var (
	_ Backend = Firecracker{}
	_ Stager  = Firecracker{}
)

func fcInstance(spec Spec) firecracker.Instance {
	return firecracker.Instance{
		ID: spec.InstanceID, VCPUs: spec.VCPUs, MemoryMiB: spec.MemoryMiB,
		Kernel: spec.Installation.Kernel(), Initrd: spec.Installation.Initrd(),
	}
}

func fcFiles(p Paths) firecracker.Files {
	return firecracker.Files{Dir: p.Dir, Console: p.Console, VMMLog: p.VMMLog, AgentSocket: p.AgentSocket, Control: p.Control, Disk: p.Disk}
}

// Name implements Backend.
func (b Firecracker) Name() string { return b.FC.Name() }

// Argv implements Backend: the jailer, which execs Firecracker in its chroot.
func (b Firecracker) Argv(spec Spec, p Paths) ([]string, error) {
	if len(spec.Volumes) > 0 {
		// Nothing would stage them in the jail: refused, not dropped.
		return nil, fmt.Errorf("firecracker backend: instance %s: Volumes are not supported by this backend; use qemu", spec.InstanceID)
	}
	return b.FC.Argv(fcInstance(spec), fcFiles(p))
}

// GuestConn implements Backend over the hybrid vsock.
func (b Firecracker) GuestConn(ctx context.Context, p Paths) (net.Conn, error) {
	return b.FC.GuestConn(ctx, fcFiles(p))
}

// Prepare implements Stager: the jail with kernel, initrd, disk and config.
func (b Firecracker) Prepare(spec Spec, p Paths) error {
	return b.FC.Prepare(fcInstance(spec), fcFiles(p))
}

// Release implements Stager: the jail goes once the VMM ended for good.
func (b Firecracker) Release(id string, _ Paths) error { return b.FC.Remove(id) }

// ExecPath implements Stager: the jailer's copy of firecracker.
func (b Firecracker) ExecPath(spec Spec, _ Paths) string { return b.FC.ExecPath(spec.InstanceID) }
