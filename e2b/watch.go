package e2b

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// filesystem.Filesystem/WatchDir: the guest agent watches the directory
// with inotify (guestproto.CallWatch) and its events are streamed as
// envd streams them: a start message once the watch is in place, then a
// message per event, its name relative to the watched directory, and
// keepalives. The watch ends with the request: its Connect-Timeout-Ms
// (the SDK's timeoutMs, 60 s by default) ends it with deadline_exceeded.
// The SDK does not call the polling watchers (CreateWatcher,
// GetWatcherEvents, RemoveWatcher); they answer unimplemented.

// exitNotDir is the exit code of the path check below for a path that is
// not a directory.
const exitNotDir = 47

// watchDirRequest is filesystem.proto's WatchDirRequest.
type watchDirRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

// watchDirResponse is filesystem.proto's WatchDirResponse: one of start,
// filesystem and keepalive.
type watchDirResponse struct {
	Start      *struct{}        `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *struct{}        `json:"keepalive,omitempty"`
}

type filesystemEvent struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// eventTypes are filesystem.proto's EventType names of the guest's ops.
var eventTypes = map[string]string{
	guestproto.WatchCreate: "EVENT_TYPE_CREATE",
	guestproto.WatchWrite:  "EVENT_TYPE_WRITE",
	guestproto.WatchRemove: "EVENT_TYPE_REMOVE",
	guestproto.WatchRename: "EVENT_TYPE_RENAME",
	guestproto.WatchChmod:  "EVENT_TYPE_CHMOD",
}

// watchDir is filesystem.Filesystem/WatchDir: its events as they come
// (streamRPC: its errors, those before the start too, end the stream).
func (h *handler) watchDir(w http.ResponseWriter, r *http.Request, id string) {
	var req watchDirRequest
	h.streamRPC(w, r, id, &req, func(r *http.Request) error { return checkWatch(r, &req) }, func(r *http.Request, gc *guestproto.Client) error {
		watcher, err := startWatch(r, gc, id, &req)
		if err != nil {
			return err
		}
		defer watcher.Close()
		s := newStream(w)
		if s.send(watchDirResponse{Start: &struct{}{}}) != nil {
			return nil
		}
		streamWatch(r.Context(), s, watcher, keepaliveInterval(r), id, req.Path)
		return nil
	})
}

// checkWatch refuses what is not served, saying so.
func checkWatch(r *http.Request, req *watchDirRequest) error {
	switch {
	case req.Path == "":
		return rpcErrorf("invalid_argument", "WatchDir: the path is empty")
	case req.IncludeEntry:
		return rpcErrorf("unimplemented", "WatchDir: includeEntry is not served by Kibotos yet: watch without it and call getInfo for the entries you need")
	}
	return nil
}

// startWatch checks the path as the request's user and starts the
// guest's watch of it, which follows the request.
func startWatch(r *http.Request, gc *guestproto.Client, id string, req *watchDirRequest) (*guestproto.Watcher, error) {
	ctx := r.Context()
	if !gc.Info().Has(guestproto.CapWatch) {
		return nil, rpcErrorf("unimplemented", "sandbox %s: its guest agent predates directory watches: create the sandbox again to watch directories", id)
	}
	dir, err := watchedDir(r, gc, req.Path)
	if err != nil {
		return nil, err
	}
	watcher, err := gc.Watch(ctx, guestproto.WatchRequest{Path: dir, Root: guestproto.WorkspaceRoot, Recursive: req.Recursive})
	if err != nil {
		return nil, guestWatchError(id, req.Path, err)
	}
	return watcher, nil
}

// watchedDir is the directory path names for the request's user: made
// absolute from the user's home, its links resolved as the user sees
// them, refused when the user may not list it, as envd watches as the
// sandbox's user.
func watchedDir(r *http.Request, gc *guestproto.Client, path string) (string, error) {
	var out bytes.Buffer
	code, stderr, err := runScript(r.Context(), gc, scriptExec(r, absolute+`[ -e "$p" ] || exit 44; [ -d "$p" ] || exit 47; `+
		`{ [ -r "$p" ] && [ -x "$p" ]; } || { echo "$p: Permission denied" >&2; exit 1; }; cd -- "$p" && pwd -P`,
		[]string{path}, false), nil, &limitedBuffer{b: &out, max: 64 << 10})
	switch {
	case err != nil:
		return "", err
	case code == exitNotDir:
		return "", rpcErrorf("invalid_argument", "%s is not a directory: watch a directory", path)
	case code != 0:
		return "", fileError(code, stderr, path)
	}
	dir := strings.TrimSuffix(out.String(), "\n")
	if !strings.HasPrefix(dir, "/") {
		return "", rpcErrorf("internal", "%s: the sandbox resolved it to %q, not an absolute path", path, dir)
	}
	return dir, nil
}

// guestWatchError is a guest's refusal of a watch as a Connect error.
func guestWatchError(id, path string, err error) error {
	var ge *guestproto.Error
	if !errors.As(err, &ge) {
		return rpcErrorf("unavailable", "sandbox %s: watch %s: %v (the sandbox may have been paused or killed meanwhile)", id, path, err)
	}
	switch ge.Code {
	case guestproto.CodeNotFound:
		return rpcErrorf("not_found", "%s: no such directory", path)
	case guestproto.CodeInvalid:
		return rpcErrorf("invalid_argument", "%s: %s", path, ge.Message)
	case guestproto.CodeResourceExhausted:
		return rpcErrorf("resource_exhausted", "sandbox %s: %s", id, ge.Message)
	}
	return rpcErrorf("internal", "sandbox %s: watch %s: %s", id, path, ge.Message)
}

// watchSource is a running watch: *guestproto.Watcher.
type watchSource interface {
	Events() <-chan guestproto.WatchEvent
	Err() error
}

// streamWatch sends the watch's events until it ends, ctx's deadline
// passes (deadline_exceeded) or the client went away (ctx canceled, or a
// write failed). A keepalive goes out after every quiet interval.
func streamWatch(ctx context.Context, s *stream, src watchSource, every time.Duration, id, path string) {
	t := time.NewTicker(every)
	defer t.Stop()
	events := src.Events()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				s.end(rpcErrorf("deadline_exceeded", "sandbox %s: the watch of %s reached the request's timeout (timeoutMs): watch again to go on", id, path))
			}
			return
		case <-t.C:
			if s.send(watchDirResponse{Keepalive: &struct{}{}}) != nil {
				return
			}
		case e, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					events = nil // ctx's case says why
					continue
				}
				s.end(watchEndError(src.Err(), id, path))
				return
			}
			typ, known := eventTypes[e.Op]
			if !known {
				continue
			}
			if s.send(watchDirResponse{Filesystem: &filesystemEvent{Name: e.Name, Type: typ}}) != nil {
				return
			}
			t.Reset(every)
		}
	}
}

// watchEndError is how a watch that ended on its own ends its stream:
// without an error when the watched directory went away.
func watchEndError(err error, id, path string) error {
	if err == nil {
		return nil
	}
	var ge *guestproto.Error
	if errors.As(err, &ge) && ge.Code == guestproto.CodeResourceExhausted {
		return rpcErrorf("resource_exhausted", "sandbox %s: %s", id, ge.Message)
	}
	return rpcErrorf("unavailable", "sandbox %s: lost the watch of %s: %v (the sandbox may have been paused or killed meanwhile)", id, path, err)
}
