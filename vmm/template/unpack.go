package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds of an unpacked image when the build gives no --size: an image's
// layers are not trusted to be small, nor to be few files.
const (
	unpackMaxBytes   = 64 << 30
	unpackMaxMembers = 1 << 21
)

// inRoot resolves every path under the unpacker's tree as if the tree
// were /: an absolute symbolic link or a ".." the archive made leads to
// the tree's top, never out of it.
const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// unpacker writes a tar stream that is not trusted (an image's flattened
// layers, an OCI image-layout archive) into a directory tree. No member
// lands outside the tree: names climbing out with ".." are refused,
// absolute names are taken from the tree's top as GNU tar does, and every
// path is opened with openat2(RESOLVE_IN_ROOT), so a symbolic link the
// archive made earlier is followed within the tree only. Each name is
// written once and the first writer wins, as mutate.Extract emits the
// upper layers first. Device nodes need root, like the owners; modes,
// owners, extended attributes and times are kept for mkfs.ext4 -d.
type unpacker struct {
	root       *os.File
	asRoot     bool
	maxBytes   int64
	maxMembers int
	bytes      int64
	members    int
	// dirs get their modes and owners last, deepest first, so a
	// read-only directory is still filled; links are made last, as a
	// hard link of an upper layer may come before its target.
	dirs  []*tar.Header
	links []*tar.Header
}

func newUnpacker(tree string, maxBytes int64) (*unpacker, error) {
	root, err := os.Open(tree)
	if err != nil {
		return nil, err
	}
	if maxBytes <= 0 {
		maxBytes = unpackMaxBytes
	}
	return &unpacker{root: root, asRoot: os.Geteuid() == 0, maxBytes: maxBytes, maxMembers: unpackMaxMembers}, nil
}

func (u *unpacker) Close() error { return u.root.Close() }

// readError is a failure to read the stream rather than to write a
// member: for a registry, the network.
type readError struct{ err error }

func (e readError) Error() string { return e.err.Error() }
func (e readError) Unwrap() error { return e.err }

// watchedReader remembers the first error of the stream under the tar
// reader, so a failed copy can tell reading from writing.
type watchedReader struct {
	r   io.Reader
	err error
}

func (w *watchedReader) Read(b []byte) (int, error) {
	n, err := w.r.Read(b)
	if err != nil && err != io.EOF && w.err == nil {
		w.err = err
	}
	return n, err
}

// unpack writes every member of the tar stream r, then the hard links and
// the directories' attributes.
func (u *unpacker) unpack(ctx context.Context, r io.Reader) error {
	src := &watchedReader{r: r}
	tr := tar.NewReader(src)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			// Read on to the stream's end: mutate.Extract closes its tar
			// (the end-of-archive blocks) before it reports why it
			// stopped, an unsafe name or a failed download, so a failed
			// extract looks like a complete one until its error.
			if _, err := io.Copy(io.Discard, src); err != nil {
				return readError{err}
			}
			break
		}
		if err != nil {
			return readError{err}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := u.member(hdr, tr); err != nil {
			if src.err != nil {
				return readError{src.err}
			}
			return fmt.Errorf("member %q: %w", hdr.Name, err)
		}
	}
	for _, hdr := range u.links {
		if err := u.link(hdr); err != nil {
			return fmt.Errorf("member %q: %w", hdr.Name, err)
		}
	}
	sort.SliceStable(u.dirs, func(i, j int) bool {
		return strings.Count(u.dirs[i].Name, "/") > strings.Count(u.dirs[j].Name, "/")
	})
	for _, hdr := range u.dirs {
		fd, err := u.open(hdr.Name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return fmt.Errorf("member %q: %w", hdr.Name, err)
		}
		err = u.setAttrs(fd, hdr)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("member %q: %w", hdr.Name, err)
		}
	}
	return nil
}

