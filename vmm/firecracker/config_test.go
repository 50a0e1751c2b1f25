package firecracker

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func testBackend() *Backend {
	return &Backend{
		Jailer:        "/usr/bin/jailer",
		Firecracker:   "/usr/bin/firecracker",
		UID:           123,
		GID:           100,
		ChrootBaseDir: "/srv/jailer",
		AgentPort:     1024,
		KernelArgs:    []string{"kibotos.test=1"},
	}
}

func testInstance() Instance {
	return Instance{
		ID:        "web-1",
		VCPUs:     2,
		MemoryMiB: 512,
		Kernel:    "/var/lib/kibotos/platforms/p1/vmlinux",
		Initrd:    "/var/lib/kibotos/platforms/p1/initrd.cpio",
		NetNS:     "/run/netns/kibotos-web-1",
		NICs:      []NIC{{Tap: "tap0", MAC: "06:00:ac:10:00:02"}},
	}
}

func testFiles(dir string) Files {
	return Files{
		Dir:         dir,
		Console:     filepath.Join(dir, "console.log"),
		VMMLog:      filepath.Join(dir, "vmm.log"),
		AgentSocket: filepath.Join(dir, "agent.sock"),
		Control:     filepath.Join(dir, "qmp.sock"),
		Disk:        filepath.Join(dir, "disk.raw"),
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update once to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestConfigFileGolden(t *testing.T) {
	cfg, err := testBackend().VMConfig(testInstance(), testFiles("/var/lib/kibotos/instances/web-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.JSON()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "vm-config.json", b)
}

// swaggerFields are the property names of the API definitions
// (src/firecracker/swagger/firecracker.yaml) this package writes, and the
// FullVmConfiguration keys of the sections: the config file must use no
// other name.
var swaggerFields = map[string][]string{
	"":                   {"boot-source", "machine-config", "drives", "network-interfaces", "vsock", "balloon", "cpu-config", "logger", "metrics", "memory-hotplug", "mmds-config", "pmem", "entropy"},
	"boot-source":        {"kernel_image_path", "initrd_path", "boot_args"},
	"machine-config":     {"vcpu_count", "mem_size_mib", "smt", "cpu_template", "track_dirty_pages", "huge_pages"},
	"drives":             {"drive_id", "partuuid", "is_root_device", "cache_type", "is_read_only", "path_on_host", "rate_limiter", "io_engine", "socket"},
	"network-interfaces": {"iface_id", "host_dev_name", "guest_mac", "mtu", "rx_rate_limiter", "tx_rate_limiter"},
	"vsock":              {"guest_cid", "uds_path", "vsock_id"},
}

var swaggerRequired = map[string][]string{
	"boot-source":        {"kernel_image_path"},
	"machine-config":     {"mem_size_mib", "vcpu_count"},
	"drives":             {"drive_id", "is_root_device", "is_read_only", "path_on_host"}, // the last two: required for virtio-block
	"network-interfaces": {"host_dev_name", "iface_id"},
	"vsock":              {"guest_cid", "uds_path"},
}

func checkObject(t *testing.T, section string, obj map[string]any) {
	t.Helper()
	allowed := map[string]bool{}
	for _, f := range swaggerFields[section] {
		allowed[f] = true
	}
	for k := range obj {
		if !allowed[k] {
			t.Errorf("section %q: field %q is not in the Firecracker API definition", section, k)
		}
	}
	for _, r := range swaggerRequired[section] {
		if _, ok := obj[r]; !ok {
			t.Errorf("section %q: required field %q missing", section, r)
		}
	}
}

func TestConfigFileSchema(t *testing.T) {
	cfg, err := testBackend().VMConfig(testInstance(), testFiles("/i/web-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := cfg.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	checkObject(t, "", doc)
	for _, s := range []string{"boot-source", "machine-config", "vsock"} {
		obj, ok := doc[s].(map[string]any)
		if !ok {
			t.Fatalf("section %q: not an object: %v", s, doc[s])
		}
		checkObject(t, s, obj)
	}
	for _, s := range []string{"drives", "network-interfaces"} {
		arr, ok := doc[s].([]any)
		if !ok || len(arr) == 0 {
			t.Fatalf("section %q: want a non-empty array, got %v", s, doc[s])
		}
		for _, e := range arr {
			checkObject(t, s, e.(map[string]any))
		}
	}
	// Paths are inside the jail.
	bs := doc["boot-source"].(map[string]any)
	if bs["kernel_image_path"] != "/vmlinux" || bs["initrd_path"] != "/initrd" {
		t.Errorf("boot-source paths not jail-relative: %v", bs)
	}
	if !strings.HasPrefix(bs["boot_args"].(string), "console=ttyS0 reboot=k panic=1 pci=off") || !strings.HasSuffix(bs["boot_args"].(string), " kibotos.test=1") {
		t.Errorf("boot_args %q", bs["boot_args"])
	}
}

func TestConfigFileEmptyListsAndNoVsock(t *testing.T) {
	c := &VMConfig{BootSource: BootSource{KernelImagePath: "/vmlinux"}, MachineConfig: MachineConfig{VCPUCount: 1, MemSizeMiB: 128}}
	b, err := c.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(doc))
	for k := range doc {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if got := strings.Join(keys, ","); got != "boot-source,drives,machine-config,network-interfaces" {
		t.Errorf("sections %s", got)
	}
	if string(doc["drives"]) != "[]" || string(doc["network-interfaces"]) != "[]" {
		t.Errorf("empty lists: drives %s, network-interfaces %s", doc["drives"], doc["network-interfaces"])
	}
	if strings.Contains(string(doc["boot-source"]), "initrd_path") || strings.Contains(string(doc["boot-source"]), "boot_args") {
		t.Errorf("empty optional fields written: %s", doc["boot-source"])
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func() *VMConfig {
		return &VMConfig{
			BootSource:    BootSource{KernelImagePath: "/vmlinux"},
			MachineConfig: MachineConfig{VCPUCount: 2, MemSizeMiB: 256},
			Drives:        []Drive{{DriveID: "writable", PathOnHost: "/disk.raw"}},
			Vsock:         &Vsock{GuestCID: 3, UDSPath: "/v.sock"},
		}
	}
	if err := ok().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*VMConfig)
		want string
	}{
		{"no kernel", func(c *VMConfig) { c.BootSource.KernelImagePath = "" }, "kernel_image_path is required"},
		{"0 vcpus", func(c *VMConfig) { c.MachineConfig.VCPUCount = 0 }, "vcpu_count 0"},
		{"33 vcpus", func(c *VMConfig) { c.MachineConfig.VCPUCount = 33 }, "vcpu_count 33"},
		{"odd smt", func(c *VMConfig) { c.MachineConfig.VCPUCount, c.MachineConfig.SMT = 3, true }, "1 or an even number"},
		{"no memory", func(c *VMConfig) { c.MachineConfig.MemSizeMiB = 0 }, "mem_size_mib 0"},
		{"bad drive id", func(c *VMConfig) { c.Drives[0].DriveID = "a/b" }, `drive "a/b"`},
		{"dup drive", func(c *VMConfig) { c.Drives = append(c.Drives, c.Drives[0]) }, "given twice"},
		{"two roots", func(c *VMConfig) {
			c.Drives = []Drive{{DriveID: "a", PathOnHost: "/a", IsRootDevice: true}, {DriveID: "b", PathOnHost: "/b", IsRootDevice: true}}
		}, "2 root devices"},
		{"no drive path", func(c *VMConfig) { c.Drives[0].PathOnHost = "" }, "path_on_host is required"},
		{"bad mac", func(c *VMConfig) {
			c.NetworkInterfaces = []NetworkInterface{{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "zz"}}
		}, "not a MAC"},
		{"no tap", func(c *VMConfig) { c.NetworkInterfaces = []NetworkInterface{{IfaceID: "eth0"}} }, "host_dev_name is required"},
		{"cid 2", func(c *VMConfig) { c.Vsock.GuestCID = 2 }, "guest_cid 2"},
		{"no uds", func(c *VMConfig) { c.Vsock.UDSPath = "" }, "uds_path is required"},
	} {
		c := ok()
		tc.mod(c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
		if _, jerr := c.JSON(); jerr == nil {
			t.Errorf("%s: JSON wrote an invalid config", tc.name)
		}
	}
}
