package guest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A file written as a user of a root (FileWriteRequest.User): what E2B's
// files.write does as the sandbox's user. The agent is root; the write
// runs on a thread of its own whose filesystem ids and groups are the
// user's, so the kernel checks the user's permissions and the files are
// theirs, and the path is resolved inside the root (RESOLVE_IN_ROOT), so a
// symbolic link of the user's never leads out of it. The thread is never
// handed back to the runtime: it ends with the write, its ids with it.

// writeFileAs writes the chunks of s as req.User of req.Root.
func writeFileAs(s io.Reader, req guestproto.FileWriteRequest) (guestproto.FileInfo, error) {
	data := &guestproto.ChunkReader{R: s}
	u, p, err := userPath(req.Root, req.User, req.Path)
	if err != nil {
		io.Copy(io.Discard, data)
		return guestproto.FileInfo{}, err
	}
	req.Path = p
	var fi guestproto.FileInfo
	err = inRootAs(req.Root, u, func(root int) error {
		fi, err = writeInRoot(data, root, req)
		return err
	})
	if err != nil {
		io.Copy(io.Discard, data) // keeps the stream framed for the answer
	}
	return fi, err
}

// userPath is the user of root named user ("": the image config's, as
// an exec's) and p as the absolute path that user's shell would take it
// for (a relative one is from its home).
func userPath(root, user, p string) (execUser, string, error) {
	if root == "" || p == "" {
		return execUser{}, "", &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("file as %q: give a root and the path of a file in it, not %q", user, p)}
	}
	name := user
	if name == "" {
		name = "0"
		if cfg, err := loadImageConfig(root); err == nil && cfg != nil && cfg.User != "" {
			name = cfg.User
		}
	}
	u, err := lookupUser(root, name)
	if err != nil {
		return execUser{}, "", &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("user %q: %v", name, err)}
	}
	if !path.IsAbs(p) {
		p = path.Join("/", u.home, p)
	}
	if p = path.Clean(p); p == "/" {
		return execUser{}, "", &guestproto.Error{Code: guestproto.CodeInvalid, Message: "/ is no file"}
	}
	return u, p, nil
}

// inRootAs runs fn with a descriptor of root on a thread of its own with
// u's filesystem ids and groups, and waits for it.
func inRootAs(rootPath string, u execUser, fn func(root int) error) error {
	// The root is the agent's to open; only what lies in it is the user's.
	root, err := unix.Open(rootPath, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open root %s: %w", rootPath, err)
	}
	defer unix.Close(root)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread and its ids end here
		if err := becomeUser(u); err != nil {
			done <- fmt.Errorf("take the ids of uid %d: %w", u.uid, err)
			return
		}
		done <- fn(root)
	}()
	return <-done
}

// openFileAs opens the file p of root for reading as user.
func openFileAs(root, user, p string) (*os.File, string, error) {
	u, p, err := userPath(root, user, p)
	if err != nil {
		return nil, "", err
	}
	var fd int
	err = inRootAs(root, u, func(root int) error {
		fd, err = unix.Openat2(root, strings.TrimPrefix(p, "/"), &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
		if err != nil {
			return pathError("open", p, err)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return os.NewFile(uintptr(fd), p), p, nil
}

// becomeUser gives this thread u's groups and filesystem ids (per thread:
// the raw system calls, not the runtime's, which change every thread).
func becomeUser(u execUser) error {
	groups := u.groups
	if len(groups) == 0 {
		groups = []uint32{u.gid}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(u.gid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(u.uid), 0, 0)
	// setfs[ug]id answer the id before, never an error: check they took.
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(got) != u.uid {
		return fmt.Errorf("setfsuid %d did not take", u.uid)
	}
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); uint32(got) != u.gid {
		return fmt.Errorf("setfsgid %d did not take", u.gid)
	}
	return nil
}

// writeInRoot writes data to req.Path inside root (a descriptor of
// req.Root) with this thread's ids: into a temporary file beside it,
// renamed over it once complete.
func writeInRoot(data io.Reader, root int, req guestproto.FileWriteRequest) (guestproto.FileInfo, error) {
	p := path.Clean(req.Path)
	dir, base := path.Dir(p), path.Base(p)
	if req.MakeDirs {
		if err := makeDirsIn(root, dir); err != nil {
			return guestproto.FileInfo{}, err
		}
	}
	dfd, err := unix.Openat2(root, strings.TrimPrefix(dir, "/")+"/.", &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return guestproto.FileInfo{}, pathError("open the directory of", p, err)
	}
	defer unix.Close(dfd)
	mode := req.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	var tmp string
	var fd int
	for i := 0; ; i++ {
		tmp = fmt.Sprintf(".%s.kibotos-%d-%d.tmp", base, os.Getpid(), i)
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, uint32(mode))
		if !errors.Is(err, unix.EEXIST) || i > 100 {
			break
		}
	}
	if err != nil {
		return guestproto.FileInfo{}, pathError("create", p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	committed := false
	defer func() {
		if !committed {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if _, err := io.CopyBuffer(f, data, make([]byte, 256<<10)); err != nil {
		return guestproto.FileInfo{}, fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Chmod(mode); err != nil { // the umask took from the create's
		return guestproto.FileInfo{}, err
	}
	if err := f.Sync(); err != nil {
		return guestproto.FileInfo{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return guestproto.FileInfo{}, err
	}
	if err := f.Close(); err != nil {
		return guestproto.FileInfo{}, err
	}
	if err := unix.Renameat(dfd, tmp, dfd, base); err != nil {
		return guestproto.FileInfo{}, pathError("write", p, err)
	}
	committed = true
	fi := guestproto.FileInfo{Path: p, Size: st.Size, Mode: os.FileMode(st.Mode & 0o777), UID: int(st.Uid), GID: int(st.Gid)}
	return fi, nil
}

// makeDirsIn makes the missing directories of dir inside root, each
// resolved in root, with this thread's ids.
func makeDirsIn(root int, dir string) error {
	cur := "."
	for _, name := range strings.Split(strings.Trim(dir, "/"), "/") {
		if name == "" {
			continue
		}
		parent, err := unix.Openat2(root, cur, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
		if err != nil {
			return pathError("open", "/"+strings.TrimPrefix(cur, "./"), err)
		}
		err = unix.Mkdirat(parent, name, 0o755)
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return pathError("make the directory", path.Join("/", cur, name), err)
		}
		cur = path.Join(cur, name)
	}
	return nil
}

// pathError is err of what on p as the guest protocol's error.
func pathError(what, p string, err error) error {
	code := guestproto.CodeFailed
	switch {
	case errors.Is(err, unix.ENOENT):
		code = guestproto.CodeNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		code = guestproto.CodePermissionDenied
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR):
		code = guestproto.CodeInvalid
	}
	return &guestproto.Error{Code: code, Message: fmt.Sprintf("%s %s: %v", what, p, err)}
}
