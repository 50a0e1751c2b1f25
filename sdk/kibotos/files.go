package kibotos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Files are the files of a Workspace's guest (Workspace.Files). Paths are
// the Workspace's own: absolute, or relative to /root as a shell there
// takes them. Each call opens its own connection to the guest.
type Files struct{ w *Workspace }

// FileInfo describes a file of the guest.
type FileInfo struct {
	// Name is the last element of Path; Path is in the Workspace.
	Name    string
	Path    string
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
}

// IsDir reports whether it is a directory.
func (fi FileInfo) IsDir() bool { return fi.Mode.IsDir() }

// inWorkspace is p as an absolute path of the Workspace.
func inWorkspace(p string) string {
	if !path.IsAbs(p) {
		p = "/root/" + p
	}
	return path.Clean(p)
}

// guestPath is a Workspace path as the guest agent sees it: path.Clean
// of an absolute path never climbs above /, so none leaves the root.
func guestPath(p string) string { return path.Join(workspaceRoot, inWorkspace(p)) }

func fileInfo(p string, gi guestproto.FileInfo) FileInfo {
	return FileInfo{Name: path.Base(p), Path: p, Size: gi.Size, Mode: gi.Mode, ModTime: gi.ModTime}
}

// fileError is the *Error of a failed file call of the guest.
func (f *Files) fileError(ctx context.Context, what, p string, err error) error {
	var ge *guestproto.Error
	switch {
	case errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound:
		return &Error{Code: CodeNotFound, Err: err, Message: fmt.Sprintf("workspace %s: %s: no such file or directory", f.w.id, p)}
	case errors.As(err, &ge) && ge.Code == guestproto.CodeInvalid:
		return &Error{Code: CodeInvalidArgument, Err: err, Message: fmt.Sprintf("workspace %s: %s %s: %s", f.w.id, what, p, ge.Message)}
	case errors.As(err, &ge):
		return &Error{Code: CodeFailedPrecondition, Err: err, Message: fmt.Sprintf("workspace %s: %s %s: %s", f.w.id, what, p, ge.Message)}
	case ctx.Err() != nil:
		return fmt.Errorf("workspace %s: %s %s: %w", f.w.id, what, p, context.Cause(ctx))
	}
	return &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("workspace %s: %s %s: %v", f.w.id, what, p, err)}
}

// Stat describes the file at p (not following a last symbolic link).
func (f *Files) Stat(ctx context.Context, p string) (FileInfo, error) {
	gc, err := f.w.dataPlane(ctx)
	if err != nil {
		return FileInfo{}, err
	}
	defer gc.Close()
	gi, err := gc.Stat(ctx, guestPath(p))
	if err != nil {
		return FileInfo{}, f.fileError(ctx, "stat", inWorkspace(p), err)
	}
	return fileInfo(inWorkspace(p), gi), nil
}

// Write replaces the file at p with what r holds, with mode (0644 when 0);
// the file changes at once when all of it arrived, never half. Its
// directory must exist.
func (f *Files) Write(ctx context.Context, p string, r io.Reader, mode fs.FileMode) (FileInfo, error) {
	if mode == 0 {
		mode = 0o644
	}
	p = inWorkspace(p)
	gc, err := f.w.dataPlane(ctx)
	if err != nil {
		return FileInfo{}, err
	}
	defer gc.Close()
	gi, err := gc.WriteFile(ctx, guestPath(p), mode, r)
	if err != nil {
		if _, serr := gc.Stat(ctx, guestPath(path.Dir(p))); isGuestNotFound(serr) {
			return FileInfo{}, errorf(CodeNotFound, "workspace %s: directory %s does not exist: make it first (Exec mkdir -p %s)", f.w.id, path.Dir(p), path.Dir(p))
		}
		return FileInfo{}, f.fileError(ctx, "write", p, err)
	}
	return fileInfo(p, gi), nil
}

// WriteFile is Write of data.
func (f *Files) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	_, err := f.Write(ctx, p, bytes.NewReader(data), mode)
	return err
}

