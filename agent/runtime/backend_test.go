package runtime

import (
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/firecracker"
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

// Firecracker has no data channel yet: its launches never carry the socket.
func TestFirecrackerNoDataChannel(t *testing.T) {
	p := instancePaths("/srv/kibotos/runtime/instances/i1")
	fc := Firecracker{FC: &firecracker.Backend{Jailer: "/usr/bin/jailer", Firecracker: "/usr/bin/firecracker",
		UID: 1000, GID: 1000, ChrootBaseDir: "/srv/jail", AgentPort: 1024}}
	argv, err := fc.Argv(Spec{InstanceID: "i1", Installation: &platform.Installation{Dir: "/srv/p"}, VCPUs: 1, MemoryMiB: 256}, p)
	if err != nil || len(argv) == 0 {
		t.Fatalf("firecracker argv %q, %v", argv, err)
	}
	if got := dataSocket(p.DataSocket, argv); got != "" {
		t.Errorf("firecracker argv %q carries the data socket", argv)
	}
}
