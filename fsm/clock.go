package fsm

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The FSM clock is the latest IssuedAt of the log so far. A new leader
// whose clock is behind the old one's would otherwise issue earlier times
// than entries already applied (a grant issued after it expired, a session
// ending before it started). Every entry moves the clock, accepted or not
// and known or not, so the clock depends on the log alone: replicas of
// every release and every batch split agree on it.

// clampIssuedAt sets e's time to max(e.IssuedAt, clock) and returns the
// clock after e.
func clampIssuedAt(e *Entry, clock time.Time) time.Time {
	if e.IssuedAt.Before(clock) {
		e.IssuedAt = clock
		return clock
	}
	return e.IssuedAt.UTC()
}

// getClock reads the FSM clock; zero before the first entry (and in a
// snapshot of a release without it).
func getClock(tx *bolt.Tx) (time.Time, error) {
	var t time.Time
	raw := tx.Bucket(bucketMeta).Get(keyClock)
	if raw == nil {
		return t, nil
	}
	if err := t.UnmarshalText(raw); err != nil {
		return t, fmt.Errorf("state record %s/%s is corrupt: %w", bucketMeta, keyClock, err)
	}
	return t, nil
}

func putClock(tx *bolt.Tx, t time.Time) error {
	raw, err := t.UTC().MarshalText()
	if err != nil {
		return fmt.Errorf("state record %s/%s: %w", bucketMeta, keyClock, err)
	}
	if err := tx.Bucket(bucketMeta).Put(keyClock, raw); err != nil {
		return err
	}
	for _, mark := range derivedMarks {
		if err := tx.Bucket(bucketMeta).Put(mark, raw); err != nil {
			return err
		}
	}
	return nil
}
