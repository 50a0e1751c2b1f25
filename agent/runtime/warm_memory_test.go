package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A memory file is made empty, for its VMM to allocate, only in
// directories of root's alone (the VMM account may search them, as every
// boot lets it); a directory someone else made, or that others may read
// or write, or a link in its place, is refused with what to do. A boot
// takes only an empty one, a restore only one allocated whole at the
// guest's size, and neither one on a disk.
func TestMemoryFiles(t *testing.T) {
	base := "/dev/shm/" + filepath.Base(t.TempDir()) + "-warm"
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "tpl")
	file := filepath.Join(dir, "warm-1.ram")
	if err := makeMemoryFile(dir, file); err != nil {
		t.Fatal(err)
	}
	if err := checkNewMemoryFile(file, 2); err != nil {
		t.Errorf("a new memory file for a boot: %v", err)
	}
	if err := checkMemoryFile(file, 2); err == nil || !strings.Contains(err.Error(), "want 2 MiB, all allocated") {
		t.Errorf("an empty memory file for a restore: %v", err)
	}
	if err := syscall.Truncate(file, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := checkMemoryFile(file, 2); err == nil || !strings.Contains(err.Error(), "all allocated") {
		t.Errorf("a sparse memory file for a restore: %v", err)
	}
	f, _ := os.OpenFile(file, os.O_RDWR, 0)
	syscall.Fallocate(int(f.Fd()), 0, 0, 2<<20)
	f.Close()
	if err := checkMemoryFile(file, 2); err != nil {
		t.Errorf("a whole memory file for a restore: %v", err)
	}
	if err := checkNewMemoryFile(file, 2); err == nil {
		t.Error("a boot took a memory file that is not empty")
	}
	os.Chmod(file, 0o640)
	if err := checkMemoryFile(file, 2); err == nil || !strings.Contains(err.Error(), "remove it") {
		t.Errorf("a memory file others may read: %v", err)
	}
	// Searchable by the VMM account after a boot: still root's.
	os.Chmod(base, 0o710)
	os.Chmod(dir, 0o710)
	if err := makeMemoryFile(dir, filepath.Join(dir, "warm-2.ram")); err != nil {
		t.Fatalf("in directories the VMM account may search: %v", err)
	}
	if err := makeMemoryFile(dir, filepath.Join(dir, "warm-2.ram")); err == nil {
		t.Error("a memory file made twice")
	}
	for name, spoil := range map[string]func(){
		"readable by others": func() { os.Chmod(base, 0o755) },
		"writable by group":  func() { os.Chmod(dir, 0o770) },
		"another owner":      func() { os.Chown(base, 65534, 65534) },
		"a link":             func() { os.RemoveAll(base); os.Symlink(t.TempDir(), base) },
	} {
		spoil()
		err := makeMemoryFile(dir, filepath.Join(dir, "warm-3.ram"))
		if err == nil || !strings.Contains(err.Error(), "remove it") {
			t.Errorf("%s: %v; want a refusal that says to remove it", name, err)
		}
		os.RemoveAll(base)
		os.Mkdir(base, 0o700)
		os.Mkdir(dir, 0o700)
	}
	// Not on a tmpfs: a guest's writes would go to a disk.
	disk := filepath.Join(t.TempDir(), "warm-4.ram")
	os.WriteFile(disk, nil, 0o600)
	if err := checkNewMemoryFile(disk, 2); err == nil || !strings.Contains(err.Error(), "is not on a tmpfs") {
		t.Errorf("a memory file on a disk: %v", err)
	}
}
