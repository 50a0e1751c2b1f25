package guest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// watchLog collects a watch's events as they come.
type watchLog struct {
	w      *guestproto.Watcher
	mu     sync.Mutex
	events []guestproto.WatchEvent
	done   chan struct{}
}

func startWatch(t *testing.T, c *guestproto.Client, req guestproto.WatchRequest) *watchLog {
	t.Helper()
	w, err := c.Watch(ctxT(t), req)
	if err != nil {
		t.Fatalf("watch %+v: %v", req, err)
	}
	l := &watchLog{w: w, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for e := range w.Events() {
			l.mu.Lock()
			l.events = append(l.events, e)
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		w.Close()
		<-l.done
	})
	return l
}

func (l *watchLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.events)
}

func (l *watchLog) has(name, op string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Name == name && e.Op == op {
			return true
		}
	}
	return false
}

// waitFor waits until the watch reported op on name.
func (l *watchLog) waitFor(t *testing.T, name, op string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("a %s event of %s", op, name), func() (bool, string) {
		return l.has(name, op), l.String()
	})
}

// mark creates the file name in dir and waits for its event: inotify
// reports one instance's events in order, so what was not reported by
// then never will be.
func (l *watchLog) mark(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, name, guestproto.WatchCreate)
}

func guestCode(err error) string {
	if ge := guestErr(err); ge != nil {
		return ge.Code
	}
	return ""
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// A watch on the data channel reports what happens to the names of its
// directory: create, write, chmod, rename (the old name renamed, the new
// one created) and remove; then the removal of the directory itself ends
// it without an error.
func TestWatchEvents(t *testing.T) {
	h := startAgent(t, Options{})
	data := h.dialOn(h.plugData())
	if !data.Info().Has(guestproto.CapWatch) {
		t.Fatalf("data channel capabilities %v lack %s", data.Info().Capabilities, guestproto.CapWatch)
	}
	root := t.TempDir()
	dir := filepath.Join(root, "home", "user")
	mkdirs(t, dir)
	l := startWatch(t, data, guestproto.WatchRequest{Root: root, Path: "/home/user"})

	f, err := os.Create(filepath.Join(dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	l.waitFor(t, "a", guestproto.WatchCreate)
	f.WriteString("hello")
	f.Close()
	l.waitFor(t, "a", guestproto.WatchWrite)
	os.Chmod(filepath.Join(dir, "a"), 0o600)
	l.waitFor(t, "a", guestproto.WatchChmod)
	os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	l.waitFor(t, "a", guestproto.WatchRename)
	l.waitFor(t, "b", guestproto.WatchCreate)
	os.Remove(filepath.Join(dir, "b"))
	l.waitFor(t, "b", guestproto.WatchRemove)

	os.Remove(dir)
	l.waitFor(t, ".", guestproto.WatchRemove)
	wait(t, l.done, "the events to end with the watched directory")
	if err := l.w.Err(); err != nil {
		t.Errorf("the watched directory removed: %v, want a clean end", err)
	}
}

// Recursive: a file in a directory made after the watch started is
// reported (also when made at once with its directory), under its path
// relative to the watched directory, and after the directory moved under
// its new name; a watch that is not recursive reports only the top.
func TestWatchRecursive(t *testing.T) {
	h := startAgent(t, Options{})
	data := h.dialOn(h.plugData())
	root := t.TempDir()
	dir := filepath.Join(root, "w")
	mkdirs(t, filepath.Join(dir, "old"))
	rec := startWatch(t, data, guestproto.WatchRequest{Root: root, Path: "/w", Recursive: true})
	flat := startWatch(t, data, guestproto.WatchRequest{Root: root, Path: "/w"})

	os.WriteFile(filepath.Join(dir, "old", "f"), []byte("1"), 0o644)
	rec.waitFor(t, "old/f", guestproto.WatchCreate)

	mkdirs(t, filepath.Join(dir, "new", "sub"))
	os.WriteFile(filepath.Join(dir, "new", "sub", "f"), nil, 0o644)
	rec.waitFor(t, "new", guestproto.WatchCreate)
	rec.waitFor(t, "new/sub/f", guestproto.WatchCreate)
	// The new directory's watch sees what comes later too.
	os.WriteFile(filepath.Join(dir, "new", "sub", "f"), []byte("later"), 0o644)
	rec.waitFor(t, "new/sub/f", guestproto.WatchWrite)

	os.Rename(filepath.Join(dir, "new"), filepath.Join(dir, "moved"))
	rec.waitFor(t, "new", guestproto.WatchRename)
	rec.waitFor(t, "moved", guestproto.WatchCreate)
	os.WriteFile(filepath.Join(dir, "moved", "sub", "g"), nil, 0o644)
	rec.waitFor(t, "moved/sub/g", guestproto.WatchCreate)

	flat.mark(t, dir, "marker")
	if !flat.has("new", guestproto.WatchCreate) {
		t.Errorf("the flat watch missed the top's new directory: %s", flat)
	}
	for _, e := range strings.Fields("old/f new/sub/f moved/sub/g") {
		if flat.has(e, guestproto.WatchCreate) || flat.has(e, guestproto.WatchWrite) {
			t.Errorf("the flat watch reported %s below its directory: %s", e, flat)
		}
	}
}

// Paths resolve inside the root: a symbolic link to a directory of the
// agent's own files resolves inside the root (where it names nothing),
// one inside the root is followed there, and a recursive watch does not
// descend through a link. A file, a relative path and a missing one are
// refused, saying so.
func TestWatchSymlinks(t *testing.T) {
	h := startAgent(t, Options{})
	data := h.dialOn(h.plugData())
	ctx := ctxT(t)
	root, outside := t.TempDir(), t.TempDir()
	dir := filepath.Join(root, "w")
	mkdirs(t, dir)
	os.WriteFile(filepath.Join(root, "file"), nil, 0o644)
	for link, target := range map[string]string{"/escape": outside, "/w/escape": outside, "/up": "../..", "/inside": "/w"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}

	for _, c := range []struct{ path, code, msg string }{
		{"/escape", guestproto.CodeNotFound, "/escape does not exist"},
		{"/file", guestproto.CodeInvalid, "/file is not a directory"},
		{"w", guestproto.CodeInvalid, "not absolute"},
		{"/nothing", guestproto.CodeNotFound, "/nothing does not exist"},
	} {
		w, err := data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: c.path})
		if err == nil {
			w.Close()
		}
		if guestCode(err) != c.code || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("watch %s: %v, want %s saying %q", c.path, err, c.code, c.msg)
		}
	}

	// "/up" is the root itself; "/inside" is /w.
	up := startWatch(t, data, guestproto.WatchRequest{Root: root, Path: "/up"})
	inside := startWatch(t, data, guestproto.WatchRequest{Root: root, Path: "/inside", Recursive: true})
	os.WriteFile(filepath.Join(outside, "secret"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	inside.waitFor(t, "f", guestproto.WatchCreate)
	up.mark(t, root, "marker")
	inside.mark(t, dir, "marker")
	if up.has("secret", guestproto.WatchCreate) || inside.has("escape/secret", guestproto.WatchCreate) {
		t.Errorf("a watch reported a file outside the root: %s; %s", up, inside)
	}
}

// inotifyFDs counts the inotify instances of this process: the agent's,
// since it runs in the test.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// Closing a watch frees it in the agent: its inotify instance and
// goroutines go, and the slot it held takes a new watch. Watches past
// the agent's bounds are refused, and a tree growing past them ends its
// watch with an error.
func TestWatchBoundsAndClose(t *testing.T) {
	h := startAgent(t, Options{MaxWatchCalls: 2, MaxWatchDirs: 3})
	data := h.dialOn(h.plugData())
	ctx := ctxT(t)
	root := t.TempDir()
	mkdirs(t, filepath.Join(root, "small", "a"), filepath.Join(root, "big", "a"), filepath.Join(root, "big", "b", "c"))
	// A call answered: the agent's side of the session runs.
	if _, err := data.GuestInfo(ctx); err != nil {
		t.Fatal(err)
	}
	before, goroutines := inotifyFDs(t), testenv.LiveGoroutines()

	_, err := data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: "/big", Recursive: true})
	if guestCode(err) != guestproto.CodeResourceExhausted || !strings.Contains(err.Error(), "more than 3 directories") {
		t.Errorf("a tree of 4 directories with a bound of 3: %v", err)
	}
	first, err := data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: "/big"}) // not recursive: one directory
	if err != nil {
		t.Fatal(err)
	}
	second, err := data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: "/small", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := inotifyFDs(t); n != before+2 {
		t.Errorf("%d inotify instances with two watches, %d before", n, before)
	}
	if _, err := data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: "/small"}); guestCode(err) != guestproto.CodeResourceExhausted {
		t.Errorf("a third watch with a bound of 2: %v", err)
	}
	first.Close()
	var third *guestproto.Watcher
	testenv.WaitFor(t, 10*time.Second, "a closed watch's slot to take a new one", func() (bool, string) {
		third, err = data.Watch(ctx, guestproto.WatchRequest{Root: root, Path: "/small"})
		return err == nil, fmt.Sprint(err)
	})
	third.Close()

	// /small holds 2 directories; 2 more pass the bound.
	mkdirs(t, filepath.Join(root, "small", "b", "c"))
	for range second.Events() {
	}
	if err := second.Err(); guestCode(err) != guestproto.CodeResourceExhausted || !strings.Contains(err.Error(), "more than 3 directories") {
		t.Errorf("a watched tree grown past the bound: %v", err)
	}
	second.Close()

	testenv.WaitFor(t, 10*time.Second, "the agent to free the inotify instances of closed watches", func() (bool, string) {
		n := inotifyFDs(t)
		return n == before, fmt.Sprintf("%d instances, %d before", n, before)
	})
	testenv.WaitGoroutinesEnd(t, goroutines, "github.com/kibotos/kibotos/vmm/guest", 10*time.Second)
}

