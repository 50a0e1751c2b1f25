package revert_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kibotos/kibotos/internal/revert"
)

// A failure undoes every step, last first, even past an undo that fails,
// and reports the failed undos' errors.
func TestFailUndoesInReverse(t *testing.T) {
	var ran []string
	r := revert.New(nil)
	boom := errors.New("veth busy")
	for _, name := range []string{"reserve", "network", "unit"} {
		r.Add(name, func(ctx context.Context) error {
			ran = append(ran, name)
			if name == "network" {
				return boom
			}
			return nil
		})
	}
	err := r.Fail(context.Background())
	if want := []string{"unit", "network", "reserve"}; !slices.Equal(ran, want) {
		t.Errorf("undos ran %v, want %v", ran, want)
	}
	if !errors.Is(err, boom) {
		t.Errorf("Fail: %v, want the failed undo's error", err)
	}
	if err := r.Fail(context.Background()); err != nil || len(ran) != 3 {
		t.Errorf("second Fail: %v, undos ran %v; want nothing run again", err, ran)
	}
}

// Undos run even when the operation's context has ended: that is often
// why it failed.
func TestFailOutlivesCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := revert.New(nil)
	var undoErr error
	r.Add("unit", func(ctx context.Context) error {
		undoErr = ctx.Err()
		return nil
	})
	if err := r.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	if undoErr != nil {
		t.Errorf("undo saw a cancelled context: %v", undoErr)
	}
}

// After Success nothing is undone.
func TestSuccessDisarms(t *testing.T) {
	r := revert.New(nil)
	undone := false
	r.Add("unit", func(context.Context) error { undone = true; return nil })
	r.Success()
	if err := r.Fail(context.Background()); err != nil || undone {
		t.Errorf("Fail after Success: %v, undone %v; want nothing undone", err, undone)
	}
}
