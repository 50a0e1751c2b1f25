package guestproto

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// What happened to a name in a watched directory. The names are
// fsnotify's, which E2B's envd reports: a name moved in is a create, one
// moved away a rename.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
)

// Default bounds of the guest agent's watches: each watched directory is
// an inotify watch, kernel memory the guest's user could otherwise make
// the agent pin without end, and each call is an inotify instance (the
// kernel allows 128 per user by default).
const (
	MaxWatchDirs  = 8192 // directories one call watches
	MaxWatchCalls = 64   // calls watching at once
)

// WatchRequest watches the directory Path (absolute) as seen from Root
// ("" is the agent's own /). Every symbolic link on the way resolves
// inside Root; with Recursive the directories below Path are watched
// too, those made later as well, never through a symbolic link.
type WatchRequest struct {
	Path      string `json:"path"`
	Root      string `json:"root,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
}

// WatchEvent is one thing that happened to Name, the path relative to
// the watched directory ("." is the directory itself).
type WatchEvent struct {
	Name string `json:"name"`
	Op   string `json:"op"`
}

// WatchFrame is one frame of a watch's stream after its Response.
type WatchFrame struct {
	Events []WatchEvent `json:"events,omitempty"`
	// End: the watched directory is gone; no event follows.
	End bool `json:"end,omitempty"`
	// Error ends a watch that could not go on (events lost to a full
	// queue, a bound reached).
	Error *Error `json:"error,omitempty"`
}

// Watcher is a directory watch started by Client.Watch.
type Watcher struct {
	s       net.Conn
	ctx     context.Context
	c       *Client
	release func()
	events  chan WatchEvent
	quit    chan struct{}
	done    chan struct{}
	close   sync.Once
	err     error
}

// Watch watches a directory of the guest until ctx ends or Close. An
// error of the start (a path that is no directory, a bound reached) is a
// *Error.
func (c *Client) Watch(ctx context.Context, req WatchRequest) (*Watcher, error) {
	s, release, err := c.open(ctx, CallWatch, req)
	if err != nil {
		return nil, err
	}
	if err := readResponse(s, CallWatch, nil); err != nil {
		release()
		s.Close()
		var ge *Error
		if errors.As(err, &ge) {
			return nil, err
		}
		return nil, c.streamErr(ctx, CallWatch, err)
	}
	w := &Watcher{s: s, ctx: ctx, c: c, release: release, events: make(chan WatchEvent), quit: make(chan struct{}), done: make(chan struct{})}
	go w.read()
	return w, nil
}

// read passes the stream's events on until it ends; Close waits for it.
func (w *Watcher) read() {
	// done first: Err is valid once a range over Events ended.
	defer close(w.events)
	defer close(w.done)
	for {
		var f WatchFrame
		if err := ReadFrame(w.s, &f); err != nil {
			select {
			case <-w.quit: // Close cut the stream
			default:
				w.err = w.c.streamErr(w.ctx, CallWatch, err)
			}
			return
		}
		for _, e := range f.Events {
			select {
			case w.events <- e:
			case <-w.quit:
				return
			}
		}
		switch {
		case f.Error != nil:
			f.Error.Call = CallWatch
			w.err = f.Error
			return
		case f.End:
			return
		}
	}
}

// Events are the watch's events in the order they happened. The channel
// is closed when the watch ended; Err then says why.
func (w *Watcher) Events() <-chan WatchEvent { return w.events }

// Err is why the events ended: nil when the watched directory went away
// or Close ended them, else the watch's failure (a *Error from the guest, or
// the stream's: the session lost, ctx ended). Valid once Events is closed.
func (w *Watcher) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Close ends the watch; the guest frees its watches as it sees the
// stream's end. It returns once the reader ended.
func (w *Watcher) Close() error {
	w.close.Do(func() {
		close(w.quit)
		w.s.Close()
		w.s.SetReadDeadline(time.Unix(1, 0))
		<-w.done
		w.release()
	})
	return nil
}
