package guest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Disks by serial, safe mount targets and online ext4 growth: what the
// node's Volumes need of the guest (guestproto.CapMountSerial, CapGrowFS).

// diskPoll is how often a disk's appearance or size is checked.
const diskPoll = 20 * time.Millisecond

// mountDisk mounts the disk with serial on target. Only the mount points
// on the way to target are trusted: each directory below the last of them
// must be a real one (missing ones are made 0755), never a symbolic link,
// and the mount is made on the directory so opened, not on the path.
func (a *agent) mountDisk(ctx context.Context, serial, target, fstype, data string, grow bool) error {
	if !filepath.IsAbs(target) {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("mount serial:%s: target %q is not an absolute path", serial, target)}
	}
	target = filepath.Clean(target)
	dev, err := a.diskBySerial(ctx, serial)
	if err != nil {
		return err
	}
	dir, err := openMountTarget(target)
	if err != nil {
		return fmt.Errorf("mount serial:%s (%s) on %s: %w", serial, dev, target, err)
	}
	// The kernel resolves the descriptor's magic link to the directory
	// itself: a symlink swapped in since cannot redirect the mount.
	err = unix.Mount(dev, "/proc/self/fd/"+strconv.Itoa(int(dir.Fd())), fstype, 0, data)
	dir.Close()
	if err != nil {
		return fmt.Errorf("mount serial:%s (%s) on %s (%s): %w", serial, dev, target, fstype, err)
	}
	a.retain(target)
	if grow {
		if _, err := a.growFS(ctx, guestproto.GrowFSRequest{Path: target}); err != nil {
			return fmt.Errorf("mount serial:%s on %s: mounted, but not grown to its device: %w", serial, target, err)
		}
	}
	return nil
}

// diskBySerial is the device node of the block device whose
// SysRoot/block/<name>/serial is serial, waiting up to DiskWait for it:
// virtio-mmio probing may still run when the node's first configure comes.
func (a *agent) diskBySerial(ctx context.Context, serial string) (string, error) {
	if serial == "" || strings.ContainsAny(serial, "/\x00\n") {
		return "", &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("disk serial %q is not one", serial)}
	}
	deadline := time.Now().Add(a.opts.DiskWait)
	for {
		seen, match := a.diskSerials(serial)
		if len(match) > 1 {
			return "", fmt.Errorf("disk serial %q is on %s: the node gave two disks one serial", serial, strings.Join(match, " and "))
		}
		if len(match) == 1 {
			dev := filepath.Join(a.opts.DevRoot, match[0])
			// devtmpfs makes the node a moment after sysfs shows the disk.
			if fi, err := os.Stat(dev); err == nil && fi.Mode()&os.ModeDevice != 0 {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", &guestproto.Error{Code: guestproto.CodeNotFound, Message: fmt.Sprintf(
				"no disk with serial %q appeared within %v (disks: %s); was it attached to this VM?", serial, a.opts.DiskWait, strings.Join(seen, " "))}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("disk serial %q: %w", serial, ctx.Err())
		case <-time.After(diskPoll):
		}
	}
}

// diskSerials lists the block devices as name=serial, and the names of
// those whose serial is want.
func (a *agent) diskSerials(want string) (seen, match []string) {
	ents, _ := os.ReadDir(filepath.Join(a.opts.SysRoot, "block"))
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(a.opts.SysRoot, "block", e.Name(), "serial"))
		if err != nil {
			continue // not a virtio-blk disk (loop, zram): no serial
		}
		s := strings.TrimSpace(string(b))
		seen = append(seen, e.Name()+"="+s)
		if s == want {
			match = append(match, e.Name())
		}
	}
	return seen, match
}

// openMountTarget opens target as a directory, reached from the deepest
// mount point on its path through real directories only; missing ones
// are made 0755.
func openMountTarget(target string) (*os.File, error) {
	mounts, err := readMountInfo()
	if err != nil {
		return nil, err
	}
	base := "/"
	for _, m := range mounts {
		if within(target, m.point) && len(m.point) > len(base) {
			base = m.point
		}
	}
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open mount point %s: %w", base, err)
	}
	path := base
	for _, name := range strings.Split(strings.TrimPrefix(strings.TrimPrefix(target, base), "/"), "/") {
		if name == "" {
			continue
		}
		path = filepath.Join(path, name)
		next, err := openDirBelow(fd, name)
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), target), nil
}

// openDirBelow opens the directory name in dir without following a
// symbolic link, making it first when it is missing.
func openDirBelow(dir int, name string) (int, error) {
	for range 2 {
		fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOENT):
			if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, fmt.Errorf("make directory: %w", err)
			}
			continue
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			var st unix.Stat_t
			if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return -1, errors.New("is a symbolic link: a disk is mounted only on a real directory; remove the link")
			}
			return -1, errors.New("is not a directory")
		default:
			return -1, err
		}
	}
	return -1, errors.New("made, but gone again")
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	point  string
	dev    uint64 // st_dev of the filesystem
	fstype string
	source string
}

// readMountInfo reads this process's mount table, in mount order.
func readMountInfo() ([]mountEntry, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountInfo(string(b))
}

