package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// DefaultUser is the account every exec of a template's Workspaces runs
// as instead of root, as E2B's templates run their SDK's commands as
// "user". The zero value adds none.
type DefaultUser struct {
	// Name of the account, its group and its home /home/Name.
	Name string
	// Sudo lets the account run anything as root without a password (the
	// group sudo and a sudoers.d entry); the tree needs the package sudo.
	Sudo bool
}

// DefaultUserID is the uid and gid of the default user: the first one
// Debian's adduser gives, which E2B's templates and most images' "first
// user" have, so files written by one keep their owner in the other.
const DefaultUserID = 1000

// userPath is what login gives a user that is not root on Debian
// (login.defs ENV_PATH, /etc/profile); sudo's secure_path gives root's.
const userPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"

var userNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// debianAccounts are the users and groups of Debian's base-passwd, in
// every debootstrapped tree: refused before a build rather than after
// it. The tree's own files are what AddDefaultUser checks.
var debianAccounts = strings.Fields(`root daemon bin sys sync games man lp mail news uucp proxy www-data
	backup list irc _apt nobody adm tty disk kmem dialout fax voice cdrom floppy tape sudo audio dip
	operator src shadow utmp video sasl plugdev staff users nogroup`)

// CheckUserName refuses a name that cannot be the default user: not a
// portable user name (sudo ignores sudoers.d files named with a dot), or
// one of the system accounts of a Debian tree.
func CheckUserName(name string) error {
	if !userNameRE.MatchString(name) {
		return fmt.Errorf("user name %q is not valid: use 1-32 lower-case letters, digits, '_' or '-', not starting with a digit or '-'", name)
	}
	if slices.Contains(debianAccounts, name) {
		return fmt.Errorf("user name %q is a system account or group of Debian: choose another name, such as user", name)
	}
	return nil
}

// AddDefaultUser gives the root filesystem tree the account u with uid
// and gid DefaultUserID, a home from /etc/skel and a locked password,
// and writes guestproto.ImageConfigPath so that the guest agent runs
// every exec as u in its home. It edits the files itself, never running
// useradd or chroot: the host's tools may not match the tree's. Every
// path resolves inside the tree (os.Root), so a symbolic link in it never
// leads a write to the host's files. It refuses a tree where the name or
// the id is taken, and changes nothing then.
func AddDefaultUser(tree string, u DefaultUser) error {
	if err := CheckUserName(u.Name); err != nil {
		return err
	}
	r, err := os.OpenRoot(tree)
	if err != nil {
		return err
	}
	defer r.Close()
	a, err := readAccounts(r, u)
	if err != nil {
		return err
	}
	shell := treeShell(tree)
	home := "/home/" + u.Name
	id := strconv.Itoa(DefaultUserID)
	a.passwd = append(a.passwd, u.Name+":x:"+id+":"+id+"::"+home+":"+shell)
	a.group = append(a.group, u.Name+":x:"+id+":")
	// An empty last-change day: no password ageing, and the tree does not
	// depend on the day it was built.
	a.shadow = append(a.shadow, u.Name+":!::0:99999:7:::")
	if a.gshadow != nil {
		a.gshadow = append(a.gshadow, u.Name+":!::")
	}
	if u.Sudo {
		a.group = addMember(a.group, 4, "sudo", u.Name)
		a.gshadow = addMember(a.gshadow, 4, "sudo", u.Name)
	}
	if err := a.write(r); err != nil {
		return fmt.Errorf("user %s: %w", u.Name, err)
	}
	if err := makeHome(r, strings.TrimPrefix(home, "/")); err != nil {
		return fmt.Errorf("user %s: make its home %s: %w", u.Name, home, err)
	}
	if u.Sudo {
		if err := writeOwned(r, "etc/sudoers.d/"+u.Name, []byte(u.Name+" ALL=(ALL:ALL) NOPASSWD:ALL\n"), 0o440, 0); err != nil {
			return fmt.Errorf("user %s: %w", u.Name, err)
		}
	}
	ic := guestproto.ImageConfig{
		Env:        []string{"PATH=" + userPath, "HOME=" + home, "USER=" + u.Name, "LANG=C.UTF-8"},
		WorkingDir: home,
		User:       u.Name,
	}
	raw, _ := json.MarshalIndent(ic, "", "  ")
	if err := writeOwned(r, strings.TrimPrefix(guestproto.ImageConfigPath, "/"), append(raw, '\n'), 0o644, 0); err != nil {
		return fmt.Errorf("user %s: the exec defaults: %w", u.Name, err)
	}
	return nil
}

// accounts are the lines of a tree's account files; gshadow is nil when
// the tree has none.
type accounts struct {
	passwd, group, shadow, gshadow []string
}

