// Package revert undoes the finished steps of an operation that failed
// part way, last first, as Incus's revert package does: each step that
// changed something registers its undo as soon as it succeeded, so a
// failure at any later step leaves nothing of the earlier ones behind.
// It owns only the order and the reporting of undos; it never decides
// whether an operation failed, and never retries an undo.
package revert

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Undo reverses one step. It gets a context that is not cancelled with
// the operation's (see Fail) and bounds its own wait where it can block.
type Undo func(ctx context.Context) error

type undo struct {
	name string
	f    Undo
}

// Reverter collects the undos of an operation's steps. The zero value is
// not usable: make one with New. It is not safe for concurrent use: one
// operation runs its steps in order.
type Reverter struct {
	log   *slog.Logger
	undos []undo
	done  bool
}

// New makes a Reverter that logs each failed undo to log (nil: none).
func New(log *slog.Logger) *Reverter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reverter{log: log}
}

// Add registers the undo of the step name, which has just succeeded.
func (r *Reverter) Add(name string, f Undo) {
	r.undos = append(r.undos, undo{name, f})
}

// Fail runs every registered undo once, last added first, and returns
// their errors joined (nil when all succeeded). An undo's failure does
// not stop the ones before it: each reverses a step of its own. The
// undos run under ctx without its cancellation: the operation usually
// failed because ctx ended, and what it set up must still be taken down.
// After Fail or Success, Fail does nothing.
func (r *Reverter) Fail(ctx context.Context) error {
	if r.done {
		return nil
	}
	r.done = true
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for i := len(r.undos) - 1; i >= 0; i-- {
		u := r.undos[i]
		t0 := time.Now()
		if err := u.f(ctx); err != nil {
			r.log.Warn("undo of a failed step failed", "step", u.name, "err", err, "took", time.Since(t0).Round(time.Millisecond))
			errs = append(errs, err)
		}
	}
	r.undos = nil
	return errors.Join(errs...)
}

// Success disarms the Reverter: the operation completed and keeps what
// its steps made.
func (r *Reverter) Success() {
	r.done = true
	r.undos = nil
}
