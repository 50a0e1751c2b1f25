package egress

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/posixacl"
)

// DefaultUser is the account the egress process runs as.
const DefaultUser = "kibotos-egress"

// account is the resolved egress account.
type account struct {
	name     string
	uid, gid int
	groups   []uint32 // its primary group and its others
}

// ensureAccount looks the egress account up and creates it when missing:
// a system account with its own group, no home and no login shell, as the
// VMM account is made. Another node creating it at the same time is fine:
// the lookup is repeated after a failed useradd.
func ensureAccount(ctx context.Context, name string) (account, error) {
	u, err := user.Lookup(name)
	if _, missing := err.(user.UnknownUserError); missing {
		out, aerr := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--comment", "kibotos egress", name).CombinedOutput()
		if u, err = user.Lookup(name); err != nil && aerr != nil {
			return account{}, fmt.Errorf("egress: account %s missing and useradd failed: %v: %s (install the Debian package passwd or create the account yourself)",
				name, aerr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		return account{}, fmt.Errorf("egress: account %s: %w", name, err)
	}
	a := account{name: name}
	a.uid, _ = strconv.Atoi(u.Uid)
	a.gid, _ = strconv.Atoi(u.Gid)
	a.groups = []uint32{uint32(a.gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil && g != uint64(a.gid) {
				a.groups = append(a.groups, uint32(g))
			}
		}
	}
	if a.uid == 0 || a.gid == 0 {
		return account{}, fmt.Errorf("egress: account %s has uid %d gid %d: it must not be root; set another egress user", name, a.uid, a.gid)
	}
	return a, nil
}

// prepareSocketDir makes dir the process's only writable directory:
// owned by the account, mode 0700 (the process refuses another). A
// directory left by an earlier node is corrected, a symlink or file is
// refused: the node would otherwise chown what it points to.
func (a account) prepareSocketDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("egress: socket directory %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("egress: socket directory %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("egress: socket directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("egress: socket directory %s is a %v, not a directory: remove it", dir, fi.Mode().Type())
	}
	if err := os.Lchown(dir, a.uid, a.gid); err != nil {
		return fmt.Errorf("egress: socket directory %s: give it to %s: %w", dir, a.name, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("egress: socket directory %s: %w", dir, err)
	}
	return nil
}

// checkReach says which directory keeps the account from path (a
// directory to enter or a file to execute: the same x bit), reading mode
// bits and POSIX ACLs as the kernel does: a node's storage root under
// /root gets an ACL entry for the VMM account only, which lets the egress
// account in no more than before. The node only checks, never grants:
// letting the account into a directory of the node's (such as the data
// directory) would also let it near the state it must never see.
func (a account) checkReach(path string) error {
	for d := filepath.Clean(path); ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("egress: %s: %w", d, err)
		}
		ok, acl, err := a.allowed(d, &st, posixacl.Execute)
		if err != nil {
			return fmt.Errorf("egress: %w", err)
		}
		if !ok {
			how := fmt.Sprintf("mode %#o, owner %d:%d", st.Mode&0o7777, st.Uid, st.Gid)
			if acl {
				how += ", an ACL without it"
			}
			what := "reach"
			if d == filepath.Clean(path) {
				what = "execute"
			}
			return fmt.Errorf("egress: account %s (uid %d) cannot %s %s: %s (%s) denies it; put it under a directory others can search, such as /run/kibotos or /usr/local/bin",
				a.name, a.uid, what, path, d, how)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// allowed says whether the account gets bit of the file st describes, by
// its ACL (acl true) or else its mode bits.
func (a account) allowed(path string, st *unix.Stat_t, bit uint16) (ok, acl bool, err error) {
	ents, err := posixacl.Get(path)
	if err != nil {
		return false, false, err
	}
	acl = ents != nil
	if !acl {
		ents = posixacl.FromMode(st.Mode)
	}
	return posixacl.Allows(ents, st.Uid, st.Gid, uint32(a.uid), a.groups, bit), acl, nil
}
