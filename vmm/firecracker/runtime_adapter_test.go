package firecracker_test

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/firecracker"
	"github.com/kibotos/kibotos/vmm/platform"
)

func TestRuntimeAdapter(t *testing.T) {
	var b runtime.Backend = runtime.Firecracker{FC: &firecracker.Backend{
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
