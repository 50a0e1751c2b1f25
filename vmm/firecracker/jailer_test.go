package firecracker

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestJailerArgv(t *testing.T) {
	got, err := JailerArgv(JailerOptions{
		Jailer:          "/usr/bin/jailer",
		ExecFile:        "/usr/bin/firecracker",
		ID:              "551e7604-e35c-42b3-b825-416853441234",
		UID:             123,
		GID:             100,
		ChrootBaseDir:   "/srv/jailer",
		NetNS:           "/var/run/netns/my_netns",
		ParentCgroup:    "kibotos",
		Cgroups:         []string{"cpuset.mems=0", "cpuset.cpus=0-3"},
		ResourceLimits:  []string{"no-file=1024"},
		NewPIDNS:        true,
		FirecrackerArgs: []string{"--api-sock", "/api.sock", "--config-file", "/vm-config.json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/jailer",
		"--id", "551e7604-e35c-42b3-b825-416853441234",
		"--exec-file", "/usr/bin/firecracker",
		"--uid", "123", "--gid", "100",
		"--cgroup-version", "2",
		"--parent-cgroup", "kibotos",
		"--cgroup", "cpuset.mems=0", "--cgroup", "cpuset.cpus=0-3",
		"--chroot-base-dir", "/srv/jailer",
		"--netns", "/var/run/netns/my_netns",
		"--resource-limit", "no-file=1024",
		"--new-pid-ns",
		"--", "--api-sock", "/api.sock", "--config-file", "/vm-config.json",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv\n got %q\nwant %q", got, want)
	}
}

func TestJailerArgvMinimal(t *testing.T) {
	got, err := JailerArgv(JailerOptions{Jailer: "/j", ExecFile: "/opt/fc/firecracker-v1.12", ID: "a", UID: 1, GID: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/j", "--id", "a", "--exec-file", "/opt/fc/firecracker-v1.12", "--uid", "1", "--gid", "1", "--cgroup-version", "2"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("argv\n got %q\nwant %q", got, want)
	}
}

func TestJailerArgvErrors(t *testing.T) {
	base := JailerOptions{Jailer: "/j", ExecFile: "/fc/firecracker", ID: "a", UID: 1, GID: 1}
	for _, tc := range []struct {
		name string
		mod  func(*JailerOptions)
		want string
	}{
		{"relative jailer", func(o *JailerOptions) { o.Jailer = "jailer" }, "jailer binary"},
		{"exec name", func(o *JailerOptions) { o.ExecFile = "/usr/bin/vmm" }, `contain "firecracker"`},
		{"id chars", func(o *JailerOptions) { o.ID = "a_b" }, `id "a_b"`},
		{"id length", func(o *JailerOptions) { o.ID = strings.Repeat("a", 65) }, "1 to 64"},
		{"root", func(o *JailerOptions) { o.UID = 0 }, "unprivileged"},
		{"base", func(o *JailerOptions) { o.ChrootBaseDir = "srv" }, "chroot base dir"},
		{"netns", func(o *JailerOptions) { o.NetNS = "ns" }, "netns"},
		{"cgroup v3", func(o *JailerOptions) { o.CgroupVersion = 3 }, "cgroup version 3"},
		{"parent ..", func(o *JailerOptions) { o.ParentCgroup = "../x" }, "parent cgroup"},
		{"cgroup kv", func(o *JailerOptions) { o.Cgroups = []string{"cpuset.cpus"} }, "<cgroup_file>=<value>"},
		{"rlimit kv", func(o *JailerOptions) { o.ResourceLimits = []string{"=1"} }, "<resource>=<value>"},
	} {
		o := base
		tc.mod(&o)
		_, err := JailerArgv(o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestJailLayout(t *testing.T) {
	j := JailOf(JailerOptions{ExecFile: "/usr/bin/firecracker", ID: "web-1"})
	for _, tc := range [][2]string{
		{j.Dir(), "/srv/jailer/firecracker/web-1"},
		{j.Root(), "/srv/jailer/firecracker/web-1/root"},
		{j.ExecPath(), "/srv/jailer/firecracker/web-1/root/firecracker"},
		{j.HostPath("/vmlinux"), "/srv/jailer/firecracker/web-1/root/vmlinux"},
		{j.HostPath("api.sock"), "/srv/jailer/firecracker/web-1/root/api.sock"},
		{j.HostPath("/../../etc/passwd"), "/srv/jailer/firecracker/web-1/root/etc/passwd"},
	} {
		if tc[0] != tc[1] {
			t.Errorf("got %s, want %s", tc[0], tc[1])
		}
	}
	j2 := JailOf(JailerOptions{ExecFile: "/opt/firecracker-v1.12", ID: "x", ChrootBaseDir: "/var/lib/kibotos/jails"})
	if got := j2.Root(); got != "/var/lib/kibotos/jails/firecracker-v1.12/x/root" {
		t.Errorf("root %s", got)
	}
	if err := (Jail{}).Remove(); err == nil {
		t.Error("Remove of an empty Jail did not refuse")
	}
}

func ino(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

func TestJailLinkAndCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(src, []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	j := Jail{Base: filepath.Join(dir, "jails"), ExecName: "firecracker", ID: "a"}
	if err := j.Link(src, "/disk.raw", false); err != nil {
		t.Fatal(err)
	}
	if ino(t, src) != ino(t, j.HostPath("/disk.raw")) {
		t.Error("Link did not hard-link")
	}
	if err := j.Link(src, "/disk.raw", false); err == nil {
		t.Error("Link over an existing file succeeded")
	}
	// EXDEV cannot be provoked on one filesystem; the copy it falls back to:
	dst := filepath.Join(dir, "copy")
	if err := copyFile(src, dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "disk" || ino(t, dst) == ino(t, src) {
		t.Errorf("copy: %q", b)
	}
	if err := j.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(j.Dir()); !os.IsNotExist(err) {
		t.Errorf("jail dir after Remove: %v", err)
	}
	if _, err := os.Stat(src); err != nil {
		t.Errorf("source after Remove: %v", err)
	}
}
