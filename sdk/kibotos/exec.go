package kibotos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// workspaceRoot is where a guest mounts its Workspace's filesystem:
// processes run chrooted there and files are found under it. A variable
// only for the tests, whose guest agent serves a directory of the test
// host.
var workspaceRoot = guestproto.WorkspaceRoot

// connectTimeout bounds reaching the guest through its node's data plane.
const connectTimeout = 30 * time.Second

// dataPlane opens a session to the Workspace's guest through the data
// plane of its node, with a fresh credential (which resumes a PAUSED
// Workspace with AutoResume first).
func (w *Workspace) dataPlane(ctx context.Context) (*guestproto.Client, error) {
	if w.c.dataRoots == nil {
		// Before the credential is asked for: it would be spent for nothing.
		return nil, errorf(CodeInvalidArgument, "kibotos: workspace %s: the data plane of its node serves a certificate of the cluster CA: give the cluster CA (tls/ca.crt of a ctrl member) in Options.CAFile or CAPEM", w.id)
	}
	var cred api.DataPlaneCredential
	if err := w.c.do(ctx, http.MethodPost, workspacePath(w.id, "credentials"), nil, struct{}{}, &cred); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	gc, err := dataplane.Connect(cctx, cred, w.c.dataRoots)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("workspace %s: %w", w.id, context.Cause(ctx))
		}
		return nil, &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("workspace %s: %v", w.id, err)}
	}
	return gc, nil
}

// ExecOptions are a command's streams and environment; nil: no input,
// output discarded.
type ExecOptions struct {
	// Stdin is copied to the command's input until it ends; nil: none.
	Stdin io.Reader
	// Stdout and Stderr receive its output as it comes; nil: discarded.
	// The same writer for both gets one Write at a time.
	Stdout, Stderr io.Writer
	// Env are KEY=VALUE added to (and overriding) the Template's
	// environment.
	Env []string
	// Dir is the working directory; "" the Template's (or /).
	Dir string
}

// ExecResult is how a command ended.
type ExecResult struct {
	// ExitCode is its exit status, 128+Signal when a signal ended it (as
	// a shell reports it).
	ExitCode int
	Signal   int
}

// Exec runs argv in the Workspace and waits until it ended and its output
// was copied; like os/exec, it also waits for the copy of Stdin to end.
// A command that exits non-zero is not an error: read ExitCode. A command
// not found in PATH is ErrNotFound, one that cannot start (not
// executable, its working directory missing) ErrFailedPrecondition.
// Ending ctx kills the command's process (what it started in the
// background goes on, as after any exec).
func (w *Workspace) Exec(ctx context.Context, argv []string, opts *ExecOptions) (ExecResult, error) {
	if len(argv) == 0 {
		return ExecResult{}, errorf(CodeInvalidArgument, "kibotos: workspace %s: exec needs a command", w.id)
	}
	if opts == nil {
		opts = &ExecOptions{}
	}
	gc, err := w.dataPlane(ctx)
	if err != nil {
		return ExecResult{}, err
	}
	defer gc.Close()
	// Only the caller's are explicit: a Template built from an OCI image
	// replaces the defaults with the image's Env.
	req := guestproto.ExecRequest{Argv: argv, Root: workspaceRoot, Dir: opts.Dir, Env: append([]string(nil), opts.Env...), Stdin: opts.Stdin != nil}.WithWorkspaceEnv(gc.Info())
	p, err := gc.Exec(ctx, req)
	if err != nil {
		return ExecResult{}, w.execStartError(ctx, argv[0], err)
	}
	// The command dies with ctx: its streams end with the session.
	stop := context.AfterFunc(ctx, func() {
		p.Signal(syscall.SIGKILL)
		gc.Close()
	})
	defer stop()
	stdout, stderr := outputs(opts.Stdout, opts.Stderr)
	var wg sync.WaitGroup
	if p.Stdin != nil {
		wg.Go(func() {
			io.Copy(p.Stdin, opts.Stdin)
			p.Stdin.Close()
		})
	}
	wg.Go(func() { io.Copy(stdout, p.Stdout) })
	wg.Go(func() { io.Copy(stderr, p.Stderr) })
	exit, err := p.Wait()
	wg.Wait()
	if ctx.Err() != nil {
		return ExecResult{}, fmt.Errorf("workspace %s: exec %s: %w", w.id, argv[0], context.Cause(ctx))
	}
	if err != nil {
		return ExecResult{}, &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("workspace %s: exec %s: %v (the Workspace may have been paused or stopped meanwhile: Refresh tells)", w.id, argv[0], err)}
	}
	if exit.Signal != 0 {
		return ExecResult{ExitCode: 128 + exit.Signal, Signal: exit.Signal}, nil
	}
	return ExecResult{ExitCode: exit.ExitCode}, nil
}

// execStartError is the error of a command the guest did not start.
func (w *Workspace) execStartError(ctx context.Context, name string, err error) error {
	var ge *guestproto.Error
	switch {
	case errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound:
		return &Error{Code: CodeNotFound, Err: err, Message: fmt.Sprintf("workspace %s: %s", w.id, ge.Message)}
	case errors.As(err, &ge):
		return &Error{Code: CodeFailedPrecondition, Err: err, Message: fmt.Sprintf("workspace %s: exec %s: %s", w.id, name, ge.Message)}
	case ctx.Err() != nil:
		return fmt.Errorf("workspace %s: exec %s: %w", w.id, name, context.Cause(ctx))
	}
	return &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("workspace %s: exec %s: %v", w.id, name, err)}
}

// outputs are the writers of the command's output: io.Discard for nil,
// and one writer taking a Write at a time when both are the same.
func outputs(stdout, stderr io.Writer) (io.Writer, io.Writer) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	if sameWriter(stdout, stderr) && stdout != io.Discard {
		one := &lockedWriter{w: stdout}
		return one, one
	}
	return stdout, stderr
}

// sameWriter compares two writers; == panics on a type that cannot be
// compared (a writer that is a slice or map).
func sameWriter(a, b io.Writer) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
