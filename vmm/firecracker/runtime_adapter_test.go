package firecracker_test

import (
	"context"
	"net"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/firecracker"
	"github.com/kibotos/kibotos/vmm/platform"
)

// rtBackend is the adapter agent/runtime would hold (as it holds QEMU over
// vmm/qemu): vmm/firecracker cannot name runtime.Spec or runtime.Paths
// without importing agent/runtime, which imports the vmm packages.
type rtBackend struct{ fc *firecracker.Backend }

var _ runtime.Backend = rtBackend{}

func instance(spec runtime.Spec) firecracker.Instance {
	return firecracker.Instance{
		ID:        spec.InstanceID,
		VCPUs:     spec.VCPUs,
		MemoryMiB: spec.MemoryMiB,
		Kernel:    spec.Installation.Kernel(),
		Initrd:    spec.Installation.Initrd(),
	}
}

func files(p runtime.Paths) firecracker.Files {
	return firecracker.Files{Dir: p.Dir, Console: p.Console, VMMLog: p.VMMLog, AgentSocket: p.AgentSocket, Control: p.Control, Disk: p.Disk}
}

func (b rtBackend) Name() string { return b.fc.Name() }

func (b rtBackend) Argv(spec runtime.Spec, p runtime.Paths) ([]string, error) {
	return b.fc.Argv(instance(spec), files(p))
}

func (b rtBackend) GuestConn(ctx context.Context, p runtime.Paths) (net.Conn, error) {
	return b.fc.GuestConn(ctx, files(p))
}

func TestRuntimeAdapter(t *testing.T) {
	var b runtime.Backend = rtBackend{&firecracker.Backend{
		Jailer: "/usr/bin/jailer", Firecracker: "/usr/bin/firecracker", UID: 123, GID: 100, AgentPort: 1024,
	}}
	dir := "/var/lib/kibotos/instances/web-1"
	argv, err := b.Argv(runtime.Spec{
		InstanceID:   "web-1",
		Installation: &platform.Installation{Dir: "/var/lib/kibotos/platforms/p1"},
		VCPUs:        1,
		MemoryMiB:    256,
	}, runtime.Paths{Dir: dir, AgentSocket: filepath.Join(dir, "agent.sock"), Control: filepath.Join(dir, "qmp.sock")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/jailer", "--id", "web-1", "--exec-file", "/usr/bin/firecracker", "--uid", "123", "--gid", "100",
		"--cgroup-version", "2", "--", "--api-sock", "/api.sock", "--config-file", "/vm-config.json"}
	if !reflect.DeepEqual(argv, want) {
		t.Errorf("argv\n got %q\nwant %q", argv, want)
	}
	if b.Name() != "firecracker" {
		t.Errorf("name %q", b.Name())
	}
}
