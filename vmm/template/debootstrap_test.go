package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

const deb822Host = `Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example.org/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://disabled.example.org/debian
Suites: bookworm
Enabled: no

Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian/
Suites: bookworm
 bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
`

const oneLineHost = `# deb cdrom:[Debian GNU/Linux 12]/ bookworm main
deb-src http://src.example.org/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://security.debian.org/debian-security bookworm-security main
deb [ arch=amd64 ] http://mirror.example.org/debian bookworm main contrib # the local mirror
deb http://other.example.org/debian trixie main
`

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMirrorFromSources(t *testing.T) {
	dir := t.TempDir()
	deb822 := writeFile(t, dir, "debian.sources", deb822Host)
	oneLine := writeFile(t, dir, "sources.list", oneLineHost)
	for _, c := range []struct {
		files []string
		suite string
		want  string
	}{
		{[]string{deb822}, "bookworm", "http://deb.debian.org/debian"},
		// Another suite: the archive that is not the security one.
		{[]string{deb822}, "trixie", "http://deb.debian.org/debian"},
		{[]string{oneLine}, "bookworm", "http://mirror.example.org/debian"},
		{[]string{oneLine}, "trixie", "http://other.example.org/debian"},
		{[]string{oneLine}, "sid", "http://mirror.example.org/debian"},
		// apt's order: sources.list first.
		{[]string{oneLine, deb822}, "bookworm", "http://mirror.example.org/debian"},
		{[]string{filepath.Join(dir, "missing.list"), deb822}, "bookworm", "http://deb.debian.org/debian"},
	} {
		got, err := MirrorFromFiles(c.files, c.suite)
		if err != nil || got != c.want {
			t.Errorf("MirrorFromFiles(%v, %s) = %q, %v; want %q", c.files, c.suite, got, err, c.want)
		}
	}
	onlySecurity := writeFile(t, dir, "security.sources", strings.SplitN(deb822Host, "\n\n", 2)[0]+"\n")
	if got, err := MirrorFromFiles([]string{onlySecurity, filepath.Join(dir, "none.list")}, "bookworm"); err == nil || !strings.Contains(err.Error(), "pass --mirror URL") {
		t.Fatalf("only a security archive: %q, %v; want an error naming --mirror", got, err)
	}
}

func TestHostMirrorReadsAptDirs(t *testing.T) {
	dir := t.TempDir()
	old1, old2 := aptSourcesList, aptSourcesDir
	t.Cleanup(func() { aptSourcesList, aptSourcesDir = old1, old2 })
	aptSourcesList, aptSourcesDir = filepath.Join(dir, "sources.list"), dir
	if _, err := HostMirror("bookworm"); err == nil {
		t.Fatal("no sources: want an error")
	}
	writeFile(t, dir, "debian.sources", deb822Host)
	if got, err := HostMirror("bookworm"); err != nil || got != "http://deb.debian.org/debian" {
		t.Fatalf("HostMirror = %q, %v", got, err)
	}
}

