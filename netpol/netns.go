package netpol

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultNamespaceDir is where iproute2 keeps named network namespaces, so
// `ip netns exec kibotos-<instance> ...` works for an operator.
const DefaultNamespaceDir = "/run/netns"

// Namespaces is the directory of named network namespaces the node and the
// VMM units' service manager share. A namespace is pinned by a bind mount of
// its nsfs file onto a file in Dir.
type Namespaces struct {
	// Dir is the directory in this process's mount namespace.
	Dir string
	// ManagerDir is the same directory as the service manager sees it (the
	// NetworkNamespacePath of a VMM unit is resolved there); a private
	// systemd has its own /run backed by a host directory. Empty: Dir.
	ManagerDir string
}

// ManagerPath is the path of a namespace for the service manager.
func (n Namespaces) ManagerPath(name string) string {
	if n.ManagerDir == "" {
		return filepath.Join(n.Dir, name)
	}
	return filepath.Join(n.ManagerDir, name)
}

// Path is the path of a namespace in this process's mount namespace.
func (n Namespaces) Path(name string) string { return filepath.Join(n.Dir, name) }

// EnsureShared makes Dir a mount point with shared propagation, as
// iproute2 does for /run/netns: a namespace mounted there afterwards also
// appears in every mount namespace that copied Dir while it was shared (a
// service manager in its own mount namespace, a node unit with a private
// /tmp), and its unmount reaches them too.
func (n Namespaces) EnsureShared() error {
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return fmt.Errorf("netpol: namespace directory %s: %w", n.Dir, err)
	}
	err := unix.Mount("", n.Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point yet: bind it onto itself first.
		if err = unix.Mount(n.Dir, n.Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", n.Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("netpol: make namespace directory %s a shared mount: %w", n.Dir, err)
	}
	return nil
}

// Exists says whether a named namespace is mounted.
func (n Namespaces) Exists(name string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(n.Path(name), &st) != nil || unix.Stat(n.Dir, &parent) != nil {
		return false
	}
	// A pinned namespace is an nsfs inode; a left-over empty file is not.
	var fs unix.Statfs_t
	return unix.Statfs(n.Path(name), &fs) == nil && fs.Type == unix.NSFS_MAGIC
}

// Create makes a new network namespace pinned at Dir/name. An existing one
// of that name is an error: the caller decides whether to delete it.
func (n Namespaces) Create(name string) (err error) {
	if err := validName(name); err != nil {
		return err
	}
	path := n.Path(name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("netpol: namespace %s: %w", name, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			os.Remove(path)
		}
	}()
	// unshare(CLONE_NEWNET) moves only this OS thread; it is moved back
	// before it is released. If moving back fails the thread stays locked
	// and Go ends it with the goroutine, so no goroutine ever runs in a
	// namespace it did not ask for.
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- fmt.Errorf("netpol: namespace %s: current namespace: %w", name, err)
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("netpol: namespace %s: unshare: %w", name, err)
			runtime.UnlockOSThread()
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		merr := unix.Mount(self, path, "none", unix.MS_BIND, "")
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(merr, fmt.Errorf("netpol: namespace %s: return to the node's namespace: %w", name, err))
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		if merr != nil {
			merr = fmt.Errorf("netpol: namespace %s: pin at %s: %w", name, path, merr)
		}
		done <- merr
	}()
	return <-done
}

// Open returns a handle of a named namespace; the caller closes it.
func (n Namespaces) Open(name string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(n.Path(name))
	if err != nil {
		return netns.None(), fmt.Errorf("netpol: namespace %s: open: %w", name, err)
	}
	return h, nil
}

// Delete unpins a namespace; the kernel frees it (and every link in it)
// once no process and no open handle holds it. Gone already is fine.
func (n Namespaces) Delete(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	path := n.Path(name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netpol: namespace %s: unmount %s: %w", name, path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netpol: namespace %s: %w", name, err)
	}
	return nil
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name || len(name) > 255 {
		return fmt.Errorf("netpol: namespace name %q: want one path element", name)
	}
	return nil
}

// InNamespace runs f on an OS thread that is in ns for the duration: a
// sysctl under /proc/sys/net (which shows the namespace of the thread that
// opens it), a socket (which stays in the namespace it was made in), a
// tap (made by an ioctl of the calling thread's namespace).
func InNamespace(ns netns.NsHandle, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			done <- errors.Join(ferr, err)
			return // the thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// unmountAll detaches dir's own mount (EnsureShared's bind) and anything
// under it.
func unmountAll(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("netpol: unmount %s: %w", dir, err)
	}
	return nil
}
