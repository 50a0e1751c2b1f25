package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

// TestGrantFileToAccount: a file deep under 0700 directories becomes
// readable by the account (here nobody, standing in for the VMM account)
// through ACL search entries, and stays unreadable to any other account.
func TestGrantFileToAccount(t *testing.T) {
	testenv.RequireRoot(t, "to read files as other accounts")
	setpriv := testenv.LookPath(t, "setpriv", "util-linux")
	top, err := os.MkdirTemp("", "kbr-acl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	dir := filepath.Join(top, "a", "b")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "kernel")
	if err := os.WriteFile(file, []byte("vmlinux"), 0o600); err != nil {
		t.Fatal(err)
	}
	// nobody is 65534:65534; the file's group is the account's group.
	a := vmmAccount{name: "nobody", uid: 65534, gid: 65534, kvmGID: -1}
	as := func(uid string) (string, error) {
		out, err := exec.Command(setpriv, "--reuid="+uid, "--regid="+uid, "--clear-groups", "cat", file).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if _, err := as("65534"); err == nil {
		t.Fatal("nobody reads the file before the grant")
	}
	for range 2 { // the second grant finds everything in place
		if err := a.grantFile(file, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := as("65534"); err != nil || out != "vmlinux" {
		t.Errorf("nobody reads %q, %v; want vmlinux", out, err)
	}
	if out, err := as("65533"); err == nil {
		t.Errorf("another account reads the file: %q", out)
	}
	for _, d := range []string{top, filepath.Join(top, "a"), dir} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s: mode %v, %v; want nothing for others", d, st.Mode(), err)
		}
	}
	// Listing stays denied: the grant is search only.
	if out, err := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "ls", dir).CombinedOutput(); err == nil {
		t.Errorf("nobody lists %s: %s", dir, out)
	}
}
