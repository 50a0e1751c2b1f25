// Package ctxsleep is the one wait between retries the code base uses:
// a sleep that a cancelled context ends early.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends; then it returns the context's cause
// (its Err when it has none).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
