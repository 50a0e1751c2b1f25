package storagepool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Volume files. A Volume is a raw file in its pool's volumes/data/
// directory with an ext4 filesystem that fills it; the guest grows the
// filesystem to the file when it mounts it, so growing a Volume is
// growing its file. Files are never shrunk.

// CreateVolume makes a Volume's file of size bytes at path, formatted
// ext4, unless it exists already (a create retried after the node
// restarted: the file was renamed into place only once complete). It is
// made under a temporary name of node's (.node-a.create-vol-<id>-N.tmp;
// the pool may be shared) and renamed without replacing anything.
func CreateVolume(ctx context.Context, node, path string, size uint64) error {
	return placeVolume(node, path, func(tmp string) error { return makeFilesystem(ctx, tmp, size) })
}

// ImportVolume makes the Volume file at path from a qcow2 image (a
// Transfer's, checked to stand alone by the caller), size bytes long, as
// CreateVolume makes a new one: under a temporary name, then renamed.
func ImportVolume(ctx context.Context, node, path string, size uint64, qcow string) error {
	return placeVolume(node, path, func(tmp string) error {
		out, err := exec.CommandContext(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "raw", qcow, tmp).CombinedOutput()
		if err != nil {
			return fmt.Errorf("import volume from %s: qemu-img convert: %v: %s", qcow, err, strings.TrimSpace(string(out)))
		}
		if err := GrowVolume(tmp, size); err != nil {
			return err
		}
		return SyncFile(tmp)
	})
}

// placeVolume makes the Volume file at path with fill, unless it exists.
func placeVolume(node, path string, fill func(tmp string) error) error {
	if st, err := os.Lstat(path); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("volume file %s is a %v, not a regular file: remove it by hand", path, st.Mode().Type())
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("volume file %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("volume directory %s: %w", dir, err)
	}
	id := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	tmp, err := TempPath(dir, Temp{Node: node, Purpose: "create-" + id})
	if err != nil {
		return err
	}
	if err := fill(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE); err != nil {
		os.Remove(tmp)
		if errors.Is(err, unix.EEXIST) {
			return nil // made by an earlier attempt meanwhile
		}
		return fmt.Errorf("put volume file %s in place: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("put volume file %s in place: %w", path, err)
	}
	return nil
}

// makeFilesystem sizes the sparse file tmp and puts an ext4 filesystem
// on it: 4 KiB blocks, nothing reserved for root (a Volume is data), the
// inode tables and journal zeroed lazily by the guest instead of written
// here in full.
func makeFilesystem(ctx context.Context, tmp string, size uint64) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create volume file: %w", err)
	}
	err = f.Truncate(int64(size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("size volume file %s: %w", tmp, err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("make the volume's filesystem: mkfs.ext4 not found (Debian package e2fsprogs)")
	}
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-b", "4096", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", tmp).CombinedOutput()
	if err != nil {
		return fmt.Errorf("make the volume's filesystem: mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return SyncFile(tmp)
}

// GrowVolume makes the file at path size bytes long when it is shorter;
// a file already at least that long is left as it is (a retried resize, or
// a size ctrl recorded lower than the file after a lost answer). The
// filesystem inside grows when the guest mounts it or is told to.
func GrowVolume(path string, size uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("volume file %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("volume file %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("volume file %s is not a regular file", path)
	}
	if uint64(st.Size()) >= size {
		return nil
	}
	if err := f.Truncate(int64(size)); err != nil {
		return fmt.Errorf("grow volume file %s to %d bytes: %w", path, size, err)
	}
	return f.Sync()
}

// RemoveVolume removes a Volume's file and its holder record; one already
// gone is fine.
func RemoveVolume(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume file %s: %w", path, err)
	}
	if err := RemoveHolder(path); err != nil {
		return fmt.Errorf("remove the holder record of %s: %w", path, err)
	}
	return nil
}