func TestDebootstrapOptionsValidate(t *testing.T) {
	o := DebootstrapOptions{Name: "kibotos-coding"}
	if err := o.Validate(); err != nil || o.Suite != "bookworm" || o.Variant != "minbase" {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	for _, c := range []struct {
		o    DebootstrapOptions
		want string
	}{
		{DebootstrapOptions{Name: "Bad Name"}, "not valid"},
		{DebootstrapOptions{Name: "x1", Suite: "Bookworm;rm"}, "suite"},
		{DebootstrapOptions{Name: "x1", Variant: "fakechroot"}, "minbase, buildd, standard"},
		{DebootstrapOptions{Name: "x1", Include: []string{"git", "--foo"}}, `"--foo" is not a Debian package`},
		{DebootstrapOptions{Name: "x1", Mirror: "ftp://example.org/debian"}, "not an http"},
		{DebootstrapOptions{Name: "x1", Mirror: "http:///debian"}, "no host"},
		{DebootstrapOptions{Name: "x1", SizeMiB: -1}, "negative"},
		{DebootstrapOptions{Name: "x1", User: DefaultUser{Name: "root"}}, `template x1: user name "root" is a system account`},
		{DebootstrapOptions{Name: "x1", User: DefaultUser{Name: "Bad.Name"}}, "is not valid"},
		{DebootstrapOptions{Name: "x1", User: DefaultUser{Sudo: true}}, "sudo is for the default user: name one (--user NAME)"},
	} {
		err := c.o.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v; want %q", c.o, err, c.want)
		}
		if _, berr := BuildDebootstrap(context.Background(), c.o); berr == nil || berr.Error() != err.Error() {
			t.Errorf("BuildDebootstrap(%+v) = %v; want the validation error first", c.o, berr)
		}
	}
	ok := DebootstrapOptions{Name: "x1", Include: []string{"git", "python3", "g++", "libc6-dev"}, Variant: "standard", Mirror: "file:///srv/mirror"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	// Sudo brings its package, once, without writing into the caller's
	// slice.
	include := make([]string, 1, 4)
	include[0] = "git"
	withSudo := DebootstrapOptions{Name: "x1", Include: include, User: DefaultUser{Name: "user", Sudo: true}}
	if err := withSudo.Validate(); err != nil || strings.Join(withSudo.Include, ",") != "git,sudo" || include[:2][1] != "" {
		t.Fatalf("--sudo: include %v, %v; caller's %v", withSudo.Include, err, include[:2])
	}
	if err := withSudo.Validate(); err != nil || strings.Join(withSudo.Include, ",") != "git,sudo" {
		t.Fatalf("validated twice: include %v, %v", withSudo.Include, err)
	}
}

func TestBuildDebootstrapMissingExecutable(t *testing.T) {
	_, err := BuildDebootstrap(context.Background(), DebootstrapOptions{StorageRoot: t.TempDir(), Name: "x1", Mirror: "http://deb.example.org/debian", Debootstrap: "/nonexistent/debootstrap"})
	if !errors.Is(err, ErrDebootstrapPrereq) || !strings.Contains(err.Error(), "install the Debian package debootstrap") {
		t.Fatalf("err %v; want a prerequisite error naming the package", err)
	}
}

func TestBuildDebootstrapFailureCleansUp(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "BuildDebootstrap needs root")
	}
	requireMkfs(t)
	root := t.TempDir()
	fake := filepath.Join(t.TempDir(), "debootstrap")
	writeFile(t, filepath.Dir(fake), "debootstrap", "#!/bin/sh\necho 'E: Failed getting release file http://deb.example.org/debian/dists/nope/Release' >&2\nexit 1\n")
	os.Chmod(fake, 0o755)
	_, err := BuildDebootstrap(context.Background(), DebootstrapOptions{StorageRoot: root, Name: "x1", Suite: "nope", Mirror: "http://deb.example.org/debian", Debootstrap: fake})
	if !errors.Is(err, ErrDebootstrapFailed) || !strings.Contains(err.Error(), "Failed getting release file") || !strings.Contains(err.Error(), "--mirror") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err %q; want one line with debootstrap's message and a hint", err)
	}
	if left, _ := filepath.Glob(filepath.Join(Dir(root), ".debootstrap-*")); len(left) != 0 {
		t.Fatalf("build tree left behind: %v", left)
	}
}

