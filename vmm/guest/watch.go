package guest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Directory watches (CallWatch): one inotify instance per call, one
// inotify watch per directory. The agent runs as root and the files it
// watches are the Workspace user's: a path resolves inside its root, and
// the directories below it are reached without following any symbolic
// link, so a link cannot make the agent watch (and report the names of)
// its own files. A watch is added through the O_PATH descriptor of the
// directory resolved that way (/proc/self/fd/N), never by a path the
// kernel would resolve again.

// watchMask is what a watched directory reports: fsnotify's events, which
// E2B's envd passes on. IN_EXCL_UNLINK: a file already deleted but still
// open does not report writes under its old name.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM | unix.IN_MODIFY | unix.IN_ATTRIB |
	unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// Bounds of one frame of events: a frame is JSON under
// guestproto.MaxHeaderSize, and what waits to be sent stays small.
const (
	watchFrameEvents = 256
	watchFrameBytes  = 256 << 10
)

// watchWriteTimeout bounds a frame's write: a node that stops reading
// must not pin the watch; meanwhile the kernel queues events, and its
// queue overflowing ends the watch with an error.
const watchWriteTimeout = 30 * time.Second

// watch serves CallWatch: the Response, then frames of events until the
// node closes the stream, the session ends, the watched directory goes
// away (End) or the watch fails (Error).
func (a *agent) watch(s net.Conn, raw json.RawMessage) {
	defer s.Close()
	var req guestproto.WatchRequest
	if err := decodeArgs(raw, &req); err != nil {
		respond(s, nil, err)
		return
	}
	if n := a.watching.Add(1); int(n) > a.opts.MaxWatchCalls {
		a.watching.Add(-1)
		respond(s, nil, &guestproto.Error{Code: guestproto.CodeResourceExhausted,
			Message: fmt.Sprintf("the guest agent runs %d watches, the most it runs at once: stop one first", a.opts.MaxWatchCalls)})
		return
	}
	w, err := openWatch(req, a.opts.MaxWatchDirs)
	if err != nil {
		// The slot is free before the node hears of the refusal.
		a.watching.Add(-1)
		respond(s, nil, err)
		return
	}
	defer a.watching.Add(-1)
	defer w.close()
	w.out = &deadlineWriter{conn: s, d: watchWriteTimeout}
	if err := respond(w.out, nil, nil); err != nil {
		return
	}
	// The node ends the watch by closing its end of the stream; the end
	// of the session ends this read too. Either ends the inotify read.
	nodeDone := make(chan struct{})
	go func() {
		defer close(nodeDone)
		io.Copy(io.Discard, s)
		w.inotify.SetReadDeadline(time.Unix(1, 0))
	}()
	w.run()
	s.SetReadDeadline(time.Unix(1, 0)) // the watch ended first
	<-nodeDone
}

// dirWatch is one call's inotify instance and the directories it watches.
type dirWatch struct {
	path      string   // as the node named it, for errors
	root      int      // O_PATH descriptor of the root
	name      string   // the watched directory in root
	dev, ino  uint64   // the watched directory's identity
	ifd       int      // the inotify instance ...
	inotify   *os.File // ... in Go's poller, so a deadline ends its read
	recursive bool
	max       int
	dirs      map[int32]string // watch descriptor → directory relative to top ("" is top)
	wds       map[string]int32

	out          io.Writer
	pending      []guestproto.WatchEvent
	pendingBytes int
	end          bool              // the watched directory is gone
	failed       *guestproto.Error // ends the watch
	writeErr     error             // the node cannot be written to
}

func openWatch(req guestproto.WatchRequest, max int) (*dirWatch, error) {
	if !path.IsAbs(req.Path) {
		return nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("path %q is not absolute", req.Path)}
	}
	root := req.Root
	if root == "" {
		root = "/"
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("watch root %s: %w", root, err)
	}
	w := &dirWatch{path: req.Path, root: rfd, name: strings.TrimPrefix(path.Clean(req.Path), "/"), recursive: req.Recursive, max: max,
		dirs: map[int32]string{}, wds: map[string]int32{}, ifd: -1}
	if w.name == "" {
		w.name = "."
	}
	fd, err := w.openTop()
	switch {
	case errors.Is(err, unix.ENOENT):
		err = &guestproto.Error{Code: guestproto.CodeNotFound, Message: fmt.Sprintf("%s does not exist", req.Path)}
	case errors.Is(err, unix.ENOTDIR):
		err = &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("%s is not a directory: watch a directory", req.Path)}
	case err != nil:
		err = fmt.Errorf("watch %s: %w", req.Path, err)
	}
	if err != nil {
		w.close()
		return nil, err
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("watch %s: %w", req.Path, err)
	}
	w.dev, w.ino = st.Dev, st.Ino
	if w.ifd, err = unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK); err != nil {
		w.close()
		if errors.Is(err, unix.EMFILE) {
			return nil, &guestproto.Error{Code: guestproto.CodeResourceExhausted, Message: "the guest's inotify instances are used up (fs.inotify.max_user_instances): stop a watch first"}
		}
		return nil, fmt.Errorf("watch %s: inotify: %w", req.Path, err)
	}
	w.inotify = os.NewFile(uintptr(w.ifd), "inotify")
	if err := w.addTree("", false); err != nil {
		w.close()
		return nil, err
	}
	if w.failed != nil {
		err := w.failed
		w.close()
		return nil, err
	}
	return w, nil
}

