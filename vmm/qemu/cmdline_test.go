package qemu

import (
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

func TestArgsFull(t *testing.T) {
	c := Config{
		Accel:      AccelTCG,
		MemoryMiB:  512,
		VCPUs:      2,
		Kernel:     "/p/vmlinux",
		Initrd:     "/p/initramfs.cpio.gz",
		KernelArgs: []string{"kibotos.boot=1"},
		TSCKHz:     2596140,
		ConsoleLog: "/i/console.log",
		Channels: []Channel{
			{Name: "kibotos.node", Socket: "/i/node.sock"},
			{Name: "kibotos.data", Socket: "/i/data.sock"},
		},
		Disks: []Disk{{Path: "/i/rw.img"}, {ID: "vol1", Path: "/v/1.img", ReadOnly: true},
			{ID: "v-vol-0123456789abcdef", Path: "/v/2.img", Serial: "vol-0123456789abcdef"}},
		NIC:       &NIC{Tap: "tap0", MAC: "52:54:00:AB:CD:EF"},
		QMPSocket: "/i/qmp.sock",
	}
	got, err := c.Argv()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"qemu-system-x86_64",
		"-M", "microvm", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2",
		"-nodefaults", "-no-user-config", "-nographic",
		"-kernel", "/p/vmlinux", "-initrd", "/p/initramfs.cpio.gz",
		"-append", "console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz=2596140 kibotos.boot=1",
		"-serial", "file:/i/console.log",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=ch-kibotos.node,path=/i/node.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=ch-kibotos.node,name=kibotos.node",
		"-chardev", "socket,id=ch-kibotos.data,path=/i/data.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=ch-kibotos.data,name=kibotos.data",
		"-drive", "file=/i/rw.img,if=none,id=disk0,format=raw",
		"-device", "virtio-blk-device,drive=disk0",
		"-drive", "file=/v/1.img,if=none,id=vol1,format=raw,readonly=on",
		"-device", "virtio-blk-device,drive=vol1",
		"-drive", "file=/v/2.img,if=none,id=v-vol-0123456789abcdef,format=raw",
		"-device", "virtio-blk-device,drive=v-vol-0123456789abcdef,serial=vol-0123456789abcdef",
		"-netdev", "tap,id=net0,ifname=tap0,script=no,downscript=no",
		"-device", "virtio-net-device,netdev=net0,mac=52:54:00:ab:cd:ef",
		"-qmp", "unix:/i/qmp.sock,server=on,wait=off",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv:\n got %q\nwant %q", got, want)
	}
}

func TestArgsMinimalKVM(t *testing.T) {
	c := Config{Accel: AccelKVM, Kernel: "k", Initrd: "i", ConsoleLog: "c", TSCKHz: 1000}
	got, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Join(got, " ")
	for _, want := range []string{"-accel kvm -cpu host -m 256 -smp 1", "-append console=ttyS0 reboot=t panic=-1 quiet -serial"} {
		if !strings.Contains(s, want) {
			t.Errorf("args %q lack %q", s, want)
		}
	}
	// tsc_early_khz is a TCG workaround only; no devices or QMP unless asked.
	for _, no := range []string{"tsc_early_khz", "virtio-serial-device", "-qmp", "-no-reboot", "-drive", "-netdev"} {
		if strings.Contains(s, no) {
			t.Errorf("args %q contain %q", s, no)
		}
	}
}

