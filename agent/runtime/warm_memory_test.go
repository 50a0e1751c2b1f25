package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A memory file is made only in directories of root's alone (the VMM
// account may search them, as every boot lets it), allocated whole; a
// directory someone else made, or that others may read or write, or a
// link in its place, is refused with what to do.
func TestAllocateMemoryFile(t *testing.T) {
	base := "/dev/shm/" + filepath.Base(t.TempDir()) + "-warm"
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "tpl")
	if err := allocateMemoryFile(dir, filepath.Join(dir, "warm-1.ram"), 2); err != nil {
		t.Fatal(err)
	}
	if err := checkMemoryFile(filepath.Join(dir, "warm-1.ram"), 2); err != nil {
		t.Fatalf("a fresh memory file: %v", err)
	}
	// Searchable by the VMM account after a boot: still root's.
	os.Chmod(base, 0o710)
	os.Chmod(dir, 0o710)
	if err := allocateMemoryFile(dir, filepath.Join(dir, "warm-2.ram"), 2); err != nil {
		t.Fatalf("in directories the VMM account may search: %v", err)
	}
	if err := allocateMemoryFile(dir, filepath.Join(dir, "warm-2.ram"), 2); err == nil {
		t.Error("a memory file made twice")
	}
	for name, spoil := range map[string]func(){
		"readable by others": func() { os.Chmod(base, 0o755) },
		"writable by group":  func() { os.Chmod(dir, 0o770) },
		"another owner":      func() { os.Chown(base, 65534, 65534) },
		"a link":             func() { os.RemoveAll(base); os.Symlink(t.TempDir(), base) },
	} {
		spoil()
		err := allocateMemoryFile(dir, filepath.Join(dir, "warm-3.ram"), 2)
		if err == nil || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("%s: %v; want a refusal that says to remove it", name, err)
		}
		os.RemoveAll(base)
		os.Mkdir(base, 0o700)
		os.Mkdir(dir, 0o700)
	}
	// Not on a tmpfs: a guest's writes would go to a disk.
	disk := t.TempDir()
	f := filepath.Join(disk, "warm-4.ram")
	os.WriteFile(f, nil, 0o600)
	syscall.Truncate(f, 2<<20)
	if err := checkMemoryFile(f, 2); err == nil || !strings.Contains(err.Error(), "is not on a tmpfs") {
		t.Errorf("a memory file on a disk: %v", err)
	}
}
