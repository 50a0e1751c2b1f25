package fsm

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// commandKeys are the keys of the command records, in key order.
func commandKeys(t testing.TB, f *FSM) []string {
	t.Helper()
	var keys []string
	if err := f.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCommands).ForEach(func(k, _ []byte) error { keys = append(keys, string(k)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// commandHistory applies commands over three hours on node-a: raw-id
// records (as entries of builds before LevelEntryFormat) and digest ones,
// one with the longest id a command may have. It returns the time after
// the first two hours.
func commandHistory(h *harness) time.Time {
	h.t.Helper()
	readyNode(h)
	var cut time.Time
	for hour := 0; hour < 3; hour++ {
		var es []Entry
		for i := 0; i < 40; i++ {
			opts := []entryOpt{withCommand(fmt.Sprintf("h%d-c%02d", hour, i))}
			if i%2 == 0 {
				opts = append(opts, withCommandDigest())
			}
			op := OpNodeDrain
			if i%4 == 1 {
				op = OpNodeCancelDrain
			}
			es = append(es, h.entry(op, NodeArgs{NodeID: "node-a"}, opts...))
			h.advance(time.Second)
		}
		if hour == 1 {
			es = append(es, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(strings.Repeat("y", bolt.MaxKeySize)), withCommandDigest()))
		}
		h.apply(es...)
		h.advance(time.Hour)
		if hour == 1 {
			cut = h.now
		}
	}
	return cut
}

// restored is a new FSM restored from f's snapshot.
func restored(t testing.TB, f *FSM) *FSM {
	t.Helper()
	var snap bytes.Buffer
	if err := f.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	return restoredFrom(t, &snap)
}

// restoredFrom is a new FSM restored from the snapshot snap.
func restoredFrom(t testing.TB, snap io.Reader) *FSM {
	t.Helper()
	g := openFSM(t)
	if err := g.Restore(snap); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestCommandsExpireByTime: expiry reads the time index and drops the
// same records the scan of every record (older builds) does, whatever the
// key of a record; a state restored from a snapshot holds the same index
// as the one that applied the entries.
func TestCommandsExpireByTime(t *testing.T) {
	h := newHarness(t)
	cut := commandHistory(h)
	if mustDump(t, h.f) != mustDump(t, restored(t, h.f)) {
		t.Fatal("a restored state differs from the one it was taken of")
	}
	r := h.ok(OpCommandsExpire, CommandsExpireArgs{Before: cut})
	if got := decode[map[string]int](t, r)["expired"]; got != 81 {
		t.Errorf("expired %d records, want the 81 of the first two hours", got)
	}
	left := commandKeys(t, h.f)
	if len(left) != 40 {
		t.Errorf("%d records left after the expiry, want the third hour's 40", len(left))
	}
	for _, k := range left {
		if k[0] == 0 {
			continue // digest keys: their ids are not in them
		}
		if !strings.HasPrefix(k, "h2-") {
			t.Errorf("record %q of the first two hours left", k)
		}
	}
	// What is left is the third hour's, and its index entries.
	if n := indexLen(t, h.f); n != 40 {
		t.Errorf("time index holds %d entries, want 40", n)
	}
	h.expectUnchanged(h.entry(OpCommandsExpire, CommandsExpireArgs{Before: cut}))
}

// TestCommandTimesRebuilt: a restored state whose index an older build
// did not keep (its snapshot has none, or records were added without
// entries and the clock moved on) gets the index built anew, so expiry
// still drops every old record.
func TestCommandTimesRebuilt(t *testing.T) {
	for name, older := range map[string]func(tx *bolt.Tx) error{
		"snapshot without the index": func(tx *bolt.Tx) error {
			if err := tx.DeleteBucket(bucketCommandTimes); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Delete(keyCommandTimesAt)
		},
		"records added by an older build": func(tx *bolt.Tx) error {
			// An older build stores a record and moves the clock, not
			// the mark.
			rec := commandRecord{Op: OpNodeDrain, InputHash: "x", AppliedAt: t0}
			if err := putJSON(tx, bucketCommands, []byte("older"), rec); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyClock, []byte(t0.Add(100*time.Hour).Format(time.RFC3339Nano)))
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			cut := commandHistory(h)
			if err := h.f.db.Update(older); err != nil {
				t.Fatal(err)
			}
			want := len(commandKeys(t, h.f)) - 40
			g := restored(t, h.f)
			if n, records := indexLen(t, g), len(commandKeys(t, g)); n != records {
				t.Fatalf("restored index holds %d entries for %d records", n, records)
			}
			r := g.Apply([]Entry{makeEntry(h.now, OpCommandsExpire, CommandsExpireArgs{Before: cut})})[0]
			if got := decode[map[string]int](t, r)["expired"]; got != want {
				t.Errorf("expired %d records, want %d", got, want)
			}
			if left := commandKeys(t, g); len(left) != 40 {
				t.Errorf("%d records left, want the third hour's 40", len(left))
			}
		})
	}
}

func indexLen(t testing.TB, f *FSM) int {
	t.Helper()
	n := 0
	if err := f.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketCommandTimes).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCommandsExpireLimit: an expiry with a limit drops at most that many
// records, oldest first, and says when older ones are left; the next
// drops the rest.
func TestCommandsExpireLimit(t *testing.T) {
	if LevelExpireLimit > FeatureLevel {
		t.Fatalf("LevelExpireLimit %d above this build's level %d", LevelExpireLimit, FeatureLevel)
	}
	h := newHarness(t)
	cut := commandHistory(h)
	h.fail(api.CodeInvalidArgument, OpCommandsExpire, CommandsExpireArgs{Before: cut, Limit: -1})
	first := decode[CommandsExpireResult](t, h.ok(OpCommandsExpire, CommandsExpireArgs{Before: cut, Limit: 50}))
	if first != (CommandsExpireResult{Expired: 50, More: true}) {
		t.Fatalf("first bounded expiry %+v, want 50 and more", first)
	}
	// The oldest went first: every record of the first hour is gone.
	for _, k := range commandKeys(t, h.f) {
		if strings.HasPrefix(k, "h0-") {
			t.Errorf("record %q of the first hour left after the oldest 50 went", k)
		}
	}
	second := decode[CommandsExpireResult](t, h.ok(OpCommandsExpire, CommandsExpireArgs{Before: cut, Limit: 50}))
	if second != (CommandsExpireResult{Expired: 31}) {
		t.Fatalf("second bounded expiry %+v, want the 31 left and no more", second)
	}
	if left := commandKeys(t, h.f); len(left) != 40 {
		t.Errorf("%d records left, want the third hour's 40", len(left))
	}
}
