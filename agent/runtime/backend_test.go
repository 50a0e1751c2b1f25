package runtime

import (
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// The QEMU backend gives the guest the data plane's port next to the
// node's; the status reports its socket only for launches that carry it.
func TestQEMUDataChannel(t *testing.T) {
	p := instancePaths("/srv/kibotos/runtime/instances/i1")
	if p.DataSocket != "/srv/kibotos/runtime/instances/i1/data.sock" {
		t.Fatalf("DataSocket %q", p.DataSocket)
	}
	q := &QEMU{Binary: "/usr/bin/qemu-system-x86_64", Accel: qemu.AccelTCG, TSCKHz: 2000000}
	argv, err := q.Argv(Spec{InstanceID: "i1", Installation: &platform.Installation{Dir: "/srv/p"}, VCPUs: 1, MemoryMiB: 256}, p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := strings.Join(argv, " ")
	for _, want := range []string{
		"path=" + p.AgentSocket + ",", "name=" + AgentPortName,
		"path=" + p.DataSocket + ",", "name=" + guestproto.DataPortName,
	} {
		if !strings.Contains(cmd, want) {
			t.Errorf("argv lacks %q:\n%s", want, cmd)
		}
	}
	if got := dataSocket(p.DataSocket, argv); got != p.DataSocket {
		t.Errorf("dataSocket for this launch %q, want %q", got, p.DataSocket)
	}
	// A launch from before the data channel (taken over since) has none.
	old := slices.DeleteFunc(slices.Clone(argv), func(a string) bool { return strings.Contains(a, "data") })
	if got := dataSocket(p.DataSocket, old); got != "" {
		t.Errorf("dataSocket for a launch without the channel %q, want none", got)
	}
}

// A confined launch puts its console on a socket and its seccomp filter on;
// an unconfined one (before confinement) keeps the file console.
func TestQEMUConfinedArgv(t *testing.T) {
	q := &QEMU{Binary: "/usr/bin/qemu-system-x86_64", Accel: qemu.AccelTCG, TSCKHz: 2000000}
	spec := Spec{InstanceID: "i1", Installation: &platform.Installation{Dir: "/srv/p"}, VCPUs: 1, MemoryMiB: 256}
	p := confinedPaths("/srv/kibotos/runtime/instances/i1")
	argv, err := q.Argv(spec, p)
	if err != nil {
		t.Fatal(err)
	}
	cmd := strings.Join(argv, " ")
	for _, want := range []string{
		"-chardev socket,id=console,path=/srv/kibotos/runtime/instances/i1/ttyS0.sock,server=on,wait=off -serial chardev:console",
		"-sandbox " + qemu.SandboxOptions,
		"path=/srv/kibotos/runtime/instances/i1/agent.sock,",
		"-qmp unix:/srv/kibotos/runtime/instances/i1/qmp.sock,",
	} {
		if !strings.Contains(cmd, want) {
			t.Errorf("confined argv lacks %q:\n%s", want, cmd)
		}
	}
	old, err := q.Argv(spec, instancePaths("/srv/kibotos/runtime/instances/i1"))
	if err != nil {
		t.Fatal(err)
	}
	if cmd := strings.Join(old, " "); !strings.Contains(cmd, "-serial file:/srv/kibotos/runtime/instances/i1/console.log") || strings.Contains(cmd, "-sandbox") {
		t.Errorf("unconfined argv: %s", cmd)
	}
	if pathsOf("/d", &LaunchRecord{}).ConsoleSocket != "" || pathsOf("/d", &LaunchRecord{Confinement: &Confinement{}}).ConsoleSocket != "/d/ttyS0.sock" {
		t.Error("pathsOf does not follow the record's confinement")
	}
}

func TestVMMLimits(t *testing.T) {
	mem, tasks := vmmLimits(1024, 4)
	if mem != (1024+VMMMemoryOverheadMiB)<<20 || tasks != VMMTasksBase+4*VMMTasksPerVCPU {
		t.Errorf("vmmLimits(1024 MiB, 4) = %d, %d", mem, tasks)
	}
	if mem, tasks := vmmLimits(0, 0); mem != (256+VMMMemoryOverheadMiB)<<20 || tasks != VMMTasksBase+VMMTasksPerVCPU {
		t.Errorf("vmmLimits of QEMU's defaults = %d, %d", mem, tasks)
	}
}
