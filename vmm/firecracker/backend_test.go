package firecracker

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestBackendArgv(t *testing.T) {
	b := testBackend()
	got, err := b.Argv(testInstance(), testFiles("/var/lib/kibotos/instances/web-1"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/jailer",
		"--id", "web-1",
		"--exec-file", "/usr/bin/firecracker",
		"--uid", "123", "--gid", "100",
		"--cgroup-version", "2",
		"--chroot-base-dir", "/srv/jailer",
		"--netns", "/run/netns/kibotos-web-1",
		"--", "--api-sock", "/api.sock", "--config-file", "/vm-config.json",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv\n got %q\nwant %q", got, want)
	}
	if b.Name() != "firecracker" {
		t.Errorf("name %q", b.Name())
	}
	if got := b.ExecPath("web-1"); got != "/srv/jailer/firecracker/web-1/root/firecracker" {
		t.Errorf("exec path %s", got)
	}
}

func TestBackendArgvErrors(t *testing.T) {
	b := testBackend()
	in := testInstance()
	in.VCPUs = 0
	if _, err := b.Argv(in, testFiles("/i")); err == nil || !strings.Contains(err.Error(), "firecracker instance web-1: firecracker config: machine-config: vcpu_count 0") {
		t.Errorf("error %v", err)
	}
	in = testInstance()
	in.Kernel = ""
	if _, err := b.Argv(in, testFiles("/i")); err == nil || !strings.Contains(err.Error(), "no kernel") {
		t.Errorf("error %v", err)
	}
	f := testFiles("/" + strings.Repeat("d", 100))
	if _, err := b.Argv(testInstance(), f); err == nil || !strings.Contains(err.Error(), "longer than 107") {
		t.Errorf("error %v", err)
	}
	b.AgentPort = 0
	if _, err := b.Argv(testInstance(), testFiles("/i")); err == nil || !strings.Contains(err.Error(), "vsock port") {
		t.Errorf("error %v", err)
	}
}

// TestBackendPrepare stages a jail in a temporary chroot base and checks
// the layout that the jailer and Firecracker would find; neither runs.
func TestBackendPrepare(t *testing.T) {
	tmp := t.TempDir()
	platform := filepath.Join(tmp, "platform")
	inst := filepath.Join(tmp, "instances", "web-1")
	for _, d := range []string{platform, inst} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	b := testBackend()
	b.ChrootBaseDir = filepath.Join(tmp, "jails")
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 65534, 65534 // root may give the disk away
	}
	b.UID, b.GID = uid, gid
	in := testInstance()
	in.Kernel, in.Initrd = filepath.Join(platform, "vmlinux"), filepath.Join(platform, "initrd.cpio")
	f := testFiles(inst)
	for p, s := range map[string]string{in.Kernel: "kernel", in.Initrd: "initrd", f.Disk: "disk"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Prepare(in, f); err != nil {
		t.Fatal(err)
	}
	j := b.Jail("web-1")
	if j.Root() != filepath.Join(tmp, "jails", "firecracker", "web-1", "root") {
		t.Errorf("root %s", j.Root())
	}
	for src, in := range map[string]string{in.Kernel: JailKernel, in.Initrd: JailInitrd, f.Disk: JailDisk} {
		if ino(t, src) != ino(t, j.HostPath(in)) {
			t.Errorf("%s is not a hard link of %s", j.HostPath(in), src)
		}
	}
	st, _ := os.Stat(f.Disk)
	if s := st.Sys().(*syscall.Stat_t); int(s.Uid) != uid || int(s.Gid) != gid {
		t.Errorf("disk owned by %d:%d, want %d:%d", s.Uid, s.Gid, uid, gid)
	}
	data, err := os.ReadFile(j.HostPath(JailConfig))
	if err != nil {
		t.Fatal(err)
	}
	var cfg VMConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	// Every path in the config exists in the jail (the sockets once
	// Firecracker runs).
	for _, p := range []string{cfg.BootSource.KernelImagePath, cfg.BootSource.InitrdPath, cfg.Drives[0].PathOnHost} {
		if _, err := os.Stat(j.HostPath(p)); err != nil {
			t.Errorf("config path %s: %v", p, err)
		}
	}
	for link, target := range map[string]string{
		f.Control:     j.HostPath(JailAPISocket),
		f.AgentSocket: j.HostPath(cfg.Vsock.UDSPath),
		f.Console:     f.VMMLog,
	} {
		if got, err := os.Readlink(link); err != nil || got != target {
			t.Errorf("%s -> %s (%v), want -> %s", link, got, err, target)
		}
	}
	if err := b.Prepare(in, f); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second Prepare: %v", err)
	}
	if err := b.Remove("web-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Disk); err != nil {
		t.Errorf("disk after Remove: %v", err)
	}
}

// TestBackendGuestConnThroughSymlink plays Firecracker's part: a fake
// vsock listener at the jail's uds_path, reached through Files.AgentSocket.
func TestBackendGuestConnThroughSymlink(t *testing.T) {
	tmp := t.TempDir()
	b := testBackend()
	b.ChrootBaseDir = filepath.Join(tmp, "jails")
	uds := b.Jail("web-1").HostPath(JailVsock)
	if err := os.MkdirAll(filepath.Dir(uds), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, len("CONNECT 1024\n"))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "CONNECT 1024\n" {
			return
		}
		io.WriteString(c, "OK 1073741825\nguest-agent")
	}()
	f := testFiles(tmp)
	if err := os.Symlink(uds, f.AgentSocket); err != nil {
		t.Fatal(err)
	}
	c, err := b.GuestConn(ctxT(t), f)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, _ := io.ReadAll(c)
	if string(got) != "guest-agent" {
		t.Errorf("read %q", got)
	}
	if _, err := b.GuestConn(ctxT(t), testFiles(filepath.Join(tmp, "none"))); err == nil {
		t.Error("GuestConn without a socket succeeded")
	}
}

func TestNewBackendWithoutBinaries(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := NewBackend("", "", 123, 100, 1024)
	if err == nil || !strings.Contains(err.Error(), "jailer not found") {
		t.Errorf("error %v", err)
	}
}
