package generations_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kibotos/kibotos/agent/generations"
)

// A socket a dead process of the same generation left is replaced, and
// the socket file outlives the listener: the process removes it after its
// last reply, not when it stops accepting.
func TestListenControlReplacesALeftSocket(t *testing.T) {
	dir := t.TempDir()
	left, err := generations.ListenControl(dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	left.Close()
	path := generations.ControlSocket(dir, 3)
	if path != filepath.Join(dir, "control-3.sock") {
		t.Fatalf("control socket %s", path)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("socket file gone with its listener: %v", err)
	}
	ln, err := generations.ListenControl(dir, 3)
	if err != nil {
		t.Fatalf("listen where a dead generation left its socket: %v", err)
	}
	defer ln.Close()
	// A file that is not a socket is not this package's to remove.
	if err := os.WriteFile(generations.ControlSocket(dir, 4), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ln, err := generations.ListenControl(dir, 4); err == nil {
		ln.Close()
		t.Fatal("listened over a regular file")
	}
}
