package fsm

import "fmt"

// HaltError means a batch cannot be applied here the way every other
// replica applies it: an operation this binary does not know, or an
// internal failure (a bbolt write or commit, a record that does not encode
// or decode). Nothing of the batch was committed. The replica must stop
// applying the log rather than record a result the others do not: Raft
// cannot refuse an entry, so the member stops; after it is fixed (or
// upgraded) it replays the log from its last snapshot and applies the
// entry like everyone else.
type HaltError struct {
	// Pos is the entry's position in the batch, -1 when the batch as a
	// whole did not commit.
	Pos int
	// Op is the entry's operation ("" when Pos is -1).
	Op string
	// Unknown: this binary has no handler for Op (a newer release wrote
	// the entry without IgnoreUnknown).
	Unknown bool
	// Err is the internal failure (nil when Unknown).
	Err error
}

func (e *HaltError) Error() string {
	switch {
	case e.Unknown:
		return fmt.Sprintf("operation %q is unknown to this kibotos; upgrade it to the release of the leader", e.Op)
	case e.Pos < 0:
		return fmt.Sprintf("commit state: %v", e.Err)
	default:
		return fmt.Sprintf("operation %q failed inside its transaction: %v", e.Op, e.Err)
	}
}

func (e *HaltError) Unwrap() error { return e.Err }
