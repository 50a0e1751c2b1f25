package faultfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/posixacl"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Files under the mount are the backing directory's; while a fault is on,
// their reads, writes and syncs fail with its error or wait; after Heal
// they work again. Another user is refused a file its mode does not let it
// read, as on the backing directory.
func TestFaults(t *testing.T) {
	testenv.RequireRoot(t, "a FUSE mount")
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("faultfs needs /dev/fuse: %v", err)
	}
	scratch, err := os.MkdirTemp("/tmp", "kbfault-")
	if err == nil {
		err = os.Chmod(scratch, 0o755) // another user may reach the mount
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	backing, dir := filepath.Join(scratch, "disk"), filepath.Join(scratch, "mnt")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	f := Mount(t, backing, dir)

	path := filepath.Join(dir, "layer")
	if err := os.WriteFile(path, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(backing, "layer")); err != nil || string(b) != "one\n" {
		t.Fatalf("the backing file after a write through the mount: %q, %v", b, err)
	}

	f.Fail(syscall.EIO, 1)
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, werr := fh.Write([]byte("two\n"))
	serr := fh.Sync()
	fh.Close()
	if !errors.Is(werr, syscall.EIO) && !errors.Is(serr, syscall.EIO) {
		t.Errorf("a write and sync while every operation fails: %v, %v; want EIO", werr, serr)
	}
	if _, err := readDirect(path); !errors.Is(err, syscall.EIO) {
		t.Errorf("a read while every operation fails: %v, want EIO", err)
	}
	if failed, _ := f.Counts(); failed == 0 {
		t.Error("no operation counted as failed")
	}

	f.Heal()
	f.Slow(50 * time.Millisecond)
	if err := os.WriteFile(path, []byte("three\n"), 0o600); err != nil {
		t.Fatalf("a write on a slow disk: %v", err)
	}
	if _, delayed := f.Counts(); delayed == 0 {
		t.Error("no operation counted as delayed")
	}
	f.Heal()
	if b, err := readDirect(path); err != nil || string(b) != "three\n" {
		t.Fatalf("after Heal: %q, %v", b, err)
	}

	public := filepath.Join(dir, "public")
	if err := os.WriteFile(public, []byte("all\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := asNobody("cat", public).CombinedOutput(); err != nil || string(out) != "all\n" {
		t.Errorf("nobody reading a 0644 file through the mount: %q, %v", out, err)
	}
	if out, err := asNobody("cat", path).CombinedOutput(); err == nil {
		t.Errorf("nobody read a 0600 file of root through the mount: %q", out)
	}
	// An ACL entry lets nobody read it, as the node grants its VMM
	// account the pool's directories.
	acl := posixacl.Encode([]posixacl.Entry{
		{Tag: posixacl.UserObj, Perm: posixacl.Read | posixacl.Write, ID: posixacl.NoID},
		{Tag: posixacl.User, Perm: posixacl.Read, ID: 65534},
		{Tag: posixacl.GroupObj, ID: posixacl.NoID},
		{Tag: posixacl.Mask, Perm: posixacl.Read, ID: posixacl.NoID},
		{Tag: posixacl.Other, ID: posixacl.NoID},
	})
	if err := unix.Setxattr(path, posixacl.Xattr, acl, 0); err != nil {
		t.Fatal(err)
	}
	if out, err := asNobody("cat", path).CombinedOutput(); err != nil || string(out) != "three\n" {
		t.Errorf("nobody reading a 0600 file whose ACL lets it: %q, %v", out, err)
	}
}

func asNobody(argv ...string) *exec.Cmd {
	c := exec.Command(argv[0], argv[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return c
}

// readDirect reads path past the page cache, so the read reaches the
// server.
func readDirect(path string) ([]byte, error) {
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		// FUSE without direct I/O support: a fresh open still asks the
		// server, the cache being dropped at open (no keep_cache).
		fh, err = os.Open(path)
		if err != nil {
			return nil, err
		}
	}
	defer fh.Close()
	buf := make([]byte, 4096)
	n, err := fh.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// A mount still in use when its test ends (a process of a failed test
// holds a file there) does not hold up the cleanup: after a bounded wait
// its connection is aborted, and what is open there fails.
func TestEndAbortsAMountInUse(t *testing.T) {
	testenv.RequireRoot(t, "a FUSE mount")
	defer func(d time.Duration) { endWait = d }(endWait)
	endWait = 200 * time.Millisecond
	scratch := t.TempDir()
	backing, dir := filepath.Join(scratch, "disk"), filepath.Join(scratch, "mnt")
	if err := os.Mkdir(backing, 0o700); err != nil {
		t.Fatal(err)
	}
	var held *os.File
	t.Run("mount", func(t *testing.T) {
		Mount(t, backing, dir)
		fh, err := os.Create(filepath.Join(dir, "held"))
		if err != nil {
			t.Fatal(err)
		}
		held = fh
	})
	if held == nil {
		t.FailNow()
	}
	defer held.Close()
	if _, err := held.Write([]byte("x")); !errors.Is(err, syscall.ENOTCONN) {
		t.Errorf("a write to a file held open past the aborted mount: %v, want ENOTCONN", err)
	}
}
