package dataplane

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestLinkEarlierOnlySockets: the node links a running generation's
// control socket from an earlier directory, and nothing else that may sit
// there under that name: a regular file or a symbolic link (which could
// point anywhere) is left unlinked, and a generation that does not run
// gets no link.
func TestLinkEarlierOnlySockets(t *testing.T) {
	dir := t.TempDir()
	earlier, now := filepath.Join(dir, "earlier"), filepath.Join(dir, "now")
	if err := os.Mkdir(earlier, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", ControlSocket(earlier, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.WriteFile(ControlSocket(earlier, 2), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ControlSocket(earlier, 1), ControlSocket(earlier, 3)); err != nil {
		t.Fatal(err)
	}
	notRunning, err := net.Listen("unix", ControlSocket(earlier, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer notRunning.Close()
	running := []*proc{{gen: 1}, {gen: 2}, {gen: 3}}
	if err := linkEarlier(now, []string{earlier}, running, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(ControlSocket(now, 1)); err != nil || target != ControlSocket(earlier, 1) {
		t.Errorf("generation 1's socket: link to %q, %v; want %s", target, err, ControlSocket(earlier, 1))
	}
	for _, gen := range []uint64{2, 3, 4} {
		if _, err := os.Lstat(ControlSocket(now, gen)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("generation %d got a link (%v): only a running generation's socket is linked", gen, err)
		}
	}
	if st, err := os.Stat(now); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("socket directory: %v, %v; want mode 0700", st, err)
	}
	// The earlier directory still holds sockets: it stays.
	if _, err := os.Stat(earlier); err != nil {
		t.Errorf("the earlier directory went while it held sockets: %v", err)
	}
}