// ReadTo copies the file at p to dst as it arrives.
func (f *Files) ReadTo(ctx context.Context, p string, dst io.Writer) (FileInfo, error) {
	p = inWorkspace(p)
	gc, err := f.w.dataPlane(ctx)
	if err != nil {
		return FileInfo{}, err
	}
	defer gc.Close()
	gi, err := gc.ReadFile(ctx, guestPath(p), dst)
	if err != nil {
		return FileInfo{}, f.fileError(ctx, "read", p, err)
	}
	return fileInfo(p, gi), nil
}

// Read reads the whole file at p.
func (f *Files) Read(ctx context.Context, p string) ([]byte, error) {
	var b bytes.Buffer
	if _, err := f.ReadTo(ctx, p, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// listScript prints the names in directory $1, each followed by a NUL
// (no name holds one), with POSIX sh only: Templates bring busybox or
// coreutils or neither, and ls's output is not meant to be parsed.
// ".*" matches . and .. in some shells; an unmatched glob stays itself
// and is dropped unless a file has that very name.
const listScript = `cd "$1" || exit 2
for f in * .*; do
	case $f in .|..) continue ;; esac
	if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\000' "$f"; fi
done`

// maxListing bounds the names List reads (a million short names).
const maxListing = 64 << 20

// List describes the entries of directory dir, sorted by name. The guest
// agent has no directory listing of its own: List runs a fixed POSIX sh
// script in the Workspace for the names and asks the agent for each
// one's metadata, so the Template needs /bin/sh.
func (f *Files) List(ctx context.Context, dir string) ([]FileInfo, error) {
	dir = inWorkspace(dir)
	gc, err := f.w.dataPlane(ctx)
	if err != nil {
		return nil, err
	}
	defer gc.Close()
	gi, err := gc.Stat(ctx, guestPath(dir))
	if err != nil {
		return nil, f.fileError(ctx, "list", dir, err)
	}
	if !gi.Mode.IsDir() {
		return nil, errorf(CodeInvalidArgument, "workspace %s: %s is not a directory: Stat describes a file", f.w.id, dir)
	}
	names, err := f.names(ctx, gc, dir)
	if err != nil {
		return nil, err
	}
	out := make([]FileInfo, 0, len(names))
	for _, name := range names {
		p := path.Join(dir, name)
		gi, err := gc.Stat(ctx, guestPath(p))
		if isGuestNotFound(err) {
			continue // removed since it was listed
		}
		if err != nil {
			return nil, f.fileError(ctx, "stat", p, err)
		}
		out = append(out, fileInfo(p, gi))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// names runs listScript in dir.
func (f *Files) names(ctx context.Context, gc *guestproto.Client, dir string) ([]string, error) {
	req := guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", listScript, "sh", dir}, Root: workspaceRoot, Env: guestproto.WorkspaceEnv}
	p, err := gc.Exec(ctx, req)
	if err != nil {
		return nil, f.w.execStartError(ctx, "/bin/sh", err)
	}
	stop := context.AfterFunc(ctx, func() { gc.Close() })
	defer stop()
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(&out, io.LimitReader(p.Stdout, maxListing)); io.Copy(io.Discard, p.Stdout) })
	wg.Go(func() { io.Copy(&errOut, io.LimitReader(p.Stderr, 4<<10)); io.Copy(io.Discard, p.Stderr) })
	exit, err := p.Wait()
	wg.Wait()
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("workspace %s: list %s: %w", f.w.id, dir, context.Cause(ctx))
	case err != nil:
		return nil, &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("workspace %s: list %s: %v", f.w.id, dir, err)}
	case exit.ExitCode != 0 || exit.Signal != 0:
		return nil, errorf(CodeFailedPrecondition, "workspace %s: list %s: the listing ended with status %d: %s", f.w.id, dir, exit.ExitCode, strings.TrimSpace(errOut.String()))
	case out.Len() >= maxListing:
		return nil, errorf(CodeResourceExhausted, "workspace %s: list %s: more than %d MiB of names: list a smaller directory", f.w.id, dir, maxListing>>20)
	}
	return parseNames(out.Bytes()), nil
}

// parseNames splits listScript's output; a last name cut short (no NUL
// after it) is dropped.
func parseNames(b []byte) []string {
	var names []string
	for {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return names
		}
		if i > 0 {
			names = append(names, string(b[:i]))
		}
		b = b[i+1:]
	}
}

func isGuestNotFound(err error) bool {
	var ge *guestproto.Error
	return errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound
}
