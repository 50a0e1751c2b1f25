// Package faultfs is a FUSE file system that passes everything through to
// a directory and, when told, fails or slows the file I/O under it: the
// I/O errors and slow disks the fault harness puts under a storage pool.
// This kernel has no device-mapper (its error, flakey and delay targets
// would do it at the block layer); /dev/fuse is there.
//
// It is a test helper: it mounts as root with allow_other (the VMM
// account opens pool files), and default_permissions with POSIX ACLs
// makes the kernel check each caller against the files' modes and ACLs,
// as on the directory itself.
package faultfs

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is one mount: its faults apply to every file opened under it.
type FS struct {
	server *fuse.Server

	mu    sync.Mutex
	errno syscall.Errno // the error of a failed operation; 0: none fail
	share float64       // the share of operations that fail, 0..1
	delay time.Duration // how long each operation waits first
	rng   *rand.Rand
	// failed and delayed count what the faults did (Counts).
	failed, delayed int
}

// Mount serves backing at dir (made if missing) until the test ends. The
// cleanup detaches the mount (processes may still hold files there) and
// waits for the server.
func Mount(t testing.TB, backing, dir string) *FS {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		t.Fatalf("faultfs: %s: %v", backing, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f := &FS{rng: rand.New(rand.NewPCG(uint64(st.Ino), uint64(time.Now().UnixNano())))}
	root := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	root.NewNode = func(r *fs.LoopbackRoot, parent *fs.Inode, name string, st *syscall.Stat_t) fs.InodeEmbedder {
		return &node{LoopbackNode: fs.LoopbackNode{RootData: r}, fs: f}
	}
	root.RootNode = &node{LoopbackNode: fs.LoopbackNode{RootData: root}, fs: f}
	// Attributes and entries are not cached: several hosts' processes
	// and the backing directory itself see the same files.
	zero := time.Duration(0)
	server, err := fs.Mount(dir, root.RootNode, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			AllowOther:        true,
			DirectMountStrict: true,
			FsName:            backing,
			Name:              "kbfault",
			Options:           []string{"default_permissions"},
			// The node grants the VMM account its pool's directories by
			// ACL entries: the kernel checks them only when asked to.
			EnableAcl: true,
			MaxWrite:  1 << 20,
		},
	})
	if err != nil {
		t.Fatalf("faultfs: mount %s on %s: %v", backing, dir, err)
	}
	f.server = server
	var mounted syscall.Stat_t
	if err := syscall.Stat(dir, &mounted); err != nil {
		t.Fatalf("faultfs: %s: %v", dir, err)
	}
	t.Cleanup(func() {
		f.Heal()
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("faultfs: unmount %s: %v", dir, err)
		}
		if err := f.end(unix.Minor(mounted.Dev)); err != nil {
			t.Errorf("faultfs: %s: %v", dir, err)
		}
	})
	return f
}

// endWait is how long a detached mount may stay in use (a process of a
// failed test still holding a file there) before its connection is
// aborted.
var endWait = 10 * time.Second

// end waits for the server of a detached mount, whose connection is conn:
// it ends once no file there is open. After endWait the connection is
// aborted (what is still open there fails with ENOTCONN), through the
// fuse control file system, mounted for that moment if it is not.
func (f *FS) end(conn uint32) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.server.Wait()
	}()
	select {
	case <-done:
		return nil
	case <-time.After(endWait):
	}
	const ctl = "/sys/fs/fuse/connections"
	abort := fmt.Sprintf("%s/%d/abort", ctl, conn)
	if _, err := os.Stat(abort); errors.Is(err, iofs.ErrNotExist) {
		if err := syscall.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("still in use %v after it was detached, and the fuse control file system cannot be mounted to abort it: %w", endWait, err)
		}
		defer syscall.Unmount(ctl, 0)
	}
	if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
		return fmt.Errorf("still in use %v after it was detached, and not aborted: %w", endWait, err)
	}
	<-done
	return nil
}

// Fail makes share (0..1) of the file reads, writes, syncs and
// allocations under the mount fail with errno, until Heal.
func (f *FS) Fail(errno syscall.Errno, share float64) {
	f.mu.Lock()
	f.errno, f.share = errno, share
	f.mu.Unlock()
}

// Slow makes each file read, write, sync and allocation under the mount
// wait d first, until Heal.
func (f *FS) Slow(d time.Duration) {
	f.mu.Lock()
	f.delay = d
	f.mu.Unlock()
}

// Heal ends every fault.
func (f *FS) Heal() {
	f.mu.Lock()
	f.errno, f.share, f.delay = 0, 0, 0
	f.mu.Unlock()
}

// Counts are the operations failed and delayed since the mount.
func (f *FS) Counts() (failed, delayed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed, f.delayed
}

// fault is what the next operation meets: a wait, then an error or not.
func (f *FS) fault(ctx context.Context) syscall.Errno {
	f.mu.Lock()
	delay, errno := f.delay, syscall.Errno(0)
	if f.errno != 0 && f.rng.Float64() < f.share {
		errno = f.errno
		f.failed++
	}
	if delay > 0 {
		f.delayed++
	}
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done(): // the caller was interrupted
			t.Stop()
			return syscall.EINTR
		}
	}
	return errno
}

// node is a loopback node whose files meet the mount's faults.
type node struct {
	fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeOpener  = (*node)(nil)
	_ fs.NodeCreater = (*node)(nil)
)

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fl, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, n.wrap(fh), fl, errno
}

func (n *node) wrap(fh fs.FileHandle) fs.FileHandle {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return fh
	}
	return &file{LoopbackFile: lf, fs: n.fs}
}

// file is a loopback file whose data operations meet the faults. It
// offers no passthrough descriptor: the kernel would then do the I/O
// without asking the server.
type file struct {
	*fs.LoopbackFile
	fs *FS
}

func (f *file) PassthroughFd() (int, bool) { return 0, false }

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if errno := f.fs.fault(ctx); errno != 0 {
		return nil, errno
	}
	return f.LoopbackFile.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.fs.fault(ctx); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

func (f *file) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	if errno := f.fs.fault(ctx); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Writev(ctx, data, off)
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := f.fs.fault(ctx); errno != 0 {
		return errno
	}
	return f.LoopbackFile.Fsync(ctx, flags)
}

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if errno := f.fs.fault(ctx); errno != 0 {
		return errno
	}
	return f.LoopbackFile.Allocate(ctx, off, size, mode)
}