func TestArgsInvalid(t *testing.T) {
	ok := func() Config {
		return Config{Accel: AccelTCG, TSCKHz: 1, Kernel: "k", Initrd: "i", ConsoleLog: "c"}
	}
	cases := map[string]struct {
		mut  func(*Config)
		want string
	}{
		"auto unresolved": {func(c *Config) { c.Accel = AccelAuto }, "resolve auto"},
		"tcg without tsc": {func(c *Config) { c.TSCKHz = 0 }, "tsc_early_khz"},
		"no kernel":       {func(c *Config) { c.Kernel = "" }, "kernel: no path"},
		"comma in path":   {func(c *Config) { c.Initrd = "/a,b" }, "comma"},
		"bad channel":     {func(c *Config) { c.Channels = []Channel{{Name: "a b", Socket: "/s"}} }, "channel name"},
		"dup channel": {func(c *Config) {
			c.Channels = []Channel{{Name: "a", Socket: "/s1"}, {Name: "a", Socket: "/s2"}}
		}, "given twice"},
		"long socket": {func(c *Config) {
			c.Channels = []Channel{{Name: "a", Socket: "/" + strings.Repeat("x", 120)}}
		}, "unix socket path"},
		"dup disk":    {func(c *Config) { c.Disks = []Disk{{ID: "disk1", Path: "a"}, {Path: "b"}} }, "disk id \"disk1\" given twice"},
		"disk format": {func(c *Config) { c.Disks = []Disk{{Path: "a", Format: "vmdk"}} }, "format"},
		// 21 bytes: QEMU would cut it to 20 and the guest would see
		// another serial than the one asked for.
		"long serial":     {func(c *Config) { c.Disks = []Disk{{Path: "a", Serial: strings.Repeat("s", 21)}} }, "disk disk0: disk serial"},
		"comma in serial": {func(c *Config) { c.Disks = []Disk{{Path: "a", Serial: "a,drive=x"}} }, "want 1 to 20 letters"},
		"dup serial": {func(c *Config) {
			c.Disks = []Disk{{Path: "a", Serial: "layer"}, {Path: "b", Serial: "layer"}}
		}, "serial \"layer\" given twice"},
		"long tap":     {func(c *Config) { c.NIC = &NIC{Tap: "tap-much-too-long-name"} }, "tap"},
		"bad mac":      {func(c *Config) { c.NIC = &NIC{Tap: "tap0", MAC: "nope"} }, "mac"},
		"space arg":    {func(c *Config) { c.KernelArgs = []string{"a b"} }, "whitespace"},
		"two consoles": {func(c *Config) { c.ConsoleSocket = "/i/console.sock" }, "not both"},
		"long console socket": {func(c *Config) {
			c.ConsoleLog, c.ConsoleSocket = "", "/"+strings.Repeat("x", 120)
		}, "console socket"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := ok()
			tc.mut(&c)
			_, err := c.Args()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// TestArgsSandboxedConsoleSocket is the argv of a sandboxed launch: the
// serial console on a socket chardev (the node caps what it keeps) and
// QEMU's seccomp filter with every optional group denied.
func TestArgsSandboxedConsoleSocket(t *testing.T) {
	c := Config{Accel: AccelTCG, TSCKHz: 1000, Kernel: "/p/vmlinux", Initrd: "/p/initrd",
		ConsoleSocket: "/i/console.sock", Sandbox: true}
	got, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-M", "microvm", "-accel", "tcg", "-cpu", "max", "-m", "256", "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic",
		"-kernel", "/p/vmlinux", "-initrd", "/p/initrd",
		"-append", "console=ttyS0 reboot=t panic=-1 quiet tsc_early_khz=1000",
		"-chardev", "socket,id=console,path=/i/console.sock,server=on,wait=off", "-serial", "chardev:console",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv:\n got %q\nwant %q", got, want)
	}
}

// TestSandboxOptionsAccepted asks the installed QEMU whether it takes
// SandboxOptions (it needs libseccomp; 7.2 calls a group "obsolete" where
// newer docs and typos say "obtain"). Skipped without QEMU.
func TestSandboxOptionsAccepted(t *testing.T) {
	bin := testenv.LookPath(t, DefaultBinary, "qemu-system-x86")
	// -M none with -S and no devices: QEMU parses everything, installs the
	// filter and waits; quit on its monitor on stdin ends it.
	cmd := exec.Command(bin, "-M", "none", "-nodefaults", "-display", "none", "-S", "-sandbox", SandboxOptions, "-monitor", "stdio")
	cmd.Stdin = strings.NewReader("quit\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -sandbox %s: %v: %s", bin, SandboxOptions, err, out)
	}
}

// A fork's layer is over frozen bases, then the raw template image: each
// named on the command line, nested, so no path in a qcow2 header counts.
func TestArgsLayerOverBases(t *testing.T) {
	c := Config{Accel: AccelTCG, TSCKHz: 1, Kernel: "k", Initrd: "i", ConsoleLog: "c",
		Disks: []Disk{{ID: "layer", Path: "/p/layers/f.qcow2", Format: "qcow2", Backing: "/t/root.img", Bases: []string{"/p/bases/b2.qcow2", "/p/bases/b1.qcow2"}}}}
	got, err := c.Argv()
	if err != nil {
		t.Fatal(err)
	}
	want := "file=/p/layers/f.qcow2,if=none,id=layer,format=qcow2" +
		",backing.driver=qcow2,backing.file.filename=/p/bases/b2.qcow2" +
		",backing.backing.driver=qcow2,backing.backing.file.filename=/p/bases/b1.qcow2" +
		",backing.backing.backing.driver=raw,backing.backing.backing.file.filename=/t/root.img"
	if !slices.Contains(got, want) {
		t.Errorf("argv %q lacks the drive %q", got, want)
	}
	c.Disks[0].Backing = ""
	if _, err := c.Argv(); err == nil || !strings.Contains(err.Error(), "bases need a backing image") {
		t.Errorf("bases without a backing image: %v", err)
	}
}