// close frees the watches (closing the instance removes them all).
func (w *dirWatch) close() {
	if w.inotify != nil {
		w.inotify.Close()
	}
	unix.Close(w.root)
}

// openTop opens the watched directory, resolved in the root again: the
// watch keeps no descriptor of it, which would hold its inode and keep
// the kernel from reporting its removal. A directory that is no longer
// the one watched (the path replaced meanwhile) is reported as gone.
func (w *dirWatch) openTop() (int, error) {
	fd, err := unix.Openat2(w.root, w.name, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil || w.ino == 0 {
		return fd, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != w.dev || st.Ino != w.ino {
		unix.Close(fd)
		return -1, unix.ENOENT
	}
	return fd, nil
}

// run reads events and sends them until the node is gone (the read's
// deadline), the directory is gone or the watch failed.
func (w *dirWatch) run() {
	buf := make([]byte, 64<<10) // many events per read; each at most 16+NAME_MAX+1 bytes
	for {
		n, err := w.inotify.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				w.fail(guestproto.CodeFailed, fmt.Sprintf("watch %s: read inotify: %v", w.path, err))
				w.finish()
			}
			return
		}
		w.parse(buf[:n])
		if w.end || w.failed != nil || w.writeErr != nil {
			w.finish()
			return
		}
		w.flush()
		if w.writeErr != nil {
			return
		}
	}
}

// parse handles every inotify event of one read.
func (w *dirWatch) parse(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent && w.failed == nil && w.writeErr == nil {
		wd := int32(binary.NativeEndian.Uint32(b[0:]))
		mask := binary.NativeEndian.Uint32(b[4:])
		n := int(binary.NativeEndian.Uint32(b[12:]))
		if unix.SizeofInotifyEvent+n > len(b) {
			w.fail(guestproto.CodeFailed, fmt.Sprintf("watch %s: a truncated inotify event", w.path))
			return
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+n]), "\x00")
		b = b[unix.SizeofInotifyEvent+n:]
		w.event(wd, mask, name)
	}
}

// event turns one inotify event into what the node sees.
func (w *dirWatch) event(wd int32, mask uint32, name string) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.fail(guestproto.CodeResourceExhausted, fmt.Sprintf("watch %s: the guest's queue of events overflowed (changes came faster than they were read) and events were lost: watch again", w.path))
		return
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return // a watch dropped already
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		delete(w.wds, dir)
		if dir == "" {
			w.end = true
		}
		return
	}
	if name == "" {
		// The directory's own event: a subdirectory's is reported by its
		// parent, under its name there.
		if dir != "" {
			return
		}
		switch {
		case mask&unix.IN_DELETE_SELF != 0:
			w.emit(".", guestproto.WatchRemove)
		case mask&unix.IN_MOVE_SELF != 0:
			w.emit(".", guestproto.WatchRename)
		case mask&unix.IN_ATTRIB != 0:
			w.emit(".", guestproto.WatchChmod)
		}
		return
	}
	rel := path.Join(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case mask&unix.IN_CREATE != 0:
		w.emit(rel, guestproto.WatchCreate)
		if isDir && w.recursive {
			// What was made in it before its watch is reported as
			// created too.
			w.addLater(rel, true)
		}
	case mask&unix.IN_MOVED_TO != 0:
		w.emit(rel, guestproto.WatchCreate)
		if isDir && w.recursive {
			w.addLater(rel, false)
		}
	case mask&unix.IN_MOVED_FROM != 0:
		w.emit(rel, guestproto.WatchRename)
		if isDir {
			w.drop(rel) // its watches would report under the old name
		}
	case mask&unix.IN_MODIFY != 0:
		w.emit(rel, guestproto.WatchWrite)
	case mask&unix.IN_ATTRIB != 0:
		w.emit(rel, guestproto.WatchChmod)
	case mask&unix.IN_DELETE != 0:
		w.emit(rel, guestproto.WatchRemove)
	}
}

// addLater watches a directory that appeared while watching.
func (w *dirWatch) addLater(rel string, created bool) {
	if err := w.addTree(rel, created); err != nil {
		var ge *guestproto.Error
		if !errors.As(err, &ge) {
			ge = &guestproto.Error{Code: guestproto.CodeFailed, Message: err.Error()}
		}
		w.failed = ge
	}
}

