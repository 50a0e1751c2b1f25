package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// SmallFS mounts a file system of its own, sizeMiB large, on dir (made if
// missing): an ext4 image on a loop device, so a test can fill it (Fill)
// without filling the host's disk. The image is sparse; the test's
// cleanup unmounts it (lazily: processes may still hold files there) and
// the kernel frees the loop device once the last of them is closed.
func SmallFS(t *testing.T, dir string, sizeMiB int) {
	t.Helper()
	mkfs := LookPath(t, "mkfs.ext4", "e2fsprogs")
	mount := LookPath(t, "mount", "mount")
	image := dir + ".img"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(image)
	if err == nil {
		err = errors.Join(f.Truncate(int64(sizeMiB)<<20), f.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
	// -m 0: no blocks reserved for root, whom the members run as, so
	// Fill leaves them nothing either.
	if out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", image).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v\n%s", image, err, out)
	}
	if out, err := exec.Command(mount, "-o", "loop", image, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s on %s: %v\n%s", image, dir, err, out)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(image)
	})
}

// fillName is the file Fill allocates, at the top of the file system.
const fillName = ".kbtest-fill"

// Fill allocates every free block of the file system dir is on to one
// file: what writes there next fails with ENOSPC. Unfill removes it.
func Fill(dir string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("fill %s: %w", dir, err)
	}
	free := int64(st.Bfree) * st.Bsize
	if free <= 0 {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, fillName), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("fill %s: %w", dir, err)
	}
	defer f.Close()
	// Metadata takes some of what statfs counts free: ask for less until
	// the file system gives it (a refused request may allocate part).
	for ; free > 4<<20; free -= 4 << 20 {
		err = syscall.Fallocate(int(f.Fd()), 0, 0, free)
		if err == nil || !errors.Is(err, syscall.ENOSPC) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("fill %s: %w", dir, err)
	}
	return nil
}

// Unfill removes what Fill allocated.
func Unfill(dir string) error {
	if err := os.Remove(filepath.Join(dir, fillName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unfill %s: %w", dir, err)
	}
	return nil
}
