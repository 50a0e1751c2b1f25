package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A small file system of its own: Fill leaves nothing for a write, and
// Unfill gives the room back.
func TestSmallFSFill(t *testing.T) {
	if os.Geteuid() != 0 {
		Skipf(t, "needs root to mount a file system")
	}
	dir := filepath.Join(t.TempDir(), "pool")
	SmallFS(t, dir, 64)
	write := func() error { return os.WriteFile(filepath.Join(dir, "data"), make([]byte, 1<<20), 0o600) }
	if err := write(); err != nil {
		t.Fatalf("a write before Fill: %v", err)
	}
	os.Remove(filepath.Join(dir, "data"))
	if err := Fill(dir); err != nil {
		t.Fatal(err)
	}
	if err := write(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("a write to a full file system: %v, want ENOSPC", err)
	}
	if err := Unfill(dir); err != nil {
		t.Fatal(err)
	}
	if err := write(); err != nil {
		t.Fatalf("a write after Unfill: %v", err)
	}
}