func TestFitDebianTree(t *testing.T) {
	tree := t.TempDir()
	for _, d := range []string{"etc", "bin", "tmp", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		os.MkdirAll(filepath.Join(tree, d), 0o755)
	}
	writeFile(t, tree, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
	writeFile(t, tree, "bin/bash", "")
	writeFile(t, tree, "etc/machine-id", "0123\n")
	os.Symlink("/etc/resolv.conf", filepath.Join(tree, "etc/resolv.conf"))
	writeFile(t, tree, "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease", "x")
	writeFile(t, tree, "var/cache/apt/archives/bash_5.2_amd64.deb", "x")
	if err := FitDebianTree(tree); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string { b, _ := os.ReadFile(filepath.Join(tree, p)); return string(b) }
	if got := read("etc/passwd"); !strings.HasPrefix(got, "root:x:0:0:root:/root:/bin/bash\ndaemon:") {
		t.Errorf("passwd %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(tree, "etc/resolv.conf")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("resolv.conf: %v %v; want an empty regular file", fi, err)
	}
	if !strings.Contains(read("etc/hosts"), "localhost") || read("etc/hostname") == "" || !strings.Contains(read("usr/sbin/policy-rc.d"), "exit 101") {
		t.Errorf("hosts %q hostname %q policy-rc.d %q", read("etc/hosts"), read("etc/hostname"), read("usr/sbin/policy-rc.d"))
	}
	for _, gone := range []string{"etc/machine-id", "var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease", "var/cache/apt/archives/bash_5.2_amd64.deb"} {
		if _, err := os.Lstat(filepath.Join(tree, gone)); err == nil {
			t.Errorf("%s still there", gone)
		}
	}
	for _, kept := range []string{"var/lib/apt/lists/partial", "var/cache/apt/archives/partial"} {
		if fi, err := os.Stat(filepath.Join(tree, kept)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v", kept, err)
		}
	}
	if fi, _ := os.Stat(filepath.Join(tree, "tmp")); fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("tmp mode %v; want 1777", fi.Mode())
	}
}

// TestBuildDebootstrapBookworm runs the real debootstrap (minbase, bookworm,
// the host's apt mirror) with the E2B-style default user "user" and sudo:
// about 30-40 s here, most of it downloading ~40 MB (sudo adds ~2 MB).
// scripts/install-deps.sh installs debootstrap, so it missing is a failure.
func TestBuildDebootstrapBookworm(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the debootstrap build takes about 40 s")
	}
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "debootstrap needs root")
	}
	requireMkfs(t)
	if _, err := exec.LookPath("debootstrap"); err != nil {
		t.Fatal("debootstrap missing: install the Debian package debootstrap (scripts/install-deps.sh)")
	}
	root := t.TempDir()
	start := time.Now()
	tp, err := BuildDebootstrap(context.Background(), DebootstrapOptions{StorageRoot: root, Name: "kibotos-coding", User: DefaultUser{Name: "user", Sudo: true}})
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	if fi, err := os.Stat(tp.Image()); err == nil {
		used = fi.Sys().(*syscall.Stat_t).Blocks * 512
	}
	t.Logf("built %s in %s: %d files, %d MiB of content, image %d MiB (%d MiB allocated: sparse)", tp.ID[:19], time.Since(start).Round(time.Second), tp.Files, tp.ContentBytes>>20, tp.ImageBytes>>20, used>>20)
	if tp.ImageBytes < DebianMinSizeMiB<<20 || !strings.HasPrefix(tp.Source, "debootstrap:bookworm/minbase+sudo user=user,sudo ") {
		t.Fatalf("template %+v", tp)
	}
	if left, _ := filepath.Glob(filepath.Join(Dir(root), ".debootstrap-*")); len(left) != 0 {
		t.Fatalf("build tree left behind: %v", left)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/resolv.conf"); got != "" {
		t.Fatalf("resolv.conf %q; want empty", got)
	}
	// A regular file, for the node to bind-mount the guest agent's over.
	if out, err := exec.Command("debugfs", "-R", "stat /etc/resolv.conf", tp.Image()).Output(); err != nil || !strings.Contains(string(out), "Type: regular") {
		t.Fatalf("resolv.conf in the image: %v %q; want a regular file", err, out)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/hosts"); !strings.Contains(got, "localhost") {
		t.Fatalf("hosts %q; want localhost", got)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/nsswitch.conf"); !regexp.MustCompile(`(?m)^hosts:\s+files\b.*\bdns\b`).MatchString(got) {
		t.Fatalf("nsswitch.conf %q; want hosts from files, then dns", got)
	}
	if got := debugfsCat(t, tp.Image(), "/etc/passwd"); !strings.HasPrefix(got, "root:x:0:0:root:/root:/bin/bash\n") {
		t.Fatalf("passwd %q", got)
	}
	checkDefaultUserImage(t, tp.Image())
	// The guest agent execs commands chrooted in the tree: check that bash,
	// apt and coreutils run there, from the image mounted read-only.
	mnt := t.TempDir()
	if b, err := exec.Command("mount", "-o", "loop,ro", tp.Image(), mnt).CombinedOutput(); err != nil {
		t.Logf("loop mount unavailable (%v: %s): checked with debugfs only", err, strings.TrimSpace(string(b)))
		return
	}
	defer exec.Command("umount", mnt).Run()
	out, err := exec.Command("chroot", mnt, "/bin/bash", "-c", "apt --version; cat /etc/os-release; ls /var/lib/apt/lists; id -un; /bin/sh -c 'echo sh-ok'").CombinedOutput()
	if err != nil {
		t.Fatalf("chroot: %v: %s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "apt 2.") || !strings.Contains(s, "VERSION_CODENAME=bookworm") || !strings.Contains(s, "root\nsh-ok") || strings.Contains(s, "_Packages") {
		t.Fatalf("chroot output:\n%s", s)
	}
	// As the default user, sudo runs a command as root without asking
	// for a password. (Before it, sudo warns "unable to resolve host"
	// when the tree's /etc/hosts lacks the hostname, as it lacks this
	// host's.)
	out, err = exec.Command("chroot", "--userspec=1000:1000", mnt, "/usr/bin/sudo", "-n", "/usr/bin/id", "-un").CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "root\n") {
		t.Fatalf("sudo as user: %v: %s", err, out)
	}
}