// readAccounts reads the tree's account files and checks that u fits:
// the name and the id free, and for Sudo the group sudo and a sudoers
// that reads sudoers.d.
func readAccounts(r *os.Root, u DefaultUser) (accounts, error) {
	var a accounts
	for _, f := range []struct {
		name     string
		lines    *[]string
		optional bool
	}{{"etc/passwd", &a.passwd, false}, {"etc/group", &a.group, false}, {"etc/shadow", &a.shadow, false}, {"etc/gshadow", &a.gshadow, true}} {
		b, err := readRegular(r, f.name)
		if f.optional && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return a, fmt.Errorf("user %s: %w: is the tree a Debian root?", u.Name, err)
		}
		*f.lines = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(b) == 0 {
			*f.lines = []string{}
		}
	}
	id := strconv.Itoa(DefaultUserID)
	for _, c := range []struct {
		file  string
		lines []string
		what  string
	}{{"/etc/passwd", a.passwd, "uid"}, {"/etc/group", a.group, "gid"}} {
		for _, l := range c.lines {
			f := strings.Split(l, ":")
			if len(f) < 3 {
				continue
			}
			if f[0] == u.Name {
				return a, fmt.Errorf("user %s: the tree's %s already has %s: choose another name", u.Name, c.file, u.Name)
			}
			if f[2] == id {
				return a, fmt.Errorf("user %s: %s %s is taken by %s in the tree's %s: the default user needs %s %s", u.Name, c.what, id, f[0], c.file, c.what, id)
			}
		}
	}
	for _, l := range a.shadow {
		if name, _, _ := strings.Cut(l, ":"); name == u.Name {
			return a, fmt.Errorf("user %s: the tree's /etc/shadow already has %s: choose another name", u.Name, u.Name)
		}
	}
	if _, err := r.Lstat("home/" + u.Name); err == nil {
		return a, fmt.Errorf("user %s: the tree already has /home/%s: choose another name or remove it", u.Name, u.Name)
	}
	if !u.Sudo {
		return a, nil
	}
	if !slices.ContainsFunc(a.group, func(l string) bool { return strings.HasPrefix(l, "sudo:") }) {
		return a, fmt.Errorf("user %s with sudo: the tree's /etc/group has no group sudo: install the package sudo in the tree", u.Name)
	}
	sudoers, err := readRegular(r, "etc/sudoers")
	if err != nil {
		return a, fmt.Errorf("user %s with sudo: %w: install the package sudo in the tree", u.Name, err)
	}
	if !strings.Contains(string(sudoers), "includedir /etc/sudoers.d") {
		return a, fmt.Errorf("user %s: the tree's /etc/sudoers does not read /etc/sudoers.d: add @includedir /etc/sudoers.d to it", u.Name)
	}
	return a, nil
}

// readRegular reads the regular file name in r; a symbolic link or any
// other type there is an error naming it.
func readRegular(r *os.Root, name string) ([]byte, error) {
	fi, err := r.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, missingFile(name)
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("/%s is a %v, not a regular file", name, fi.Mode().Type())
	}
	return r.ReadFile(name)
}

// missingFile is a file the tree lacks, for errors.Is(fs.ErrNotExist).
type missingFile string

func (m missingFile) Error() string      { return "the tree has no /" + string(m) }
func (missingFile) Is(target error) bool { return target == fs.ErrNotExist }

// write rewrites the account files in place, so each keeps its owner and
// mode (root:shadow 0640 for the shadow files).
func (a accounts) write(r *os.Root) error {
	for _, f := range []struct {
		name  string
		lines []string
	}{{"etc/passwd", a.passwd}, {"etc/group", a.group}, {"etc/shadow", a.shadow}, {"etc/gshadow", a.gshadow}} {
		if f.lines == nil {
			continue
		}
		w, err := r.OpenFile(f.name, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return err
		}
		_, err = w.WriteString(strings.Join(f.lines, "\n") + "\n")
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write /%s: %w", f.name, err)
		}
	}
	return nil
}

// addMember adds user to the member list (the last of fields fields) of
// the line of group.
func addMember(lines []string, fields int, group, user string) []string {
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) != fields || f[0] != group {
			continue
		}
		members := f[fields-1]
		if members != "" {
			if slices.Contains(strings.Split(members, ","), user) {
				return lines
			}
			members += ","
		}
		f[fields-1] = members + user
		lines[i] = strings.Join(f, ":")
	}
	return lines
}

// makeHome makes the home directory home (owned by the default user,
// 0750: other accounts do not read it) with a copy of /etc/skel in it.
func makeHome(r *os.Root, home string) error {
	if err := r.MkdirAll(path.Dir(home), 0o755); err != nil {
		return err
	}
	if err := mkdirOwned(r, home, 0o750); err != nil {
		return err
	}
	fi, err := r.Lstat("etc/skel")
	if err != nil || !fi.IsDir() {
		return nil // no skeleton: an empty home, as adduser makes
	}
	return fs.WalkDir(r.FS(), "etc/skel", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "etc/skel" {
			return err
		}
		dst := path.Join(home, strings.TrimPrefix(p, "etc/skel/"))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return mkdirOwned(r, dst, info.Mode().Perm())
		case d.Type()&fs.ModeSymlink != 0:
			target, err := r.Readlink(p)
			if err != nil {
				return err
			}
			if err := r.Symlink(target, dst); err != nil {
				return err
			}
			return r.Lchown(dst, DefaultUserID, DefaultUserID)
		case info.Mode().IsRegular():
			b, err := r.ReadFile(p)
			if err != nil {
				return err
			}
			return writeOwned(r, dst, b, info.Mode().Perm(), DefaultUserID)
		}
		return nil // no device nodes or FIFOs belong in a skeleton
	})
}

func mkdirOwned(r *os.Root, name string, mode os.FileMode) error {
	if err := r.Mkdir(name, mode); err != nil {
		return err
	}
	if err := r.Chown(name, DefaultUserID, DefaultUserID); err != nil {
		return err
	}
	return r.Chmod(name, mode) // Mkdir's mode went through the umask
}

// writeOwned writes a new file name (its directory made 0755 when
// missing) owned by id:id with mode, set after the owner and the umask.
func writeOwned(r *os.Root, name string, content []byte, mode os.FileMode, id int) error {
	if err := r.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(content)
	if err == nil {
		err = f.Chown(id, id)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write /%s: %w", name, err)
	}
	return nil
}
