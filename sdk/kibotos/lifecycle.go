package kibotos

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Refresh reads the Workspace again.
func (w *Workspace) Refresh(ctx context.Context) error {
	var r api.Workspace
	if err := w.c.do(ctx, http.MethodGet, workspacePath(w.id, ""), nil, nil, &r); err != nil {
		return err
	}
	w.set(&r)
	return nil
}

// Wait waits until the Workspace is in one of states. A FAILED Workspace
// (when FAILED is not among them) is an error saying why: ErrResourceExhausted
// when no node has room for it, ErrFailedPrecondition otherwise.
func (w *Workspace) Wait(ctx context.Context, states ...string) error {
	if len(states) == 0 {
		return errorf(CodeInvalidArgument, "kibotos: workspace %s: Wait needs the states to wait for, such as kibotos.StateAvailable", w.id)
	}
	return w.wait(ctx, "", states...)
}

// wait is Wait, with back the state a command that failed leaves the
// Workspace in with its last_error (AVAILABLE for a pause, PAUSED for a
// resume), "" for none. The reads block on the server until the version
// passes the one seen, so a change is seen the moment it is applied.
func (w *Workspace) wait(ctx context.Context, back string, states ...string) error {
	for {
		switch {
		case slices.Contains(states, w.State):
			return nil
		case w.State == StateFailed:
			return w.failedError()
		case w.State == back && w.Failure != "":
			return errorf(CodeFailedPrecondition, "workspace %s is %s again: %s", w.ID, w.State, w.Failure)
		}
		var r api.Workspace
		if err := w.c.do(ctx, http.MethodGet, workspacePath(w.id, ""), blockingQuery(w.Version), nil, &r); err != nil {
			return err
		}
		w.set(&r)
	}
}

// waitGone waits until the Workspace no longer exists.
func (w *Workspace) waitGone(ctx context.Context) error {
	for {
		var r api.Workspace
		err := w.c.do(ctx, http.MethodGet, workspacePath(w.id, ""), blockingQuery(w.Version), nil, &r)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		w.set(&r)
		if w.State == StateFailed {
			return w.failedError()
		}
	}
}

func (w *Workspace) failedError() error {
	if w.failureReason == api.FailureResourceExhausted {
		return errorf(CodeResourceExhausted, "workspace %s has no node to run on (FAILED, %s)", w.ID, w.Failure)
	}
	return errorf(CodeFailedPrecondition, "workspace %s is FAILED (%s)", w.ID, w.Failure)
}

// op sends a lifecycle command and waits until the Workspace reaches
// want (gone for ""), unless NoWait.
func (w *Workspace) op(ctx context.Context, verb, back, want string, opts []CallOption) error {
	var r api.Workspace
	if err := w.c.do(ctx, http.MethodPost, workspacePath(w.id, verb), nil, api.WorkspaceWriteRequest{WriteMeta: writeMeta()}, &r); err != nil {
		return err
	}
	w.set(&r)
	if options(opts).noWait {
		return nil
	}
	if want == "" {
		if r.DeletedAt != nil {
			return nil // nothing ran: gone at once
		}
		return w.waitGone(ctx)
	}
	return w.wait(ctx, back, want)
}

// Pause saves the guest (memory and all) and stops it; Resume brings it
// back where it was. It waits until PAUSED unless NoWait.
func (w *Workspace) Pause(ctx context.Context, opts ...CallOption) error {
	return w.op(ctx, "pause", StateAvailable, StatePaused, opts)
}

// Resume starts a PAUSED Workspace from its saved guest (or a STOPPED
// one afresh) and waits until it is AVAILABLE unless NoWait.
func (w *Workspace) Resume(ctx context.Context, opts ...CallOption) error {
	return w.op(ctx, "start", StatePaused, StateAvailable, opts)
}

// Stop stops the guest, keeping its disk, and waits until STOPPED
// unless NoWait.
func (w *Workspace) Stop(ctx context.Context, opts ...CallOption) error {
	return w.op(ctx, "stop", "", StateStopped, opts)
}

// Delete deletes the Workspace (its Volumes stay) and waits until it is
// gone unless NoWait.
func (w *Workspace) Delete(ctx context.Context, opts ...CallOption) error {
	return w.op(ctx, "delete", "", "", opts)
}

// Fork makes a new Workspace from this PAUSED one: a copy of its disk
// and memory, running on from where it was paused. It waits until the
// fork is AVAILABLE unless NoWait.
func (w *Workspace) Fork(ctx context.Context, opts ...CallOption) (*Workspace, error) {
	return w.c.Workspaces.Create(ctx, WorkspaceSpec{From: w.id}, opts...)
}

// SetTimeout ends the Workspace d from now with its timeout action (or
// action, when given), and makes d the length of every later run; 0
// removes the end.
func (w *Workspace) SetTimeout(ctx context.Context, d time.Duration, action ...string) error {
	if err := api.CheckTimeout(d); err != nil {
		return errorf(CodeInvalidArgument, "kibotos: workspace %s: %v", w.id, err)
	}
	req := api.WorkspaceTimeoutRequest{WriteMeta: writeMeta(), Timeout: d.String()}
	if len(action) > 1 {
		return errorf(CodeInvalidArgument, "kibotos: workspace %s: SetTimeout takes one action, not %d", w.id, len(action))
	}
	if len(action) == 1 {
		req.OnTimeout = action[0]
	}
	var r api.Workspace
	if err := w.c.do(ctx, http.MethodPost, workspacePath(w.id, "timeout"), nil, req, &r); err != nil {
		return err
	}
	w.set(&r)
	return nil
}