// memberPath is the member's path relative to the tree's top ("." for the
// top itself).
func memberPath(name string) (string, error) {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", errors.New("its name climbs out of the tree with ..")
		}
	}
	if strings.ContainsRune(name, 0) {
		return "", errors.New("its name holds a NUL byte")
	}
	rel := strings.TrimLeft(path.Clean("/"+name), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

func (u *unpacker) member(hdr *tar.Header, r io.Reader) error {
	rel, err := memberPath(hdr.Name)
	if err != nil {
		return err
	}
	hdr.Name = rel
	if u.members++; u.members > u.maxMembers {
		return fmt.Errorf("more than %d members: an image of that many files is not supported", u.maxMembers)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if hdr.Typeflag == tar.TypeLink {
		u.links = append(u.links, hdr)
		return nil
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("the top of the tree must be a directory")
		}
		u.dirs = append(u.dirs, hdr)
		return nil
	}
	dir, err := u.mkdirAll(path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	base := path.Base(rel)
	switch hdr.Typeflag {
	case tar.TypeDir:
		err := unix.Mkdirat(dir, base, 0o700)
		if errors.Is(err, unix.EEXIST) {
			var st unix.Stat_t
			if unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return nil // an upper layer's file
			}
			err = nil
		}
		if err != nil {
			return err
		}
		u.dirs = append(u.dirs, hdr)
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
		if hdr.Size > u.maxBytes-u.bytes {
			return fmt.Errorf("the image's files exceed %s: give a larger --size", formatSize(u.maxBytes))
		}
		fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			return nil // an upper layer's
		}
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		n, err := io.CopyN(f, r, hdr.Size)
		u.bytes += n
		if err != nil {
			return err
		}
		return u.setAttrs(fd, hdr)
	case tar.TypeSymlink:
		err := unix.Symlinkat(hdr.Linkname, dir, base)
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		if err != nil {
			return err
		}
		return u.setAttrsAt(dir, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if kind != unix.S_IFIFO && !u.asRoot {
			return errors.New("is a device node, which only root may make: build as root")
		}
		err := unix.Mknodat(dir, base, kind|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))))
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		if err != nil {
			return err
		}
		return u.setAttrsAt(dir, base, hdr)
	default:
		return fmt.Errorf("has tar type %q, which a root file system cannot hold", hdr.Typeflag)
	}
	return nil
}

// link makes a deferred hard link. Its target resolves inside the tree,
// like any other path.
func (u *unpacker) link(hdr *tar.Header) error {
	target, err := memberPath(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	tdir, err := u.open(path.Dir(target), unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("hard link to %q: no such file in the image", hdr.Linkname)
	}
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	defer unix.Close(tdir)
	dir, err := u.mkdirAll(path.Dir(hdr.Name))
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	err = unix.Linkat(tdir, path.Base(target), dir, path.Base(hdr.Name), 0)
	switch {
	case errors.Is(err, unix.EEXIST):
		return nil
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("hard link to %q: no such file in the image", hdr.Linkname)
	case err != nil:
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

// open opens rel under the tree.
func (u *unpacker) open(rel string, flags int) (int, error) {
	return unix.Openat2(int(u.root.Fd()), rel, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: inRoot})
}

// mkdirAll opens the directory rel, making it and its parents (0755)
// when missing: a lower layer's entry for them may come later.
func (u *unpacker) mkdirAll(rel string) (int, error) {
	fd, err := u.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if !errors.Is(err, unix.ENOENT) || rel == "." {
		return fd, err
	}
	parent, err := u.mkdirAll(path.Dir(rel))
	if err != nil {
		return -1, err
	}
	err = unix.Mkdirat(parent, path.Base(rel), 0o755)
	unix.Close(parent)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return u.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
}

// setAttrs gives the open file or directory fd the member's owner, mode,
// extended attributes and times. The owner goes first: chown clears the
// set-id bits.
func (u *unpacker) setAttrs(fd int, hdr *tar.Header) error {
	if u.asRoot {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		err := unix.Fsetxattr(fd, name, []byte(v), 0)
		switch {
		case err == nil, errors.Is(err, unix.ENOTSUP):
		case errors.Is(err, unix.EPERM) && !u.asRoot: // trusted.* and security.* are root's
		default:
			return fmt.Errorf("extended attribute %s: %w", name, err)
		}
	}
	ts := memberTimes(hdr)
	return unix.Futimes(fd, []unix.Timeval{unix.NsecToTimeval(ts[0].Nano()), unix.NsecToTimeval(ts[1].Nano())})
}

// setAttrsAt is setAttrs for what cannot be opened to write: a symbolic
// link or a device node this unpacker just made as name in dir.
func (u *unpacker) setAttrsAt(dir int, name string, hdr *tar.Header) error {
	if u.asRoot {
		if err := unix.Fchownat(dir, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if hdr.Typeflag != tar.TypeSymlink { // a link's mode is always 0777
		if err := unix.Fchmodat(dir, name, uint32(hdr.Mode&0o7777), 0); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(dir, name, memberTimes(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

// memberTimes are the access and modification times of a member; one
// without any gets the epoch rather than the time of the build.
func memberTimes(hdr *tar.Header) []unix.Timespec {
	mtime, atime := hdr.ModTime, hdr.AccessTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	if atime.IsZero() {
		atime = mtime
	}
	return []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
}

// replaceFile puts content at rel, replacing what the image has there
// (not a directory), root-owned with mode.
func (u *unpacker) replaceFile(rel string, content []byte, mode uint32) error {
	dir, err := u.mkdirAll(path.Dir(rel))
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	base := path.Base(rel)
	if err := unix.Unlinkat(dir, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("replace %s: %w", rel, err)
	}
	fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if _, err := f.Write(content); err != nil {
		return err
	}
	if u.asRoot {
		if err := f.Chown(0, 0); err != nil {
			return err
		}
	}
	return f.Chmod(os.FileMode(mode))
}

// formatSize is n in GiB or MiB for messages.
func formatSize(n int64) string {
	if n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
