package datadir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMakePrivate(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "snapshots", "1-2-3")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"state.bin": 0o644, "meta.json": 0o666, "x": 0o700} {
		if err := os.WriteFile(filepath.Join(sub, name), nil, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(sub, name), mode) // past the umask
	}
	if err := MakePrivate(root); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{"": 0o700, "snapshots": 0o700, "snapshots/1-2-3": 0o700,
		"snapshots/1-2-3/state.bin": 0o600, "snapshots/1-2-3/meta.json": 0o600, "snapshots/1-2-3/x": 0o600}
	for rel, mode := range want {
		st, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v; want %v", rel, st.Mode().Perm(), mode)
		}
	}
	if err := MakePrivate(filepath.Join(root, "gone")); err != nil {
		t.Errorf("a directory that does not exist: %v", err)
	}
}
