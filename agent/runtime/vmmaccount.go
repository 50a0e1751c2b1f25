package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/posixacl"
)

// DefaultVMMUser is the account QEMU runs as. All VMMs of a host share it:
// what isolates one guest's files from another's is that each VMM only
// opens the paths on its own command line, under QEMU's seccomp sandbox.
const DefaultVMMUser = "kibotos-vmm"

// KVMGroup opens /dev/kvm; the VMM account has it as a supplementary group
// (SupplementaryGroups= on the unit, not in /etc/group).
const KVMGroup = "kvm"

// vmmAccount is the resolved VMM account.
type vmmAccount struct {
	name     string
	uid, gid int // gid: the account's own group, which owns the files it may open
	kvmGID   int
}

// ensureVMMAccount looks the VMM account up and creates it (a system
// account with its own group, no home, no shell) and the kvm group when
// missing, with the shadow tools. Another process creating the same account
// at the same time is fine: the lookup is repeated after a failed add.
func ensureVMMAccount(ctx context.Context, name string) (vmmAccount, error) {
	kvm, err := ensureGroup(ctx, KVMGroup)
	if err != nil {
		return vmmAccount{}, err
	}
	u, err := user.Lookup(name)
	if _, missing := err.(user.UnknownUserError); missing {
		out, aerr := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", "--comment", "kibotos VMM", name).CombinedOutput()
		if u, err = user.Lookup(name); err != nil && aerr != nil {
			return vmmAccount{}, fmt.Errorf("runtime: VMM account %s missing and useradd failed: %v: %s (install the Debian package passwd or create the account yourself)",
				name, aerr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		return vmmAccount{}, fmt.Errorf("runtime: VMM account %s: %w", name, err)
	}
	a := vmmAccount{name: name, kvmGID: kvm}
	a.uid, _ = strconv.Atoi(u.Uid)
	a.gid, _ = strconv.Atoi(u.Gid)
	if a.uid == 0 || a.gid == 0 {
		return vmmAccount{}, fmt.Errorf("runtime: VMM account %s has uid %d gid %d: it must not be root; set another VMM user", name, a.uid, a.gid)
	}
	return a, nil
}

func ensureGroup(ctx context.Context, name string) (int, error) {
	g, err := user.LookupGroup(name)
	if _, missing := err.(user.UnknownGroupError); missing {
		out, aerr := exec.CommandContext(ctx, "groupadd", "--system", name).CombinedOutput()
		if g, err = user.LookupGroup(name); err != nil && aerr != nil {
			return 0, fmt.Errorf("runtime: group %s missing and groupadd failed: %v: %s", name, aerr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		return 0, fmt.Errorf("runtime: group %s: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}

// grantFile makes path openable by root and the VMM account only:
// root:<vmm group>, mode (0640 to read, 0660 to write, 0620 to append a
// log the VMM must not read back), and every directory above it searchable
// by the account.
func (a vmmAccount) grantFile(path string, mode os.FileMode) error {
	if err := os.Lchown(path, 0, a.gid); err != nil {
		return fmt.Errorf("give VMM account %s access to %s: %w", a.name, path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("give VMM account %s access to %s: %w", a.name, path, err)
	}
	return a.grantSearch(filepath.Dir(path))
}

// grantDir is grantFile for a directory the node made for the VMM.
func (a vmmAccount) grantDir(dir string, mode os.FileMode) error {
	return a.grantFile(dir, mode|os.ModeDir)
}

// grantSearch lets the VMM account search (not list) dir and every
// directory above it. A directory that denies it gets a POSIX ACL entry
// user:<vmm>:--x, which changes nothing for anyone else (unlike o+x): the
// storage root may live under /root or a 0700 temp directory.
func (a vmmAccount) grantSearch(dir string) error {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("let VMM account %s search %s: %w", a.name, d, err)
		}
		if !a.searchableByMode(&st) {
			if err := addSearchACL(d, a.uid, st.Mode); err != nil {
				return fmt.Errorf("let VMM account %s search %s (mode %#o, owner %d:%d): %w; mount the file system with ACL support or chmod o+x %s",
					a.name, d, st.Mode&0o7777, st.Uid, st.Gid, err, d)
			}
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

func (a vmmAccount) searchableByMode(st *unix.Stat_t) bool {
	switch {
	case int(st.Uid) == a.uid:
		return st.Mode&0o100 != 0
	case int(st.Gid) == a.gid || int(st.Gid) == a.kvmGID:
		return st.Mode&0o010 != 0
	}
	return st.Mode&0o001 != 0
}

// addSearchACL adds user:<uid>:x to dir's access ACL (made from the mode
// bits when it has none) and x to its mask, so the entry is effective. It
// writes nothing when the entry is there already.
func addSearchACL(dir string, uid int, mode uint32) error {
	ents, err := posixacl.Get(dir)
	if err != nil {
		return err
	}
	if ents == nil {
		ents = posixacl.FromMode(mode)
	}
	changed, found, groupClass := false, false, uint16(0)
	for i := range ents {
		e := &ents[i]
		if e.Tag == posixacl.User && e.ID == uint32(uid) {
			found = true
			if e.Perm&posixacl.Execute == 0 {
				e.Perm |= posixacl.Execute
				changed = true
			}
		}
		if e.Tag == posixacl.User || e.Tag == posixacl.Group || e.Tag == posixacl.GroupObj {
			groupClass |= e.Perm
		}
	}
	if !found {
		ents = append(ents, posixacl.Entry{Tag: posixacl.User, Perm: posixacl.Execute, ID: uint32(uid)})
		groupClass |= posixacl.Execute
		changed = true
	}
	hasMask := false
	for i := range ents {
		if e := &ents[i]; e.Tag == posixacl.Mask {
			hasMask = true
			if e.Perm&posixacl.Execute == 0 {
				e.Perm |= posixacl.Execute
				changed = true
			}
		}
	}
	if !hasMask {
		// The mask of a new ACL is the union of the group class, so no
		// existing entry loses or gains anything but the one added.
		ents = append(ents, posixacl.Entry{Tag: posixacl.Mask, Perm: groupClass, ID: posixacl.NoID})
	}
	if !changed {
		return nil
	}
	if err := unix.Setxattr(dir, posixacl.Xattr, posixacl.Encode(ents), 0); err != nil {
		return fmt.Errorf("write ACL: %w", err)
	}
	return nil
}

// ensureVMMDevices gives the VMM account the device nodes it opens, as
// udev's default rules do (50-udev-default.rules: tun 0666, kvm group kvm
// 0660) on hosts where udev did not run (containers, these CI machines:
// /dev/net/tun 0600 root). It changes a node only when it denies the
// account, and says which it changed.
func (a vmmAccount) ensureVMMDevices(kvm bool) ([]string, error) {
	var changed []string
	var st unix.Stat_t
	if err := unix.Stat("/dev/net/tun", &st); err == nil && st.Mode&0o006 != 0o006 {
		if err := os.Chmod("/dev/net/tun", 0o666); err != nil {
			return nil, fmt.Errorf("runtime: /dev/net/tun (mode %#o) is not usable by VMM account %s: %w; chmod 0666 /dev/net/tun", st.Mode&0o777, a.name, err)
		}
		changed = append(changed, "/dev/net/tun 0666")
	}
	if kvm {
		if err := unix.Stat("/dev/kvm", &st); err == nil && !(int(st.Gid) == a.kvmGID && st.Mode&0o060 == 0o060) && st.Mode&0o006 != 0o006 {
			if err := os.Chown("/dev/kvm", 0, a.kvmGID); err == nil {
				err = os.Chmod("/dev/kvm", 0o660)
			}
			if err != nil {
				return nil, fmt.Errorf("runtime: /dev/kvm is not usable by VMM account %s (group %s): %w; chgrp %s /dev/kvm && chmod 0660 /dev/kvm", a.name, KVMGroup, err, KVMGroup)
			}
			changed = append(changed, "/dev/kvm root:"+KVMGroup+" 0660")
		}
	}
	return changed, nil
}