// Events the kernel could not queue (IN_Q_OVERFLOW: the node read too
// slowly) end the watch with an error frame after the events before them,
// rather than a watch that silently missed some.
func TestWatchOverflowEndsWithError(t *testing.T) {
	w, err := openWatch(guestproto.WatchRequest{Root: t.TempDir(), Path: "/"}, guestproto.MaxWatchDirs)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	var out bytes.Buffer
	w.out = &out
	event := func(wd int32, mask uint32, name string) []byte {
		b := make([]byte, unix.SizeofInotifyEvent+16)
		binary.NativeEndian.PutUint32(b[0:], uint32(wd))
		binary.NativeEndian.PutUint32(b[4:], mask)
		binary.NativeEndian.PutUint32(b[12:], 16)
		copy(b[unix.SizeofInotifyEvent:], name)
		return b
	}
	var top int32
	for wd := range w.dirs {
		top = wd
	}
	w.parse(append(event(top, unix.IN_CREATE, "a"), event(-1, unix.IN_Q_OVERFLOW, "")...))
	w.finish()
	var f guestproto.WatchFrame
	if err := guestproto.ReadFrame(&out, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Events) != 1 || f.Events[0] != (guestproto.WatchEvent{Name: "a", Op: guestproto.WatchCreate}) || f.End ||
		f.Error == nil || f.Error.Code != guestproto.CodeResourceExhausted || !strings.Contains(f.Error.Message, "events were lost") {
		t.Errorf("an overflow: %+v (error %+v)", f, f.Error)
	}
}
