package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A fork's machine id goes into a root's etc/machine-id, never through a
// symbolic link the Workspace's user made; bad requests are refused before
// the kernel's pool is touched.
func TestIdentityMachineID(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef"
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "machine-id"), []byte("the source's\n"), 0o444)
	if err := writeMachineID(root, id); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc", "machine-id")); string(b) != id+"\n" {
		t.Errorf("machine-id %q", b)
	}

	outside := t.TempDir()
	victim := filepath.Join(outside, "machine-id")
	os.WriteFile(victim, []byte("agent's\n"), 0o644)
	linked := t.TempDir()
	os.Symlink(outside, filepath.Join(linked, "etc"))
	if err := writeMachineID(linked, id); err != nil {
		t.Errorf("a root whose etc is a link: %v (want it left alone)", err)
	}
	linkedFile := t.TempDir()
	os.Mkdir(filepath.Join(linkedFile, "etc"), 0o755)
	os.Symlink(victim, filepath.Join(linkedFile, "etc", "machine-id"))
	if err := writeMachineID(linkedFile, id); err == nil {
		t.Error("a machine-id that is a link was written through")
	}
	if b, _ := os.ReadFile(victim); string(b) != "agent's\n" {
		t.Errorf("the file outside the root now holds %q", b)
	}
	if err := writeMachineID(t.TempDir(), id); err != nil {
		t.Errorf("a root without etc: %v", err)
	}

	for _, c := range []struct {
		req  guestproto.IdentityRequest
		want string
	}{
		{guestproto.IdentityRequest{Entropy: make([]byte, 8)}, "8 bytes of entropy"},
		{guestproto.IdentityRequest{Entropy: make([]byte, 64), MachineID: "ABC"}, "not 32 lowercase hex digits"},
	} {
		if err := setIdentity(c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("identity %+v: %v, want %q", c.req, err, c.want)
		}
	}
}