// checkDefaultUserImage reads the account of the default user "user"
// with sudo out of a built image, as the guest agent will find it.
func checkDefaultUserImage(t *testing.T, img string) {
	t.Helper()
	if got := debugfsCat(t, img, "/etc/passwd"); !strings.Contains(got, "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
		t.Fatalf("passwd %q; want user with uid 1000", got)
	}
	if got := debugfsCat(t, img, "/etc/group"); !regexp.MustCompile(`(?m)^sudo:x:27:user$`).MatchString(got) || !strings.Contains(got, "\nuser:x:1000:\n") {
		t.Fatalf("group %q; want user in sudo and its own group", got)
	}
	if got := debugfsCat(t, img, "/etc/shadow"); !strings.Contains(got, "\nuser:!:") {
		t.Fatalf("shadow %q; want a locked password for user", got)
	}
	if got := debugfsCat(t, img, "/etc/sudoers.d/user"); got != "user ALL=(ALL:ALL) NOPASSWD:ALL\n" {
		t.Fatalf("sudoers.d/user %q", got)
	}
	if got := debugfsCat(t, img, guestproto.ImageConfigPath); !strings.Contains(got, `"user": "user"`) || !strings.Contains(got, `"working_dir": "/home/user"`) {
		t.Fatalf("image config %q", got)
	}
	for _, c := range []struct{ path, want string }{
		{"/home/user", `Mode:\s+0750\b(?s:.*)User:\s+1000\s+Group:\s+1000\b`},
		{"/etc/sudoers.d/user", `Mode:\s+0440\b(?s:.*)User:\s+0\s+Group:\s+0\b`},
		// mkfs.ext4 -d kept the set-uid bit sudo needs.
		{"/usr/bin/sudo", `Mode:\s+04755\b`},
	} {
		out, err := exec.Command("debugfs", "-R", "stat "+c.path, img).Output()
		if err != nil || !regexp.MustCompile(c.want).Match(out) {
			t.Fatalf("stat %s in the image: %v\n%s\nwant %s", c.path, err, out, c.want)
		}
	}
}