// addTree watches the directory rel and, when recursive, every directory
// below it. created: the directory is new, and what it holds already is
// reported as created. A directory that went away (or became a symbolic
// link) meanwhile is skipped; only the watched directory itself must be
// there.
func (w *dirWatch) addTree(rel string, created bool) error {
	queue := []string{rel}
	for len(queue) > 0 && w.failed == nil {
		d := queue[0]
		queue = queue[1:]
		fd, err := w.openBeneath(d)
		if err != nil {
			if d != "" && gone(err) {
				continue
			}
			return fmt.Errorf("watch %s: open %s: %w", w.path, path.Join(".", d), err)
		}
		subs, err := w.add(fd, d, created)
		unix.Close(fd)
		if err != nil {
			if d != "" && gone(err) {
				continue
			}
			return err
		}
		queue = append(queue, subs...)
		if len(w.dirs)+len(queue) > w.max {
			w.fail(guestproto.CodeResourceExhausted, fmt.Sprintf("watch %s: more than %d directories, the most one watch takes: watch a smaller tree, or without recursive", w.path, w.max))
		}
	}
	return nil
}

// gone: the error of a directory removed, renamed or replaced while it
// was being reached.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV)
}

// openBeneath opens the directory rel below the watched one, refusing
// every symbolic link on the way.
func (w *dirWatch) openBeneath(rel string) (int, error) {
	top, err := w.openTop()
	if err != nil || rel == "" {
		return top, err
	}
	defer unix.Close(top)
	return unix.Openat2(top, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// add watches the directory open as fd (O_PATH) under the name rel and,
// when recursive, returns its subdirectories. report: its entries are
// reported as created.
func (w *dirWatch) add(fd int, rel string, report bool) ([]string, error) {
	wd, err := unix.InotifyAddWatch(w.ifd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return nil, &guestproto.Error{Code: guestproto.CodeResourceExhausted, Message: fmt.Sprintf("watch %s: the guest's inotify watches are used up (fs.inotify.max_user_watches): stop a watch or watch a smaller tree", w.path)}
		}
		return nil, fmt.Errorf("watch %s: add %s: %w", w.path, rel, err)
	}
	if _, ok := w.dirs[int32(wd)]; ok {
		return nil, nil // the same directory reached twice (a bind mount): watched already
	}
	w.dirs[int32(wd)] = rel
	w.wds[rel] = int32(wd)
	if !w.recursive && !report {
		return nil, nil
	}
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("watch %s: list %s: %w", w.path, rel, err)
	}
	f := os.NewFile(uintptr(dfd), rel)
	defer f.Close()
	var subs []string
	for {
		entries, err := f.ReadDir(256)
		for _, e := range entries {
			name := path.Join(rel, e.Name())
			if report {
				w.emit(name, guestproto.WatchCreate)
			}
			if e.IsDir() && w.recursive {
				subs = append(subs, name)
			}
		}
		if err != nil || len(w.dirs)+len(subs) > w.max {
			return subs, nil // io.EOF, or the caller fails the watch
		}
	}
}

// drop stops watching the directory rel and those below it.
func (w *dirWatch) drop(rel string) {
	for d, wd := range w.wds {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			unix.InotifyRmWatch(w.ifd, uint32(wd))
			delete(w.wds, d)
			delete(w.dirs, wd)
		}
	}
}

// emit queues an event, dropping one that repeats the last (a file
// written in many writes), and sends the queue once it is a frame's worth.
func (w *dirWatch) emit(name, op string) {
	if n := len(w.pending); n > 0 && w.pending[n-1].Name == name && w.pending[n-1].Op == op {
		return
	}
	w.pending = append(w.pending, guestproto.WatchEvent{Name: name, Op: op})
	w.pendingBytes += len(name) + 32
	if len(w.pending) >= watchFrameEvents || w.pendingBytes >= watchFrameBytes {
		w.flush()
	}
}

func (w *dirWatch) fail(code, msg string) {
	if w.failed == nil {
		w.failed = &guestproto.Error{Code: code, Message: msg}
	}
}

// flush sends the queued events.
func (w *dirWatch) flush() {
	if len(w.pending) == 0 || w.writeErr != nil || w.out == nil {
		return
	}
	w.writeErr = guestproto.WriteFrame(w.out, guestproto.WatchFrame{Events: w.pending})
	w.pending, w.pendingBytes = w.pending[:0], 0
}

// finish sends the queued events and the watch's end.
func (w *dirWatch) finish() {
	if w.writeErr != nil {
		return
	}
	w.writeErr = guestproto.WriteFrame(w.out, guestproto.WatchFrame{Events: w.pending, End: w.failed == nil, Error: w.failed})
	w.pending = nil
}
