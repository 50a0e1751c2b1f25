package template

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// debianTree is a small root with the account files of a debootstrapped
// Debian (the shadow files root:shadow 0640), /etc/skel, bash behind the
// merged-/usr /bin link and sudo's /etc/sudoers.
func debianTree(t *testing.T) string {
	t.Helper()
	tree := t.TempDir()
	for _, d := range []string{"etc/skel/.config", "etc/sudoers.d", "usr/bin", "home"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("usr/bin", filepath.Join(tree, "bin"))
	writeFile(t, tree, "usr/bin/bash", "")
	writeFile(t, tree, "etc/passwd", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	writeFile(t, tree, "etc/group", "root:x:0:\ndaemon:x:1:\nshadow:x:42:\nsudo:x:27:\nusers:x:100:\nnogroup:x:65534:\n")
	writeFile(t, tree, "etc/shadow", "root:*:19500:0:99999:7:::\ndaemon:*:19500:0:99999:7:::\n")
	writeFile(t, tree, "etc/gshadow", "root:*::\nshadow:*::\nsudo:*::\n")
	for _, f := range []string{"etc/shadow", "etc/gshadow"} {
		os.Chown(filepath.Join(tree, f), 0, 42)
		os.Chmod(filepath.Join(tree, f), 0o640)
	}
	writeFile(t, tree, "etc/skel/.bashrc", "# ~/.bashrc\n")
	writeFile(t, tree, "etc/skel/.config/app.conf", "x=1\n")
	os.Chmod(filepath.Join(tree, "etc/skel/.config/app.conf"), 0o600)
	os.Symlink(".bashrc", filepath.Join(tree, "etc/skel/.rc"))
	// A skeleton link to the host's files is copied as a link, never
	// followed.
	os.Symlink("/etc/passwd", filepath.Join(tree, "etc/skel/passwd-link"))
	writeFile(t, tree, "etc/sudoers", "Defaults\tsecure_path=\"/usr/sbin:/usr/bin:/sbin:/bin\"\nroot\tALL=(ALL:ALL) ALL\n%sudo\tALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n")
	return tree
}

func readTree(t *testing.T, tree, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tree, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// owner is the mode and uid:gid of name in tree, not following a link.
func owner(t *testing.T, tree, name string) (os.FileMode, uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(filepath.Join(tree, name))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return fi.Mode(), st.Uid, st.Gid
}

func TestAddDefaultUserWithSudo(t *testing.T) {
	testenv.RequireRoot(t, "to give the home to uid 1000")
	tree := debianTree(t)
	if err := AddDefaultUser(tree, DefaultUser{Name: "user", Sudo: true}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{"etc/passwd", "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nuser:x:1000:1000::/home/user:/bin/bash\n"},
		{"etc/group", "sudo:x:27:user\nusers:x:100:\nnogroup:x:65534:\nuser:x:1000:\n"},
		{"etc/shadow", "daemon:*:19500:0:99999:7:::\nuser:!::0:99999:7:::\n"},
		{"etc/gshadow", "shadow:*::\nsudo:*::user\nuser:!::\n"},
	} {
		if got := readTree(t, tree, c.file); !strings.HasSuffix(got, c.want) {
			t.Errorf("%s:\n%s\nwant it to end with:\n%s", c.file, got, c.want)
		}
	}
	for _, f := range []string{"etc/shadow", "etc/gshadow"} {
		if mode, uid, gid := owner(t, tree, f); mode != 0o640 || uid != 0 || gid != 42 {
			t.Errorf("%s: %v %d:%d; want root:shadow 0640 kept", f, mode, uid, gid)
		}
	}
	for _, c := range []struct {
		name string
		mode os.FileMode
	}{
		{"home/user", os.ModeDir | 0o750},
		{"home/user/.bashrc", 0o644},
		{"home/user/.config", os.ModeDir | 0o755},
		{"home/user/.config/app.conf", 0o600},
		{"home/user/.rc", os.ModeSymlink | 0o777},
		{"home/user/passwd-link", os.ModeSymlink | 0o777},
	} {
		if mode, uid, gid := owner(t, tree, c.name); mode != c.mode || uid != 1000 || gid != 1000 {
			t.Errorf("%s: %v %d:%d; want %v 1000:1000", c.name, mode, uid, gid, c.mode)
		}
	}
	if got, _ := os.Readlink(filepath.Join(tree, "home/user/passwd-link")); got != "/etc/passwd" {
		t.Errorf("passwd-link -> %q; want the skeleton's link copied as it is", got)
	}
	if got := readTree(t, tree, "home/user/.config/app.conf"); got != "x=1\n" {
		t.Errorf("app.conf %q", got)
	}
	if got := readTree(t, tree, "etc/sudoers.d/user"); got != "user ALL=(ALL:ALL) NOPASSWD:ALL\n" {
		t.Errorf("sudoers.d/user %q", got)
	}
	if mode, uid, gid := owner(t, tree, "etc/sudoers.d/user"); mode != 0o440 || uid != 0 || gid != 0 {
		t.Errorf("sudoers.d/user: %v %d:%d; want root 0440 (sudo ignores a file others may write)", mode, uid, gid)
	}
	var ic guestproto.ImageConfig
	if err := json.Unmarshal([]byte(readTree(t, tree, guestproto.ImageConfigPath)), &ic); err != nil {
		t.Fatal(err)
	}
	want := guestproto.ImageConfig{
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games", "HOME=/home/user", "USER=user", "LANG=C.UTF-8"},
		WorkingDir: "/home/user",
		User:       "user",
	}
	if !reflect.DeepEqual(ic, want) {
		t.Errorf("image config %+v; want %+v", ic, want)
	}
	if mode, uid, _ := owner(t, tree, guestproto.ImageConfigPath); mode != 0o644 || uid != 0 {
		t.Errorf("image config: %v uid %d; want root 0644", mode, uid)
	}
}

// Without sudo: no sudo membership, no sudoers file; a tree without bash
// gets /bin/sh, one without gshadow none, one without a skeleton an empty
// home.
func TestAddDefaultUserPlain(t *testing.T) {
	testenv.RequireRoot(t, "to give the home to uid 1000")
	tree := debianTree(t)
	for _, p := range []string{"usr/bin/bash", "etc/gshadow", "etc/skel", "home"} {
		os.RemoveAll(filepath.Join(tree, p))
	}
	if err := AddDefaultUser(tree, DefaultUser{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, tree, "etc/passwd"); !strings.HasSuffix(got, "\ndev:x:1000:1000::/home/dev:/bin/sh\n") {
		t.Errorf("passwd %q", got)
	}
	if got := readTree(t, tree, "etc/group"); !strings.Contains(got, "\nsudo:x:27:\n") || !strings.HasSuffix(got, "\ndev:x:1000:\n") {
		t.Errorf("group %q", got)
	}
	for _, absent := range []string{"etc/gshadow", "etc/sudoers.d/dev"} {
		if _, err := os.Lstat(filepath.Join(tree, absent)); err == nil {
			t.Errorf("%s written", absent)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(tree, "home/dev")); err != nil || len(entries) != 0 {
		t.Errorf("home/dev: %v %v; want an empty directory", entries, err)
	}
	if !strings.Contains(readTree(t, tree, guestproto.ImageConfigPath), `"user": "dev"`) {
		t.Errorf("image config %s", readTree(t, tree, guestproto.ImageConfigPath))
	}
}

// A refused user leaves the tree as it was, and the error says what is
// wrong on one line.
func TestAddDefaultUserRefusals(t *testing.T) {
	for _, c := range []struct {
		name  string
		u     DefaultUser
		setup func(tree string)
		want  string
	}{
		{"uid taken", DefaultUser{Name: "user"}, func(tree string) {
			appendTo(t, tree, "etc/passwd", "alice:x:1000:1000::/home/alice:/bin/bash\n")
		}, "uid 1000 is taken by alice in the tree's /etc/passwd"},
		{"gid taken", DefaultUser{Name: "user"}, func(tree string) { appendTo(t, tree, "etc/group", "devs:x:1000:\n") }, "gid 1000 is taken by devs in the tree's /etc/group"},
		{"name taken", DefaultUser{Name: "user"}, func(tree string) {
			appendTo(t, tree, "etc/passwd", "user:x:1001:1001::/home/user:/bin/bash\n")
		}, "the tree's /etc/passwd already has user"},
		{"group name taken", DefaultUser{Name: "user"}, func(tree string) { appendTo(t, tree, "etc/group", "user:x:1001:\n") }, "the tree's /etc/group already has user"},
		{"home there", DefaultUser{Name: "user"}, func(tree string) { os.MkdirAll(filepath.Join(tree, "home/user"), 0o755) }, "already has /home/user"},
		{"root", DefaultUser{Name: "root"}, nil, `"root" is a system account`},
		{"system account", DefaultUser{Name: "daemon"}, nil, `"daemon" is a system account`},
		{"system group", DefaultUser{Name: "sudo"}, nil, `"sudo" is a system account or group`},
		{"upper case", DefaultUser{Name: "User"}, nil, `user name "User" is not valid`},
		{"dot", DefaultUser{Name: "a.b"}, nil, "is not valid"},
		{"digit first", DefaultUser{Name: "1user"}, nil, "is not valid"},
		{"too long", DefaultUser{Name: strings.Repeat("u", 33)}, nil, "is not valid"},
		{"empty", DefaultUser{}, nil, "is not valid"},
		{"no sudo package", DefaultUser{Name: "user", Sudo: true}, func(tree string) { os.Remove(filepath.Join(tree, "etc/sudoers")) }, "the tree has no /etc/sudoers: install the package sudo"},
		{"sudoers without sudoers.d", DefaultUser{Name: "user", Sudo: true}, func(tree string) {
			writeFile(t, tree, "etc/sudoers", "root ALL=(ALL:ALL) ALL\n")
		}, "does not read /etc/sudoers.d"},
		{"no passwd", DefaultUser{Name: "user"}, func(tree string) { os.Remove(filepath.Join(tree, "etc/passwd")) }, "the tree has no /etc/passwd"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tree := debianTree(t)
			if c.setup != nil {
				c.setup(tree)
			}
			before := testenv.TreeDigest(t, tree)
			err := AddDefaultUser(tree, c.u)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("AddDefaultUser(%+v) = %v; want one line saying %q", c.u, err, c.want)
			}
			if testenv.TreeDigest(t, tree) != before {
				t.Fatal("the tree changed")
			}
		})
	}
}

// A home directory behind a link out of the tree is refused, and nothing
// is written where the link points.
func TestAddDefaultUserStaysInTree(t *testing.T) {
	testenv.RequireRoot(t, "to give the home to uid 1000")
	tree, outside := debianTree(t), t.TempDir()
	os.Remove(filepath.Join(tree, "home"))
	os.Symlink(outside, filepath.Join(tree, "home"))
	if err := AddDefaultUser(tree, DefaultUser{Name: "user"}); err == nil || !strings.Contains(err.Error(), "user user: make its home /home/user: ") {
		t.Fatalf("home linked out of the tree: %v; want an error naming the home", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written outside the tree: %v", entries)
	}
}

func appendTo(t *testing.T, tree, name, line string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(tree, name), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line); err != nil {
		t.Fatal(err)
	}
}