// parseMountInfo parses mountinfo lines: "36 35 98:0 /mnt1 /mnt2 rw,noatime
// master:1 - ext3 /dev/root rw,errors=continue" (proc(5)).
func parseMountInfo(s string) ([]mountEntry, error) {
	var out []mountEntry
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 6 || sep < 6 || len(f) < sep+3 {
			return nil, fmt.Errorf("mountinfo line %q: not understood", line)
		}
		majStr, minStr, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(majStr, 10, 32)
		mi, err2 := strconv.ParseUint(minStr, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo line %q: device %q", line, f[2])
		}
		out = append(out, mountEntry{point: unescapeMount(f[4]), dev: unix.Mkdev(uint32(ma), uint32(mi)),
			fstype: f[sep+1], source: unescapeMount(f[sep+2])})
	}
	return out, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ioctlEXT4ResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
// mounted ext4 filesystem to a new block count (what resize2fs does
// online). x/sys does not carry it.
const ioctlEXT4ResizeFS = 0x40086610

// growFS grows the ext4 filesystem mounted at req.Path to fill its
// device, once the device has at least req.MinBytes.
func (a *agent) growFS(ctx context.Context, req guestproto.GrowFSRequest) (guestproto.GrowFSResult, error) {
	var res guestproto.GrowFSResult
	if !filepath.IsAbs(req.Path) {
		return res, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("path %q is not absolute", req.Path)}
	}
	path := filepath.Clean(req.Path)
	mounts, err := readMountInfo()
	if err != nil {
		return res, err
	}
	var m *mountEntry
	for i := range mounts {
		if mounts[i].point == path {
			m = &mounts[i] // the last one is on top
		}
	}
	switch {
	case m == nil:
		return res, &guestproto.Error{Code: guestproto.CodeNotFound, Message: fmt.Sprintf("nothing is mounted at %s", path)}
	case m.fstype != "ext4":
		return res, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("%s is %s (%s): only ext4 grows online", path, m.fstype, m.source)}
	}
	// Both opened and checked against the mount table's device: a path
	// changed since cannot make this grow another filesystem.
	dev, err := os.Open(m.source)
	if err != nil {
		return res, fmt.Errorf("%s: device: %w", path, err)
	}
	defer dev.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(dev.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != m.dev {
		return res, fmt.Errorf("%s: %s is not the block device %d:%d the mount table names", path, m.source, unix.Major(m.dev), unix.Minor(m.dev))
	}
	dirFD, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	defer unix.Close(dirFD)
	if err := unix.Fstat(dirFD, &st); err != nil || st.Dev != m.dev {
		return res, fmt.Errorf("%s: the directory is no longer on %s", path, m.source)
	}

	size, err := a.waitDeviceSize(ctx, dev, req.MinBytes)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	sb, err := readExt4Super(dev)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	if want := size / sb.blockSize; want > sb.blocks {
		// The new count goes by address: the ioctl reads a __u64.
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(dirFD), ioctlEXT4ResizeFS, uintptr(unsafe.Pointer(&want))); errno != 0 {
			return res, fmt.Errorf("%s: EXT4_IOC_RESIZE_FS from %d to %d blocks of %d bytes: %w", path, sb.blocks, want, sb.blockSize, errno)
		}
		if sb, err = readExt4Super(dev); err != nil {
			return res, fmt.Errorf("%s: %w", path, err)
		}
		a.log.Info("guest agent grew filesystem", "path", path, "device", m.source, "device_bytes", size, "filesystem_bytes", sb.blocks*sb.blockSize)
	}
	return guestproto.GrowFSResult{DeviceBytes: size, FilesystemBytes: sb.blocks * sb.blockSize}, nil
}

// waitDeviceSize returns dev's size once it is at least minBytes, waiting
// up to DiskWait: the kernel learns of a resize asynchronously.
func (a *agent) waitDeviceSize(ctx context.Context, dev *os.File, minBytes uint64) (uint64, error) {
	deadline := time.Now().Add(a.opts.DiskWait)
	for {
		var size uint64
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); errno != 0 {
			return 0, fmt.Errorf("size of %s: %w", dev.Name(), errno)
		}
		if size >= minBytes {
			return size, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("device %s is %d bytes after %v, want at least %d: did the resize reach this disk?", dev.Name(), size, a.opts.DiskWait, minBytes)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(diskPoll):
		}
	}
}

// ext4Super is what growFS needs of an ext4 superblock.
type ext4Super struct {
	blocks    uint64
	blockSize uint64
}

// readExt4Super reads the superblock at byte 1024 of dev. A mounted
// filesystem's superblock lives in the device's page cache, so this sees
// what the kernel last set, resizes included.
func readExt4Super(dev *os.File) (ext4Super, error) {
	b := make([]byte, 1024)
	if _, err := dev.ReadAt(b, 1024); err != nil {
		return ext4Super{}, fmt.Errorf("read the superblock of %s: %w", dev.Name(), err)
	}
	le := binary.LittleEndian
	if le.Uint16(b[0x38:]) != unix.EXT4_SUPER_MAGIC {
		return ext4Super{}, fmt.Errorf("%s has no ext4 superblock", dev.Name())
	}
	logSize := le.Uint32(b[0x18:])
	if logSize > 6 { // 64 KiB blocks at most
		return ext4Super{}, fmt.Errorf("%s: ext4 block size 2^%d KiB is not one", dev.Name(), logSize)
	}
	s := ext4Super{blocks: uint64(le.Uint32(b[0x04:])), blockSize: 1024 << logSize}
	const incompat64bit = 0x80
	if le.Uint32(b[0x60:])&incompat64bit != 0 {
		s.blocks |= uint64(le.Uint32(b[0x150:])) << 32
	}
	return s, nil
}
