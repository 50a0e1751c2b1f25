package fsm

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"reflect"
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

// ---------------------------------------------------------------------------
// commands.expire

func TestCommandsExpire(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	drain := func(id string) Entry { return h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(id)) }
	h.expect("", drain("c0"))
	t1 := h.now.Add(time.Hour)
	h.now = t1
	h.expect("", h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("c1")))
	h.advance(time.Hour)
	h.expect("", drain("c2"))

	commands := func() []string {
		var ids []string
		h.f.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketCommands).ForEach(func(k, _ []byte) error { ids = append(ids, string(k)); return nil })
		})
		return ids
	}
	if got := commands(); !reflect.DeepEqual(got, []string{"c0", "c1", "c2"}) {
		t.Fatalf("commands %v", got)
	}
	h.advance(time.Minute)
	r := h.ok(OpCommandsExpire, CommandsExpireArgs{Before: t1})
	if got := decode[map[string]int](t, r)["expired"]; got != 1 {
		t.Errorf("expired %d", got)
	}
	if got := commands(); !reflect.DeepEqual(got, []string{"c1", "c2"}) {
		t.Fatalf("commands after expire %v", got)
	}
	// Nothing older than t1 is left.
	h.expectUnchanged(h.entry(OpCommandsExpire, CommandsExpireArgs{Before: t1}))
	// c1 still replays; c0 is forgotten and runs again.
	v := h.version("node-a")
	if r := h.expectUnchanged(h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("c1"))); !r.Replayed {
		t.Error("c1 not replayed")
	}
	if r := h.expect("", drain("c0")); r.Replayed {
		t.Error("expired c0 replayed")
	}
	if got := h.version("node-a"); got != v+1 {
		t.Errorf("version %d, want %d", got, v+1)
	}
	// Expire everything.
	h.advance(time.Minute)
	r = h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now.Add(time.Nanosecond)})
	if got := decode[map[string]int](t, r)["expired"]; got != 3 {
		t.Errorf("expired %d", got)
	}
	if got := commands(); len(got) != 0 {
		t.Errorf("commands %v", got)
	}
}

// ---------------------------------------------------------------------------
// Idempotency

func TestIdempotentReplay(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	v := h.version("node-a")
	e := h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-a"), withVersion(v), withActor("alice"))
	first := h.expect("", e)
	if first.Replayed {
		t.Fatal("first apply marked replayed")
	}
	after := h.dump()
	if h.version("node-a") != v+1 {
		t.Fatal("drain did not bump the version")
	}

	check := func(name string, e Entry) {
		t.Helper()
		r := h.expectUnchanged(e)
		if !r.Replayed || r.Error != nil || !bytes.Equal(r.Value, first.Value) {
			t.Errorf("%s: got %+v value %s, want replay of %s", name, r, r.Value, first.Value)
		}
	}
	h.advance(time.Minute)
	check("same entry later", makeEntry(h.now, e.Op, nil, withArgsOf(e), withCommand("drain-a"), withVersion(v)))
	check("other actor", makeEntry(h.now, e.Op, nil, withArgsOf(e), withCommand("drain-a"), withVersion(v), withActor("bob")))
	check("args with other whitespace", makeEntry(h.now, e.Op, nil, withRawArgs(`{ "node_id" : "node-a" }`), withCommand("drain-a"), withVersion(v)))
	// Replays also inside one batch.
	rs := h.apply(e, e)
	for i, r := range rs {
		if !r.Replayed || !bytes.Equal(r.Value, first.Value) {
			t.Errorf("batch %d: %+v", i, r)
		}
	}
	if h.version("node-a") != v+1 || h.dump() != after {
		t.Error("replays changed the state")
	}

	// Same id with other inputs.
	h.expect(api.CodeFailedPrecondition, h.entry(OpNodeDrain, NodeArgs{NodeID: ctrlID}, withCommand("drain-a"), withVersion(v)))
	h.expect(api.CodeFailedPrecondition, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-a"), withVersion(v+1)))
	h.expect(api.CodeFailedPrecondition, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-a")))
	h.expect(api.CodeFailedPrecondition, h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-a"), withVersion(v)))
	h.expect(api.CodeFailedPrecondition, h.entry(OpNodeDrain, nil, withRawArgs(`{"node_id":"node-a","x":1}`), withCommand("drain-a"), withVersion(v)))
	// An unknown op with a used id is refused by the id check first.
	h.expect(api.CodeFailedPrecondition, h.entry("node.teleport", NodeArgs{NodeID: "node-a"}, withCommand("drain-a"), withIgnoreUnknown()))

	// Without a command id the same drain runs again.
	if r := h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}); r.Replayed {
		t.Error("entry without command id replayed")
	}
	if h.version("node-a") != v+2 {
		t.Error("drain without command id had no effect")
	}
}

func TestIdempotentReplayKeepsTheFirstResult(t *testing.T) {
	// The replayed result is the one of the first apply, even when the
	// state has moved on since.
	h := newHarness(t)
	readyNode(h)
	e := h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2}, withCommand("open-2"))
	first := h.expect("", e)
	h.advance(time.Second)
	h.open("node-a", "s3", 3)
	r := h.expectUnchanged(e)
	if !r.Replayed || !bytes.Equal(r.Value, first.Value) || !sessionOpenResult(t, r).Accepted {
		t.Errorf("replay %+v", r)
	}
	// A refusal is a successful apply and is recorded too.
	refused := h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s4", Incarnation: 1}, withCommand("open-1"))
	r1 := h.expect("", refused)
	r2 := h.expectUnchanged(refused)
	if !r2.Replayed || !bytes.Equal(r1.Value, r2.Value) || sessionOpenResult(t, r2).Refusal != RefusalStale {
		t.Errorf("refusal replay %+v", r2)
	}
}

func TestFailedCommandIsNotRecorded(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	// Precondition failure: isolate with a live session.
	iso := h.entry(OpNodeIsolate, NodeArgs{NodeID: "node-a"}, withCommand("iso-1"))
	h.expect(api.CodeFailedPrecondition, iso)
	h.expect(api.CodeFailedPrecondition, iso) // still not recorded: evaluated again
	h.closeSession("node-a", "s1")
	h.advance(time.Second)
	r := h.expect("", iso)
	if r.Replayed {
		t.Fatal("retry after fixing the precondition replayed a failure")
	}
	if !h.node("node-a").Isolated {
		t.Fatal("not isolated")
	}
	if r := h.expectUnchanged(iso); !r.Replayed {
		t.Error("success not recorded")
	}

	// Version mismatch: the same id may be retried with the right version.
	v := h.version("node-a")
	h.fail(api.CodeVersionMismatch, OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-1"), withVersion(v-1))
	if r := h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("drain-1"), withVersion(v)); r.Replayed {
		t.Error("replayed")
	}
	// Invalid arguments are not recorded either.
	h.fail(api.CodeInvalidArgument, OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(17000)}, withCommand("oc-1"))
	h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(2000)}, withCommand("oc-1"))
	if d := h.overcommitDefault(); d.CPU != 2000 {
		t.Errorf("default %+v", d)
	}
}

// A command id bbolt cannot store as a key is refused before the handler
// runs: otherwise the change would be applied behind an error result and a
// retry would apply it again.
func TestCommandIDTooLong(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	h.fail(api.CodeInvalidArgument, OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(strings.Repeat("x", bolt.MaxKeySize+1)))
	if h.node("node-a").DrainRequested {
		t.Fatal("drain applied")
	}
	longest := strings.Repeat("y", bolt.MaxKeySize)
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(longest))
	if r := h.expectUnchanged(h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(longest))); !r.Replayed {
		t.Error("longest command id not replayed")
	}
}

func withCommandDigest() entryOpt { return func(e *Entry) { e.CommandDigest = true } }

// withCommandLog flags an entry as a leader of LevelCommandLog does.
func withCommandLog() entryOpt {
	return func(e *Entry) { e.CommandDigest, e.CommandLog = true, true }
}

// An entry with CommandDigest keys its command record by the id's digest,
// never by the id (a long id made a deep page path of every insert); it
// still finds a record the same command left under the id before every
// voter reached the level, refuses the id with other inputs, and expires
// like any other.
func TestCommandRecordsByDigest(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	long := strings.Repeat("k", 1024)
	keys := func() (ids []string) {
		h.f.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketCommands).ForEach(func(k, _ []byte) error { ids = append(ids, fmt.Sprintf("%x", k)); return nil })
		})
		return ids
	}
	drain := h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(long), withCommandDigest())
	h.expect("", drain)
	sum := sha256.Sum256([]byte(long))
	if got, want := keys(), []string{fmt.Sprintf("00%x", sum)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("command keys %v, want %v", got, want)
	}
	if r := h.expectUnchanged(drain); !r.Replayed {
		t.Fatal("the digest-keyed command did not replay")
	}
	if e := h.fail(api.CodeFailedPrecondition, OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand(long), withCommandDigest()); !strings.Contains(e.Message, "already used for node.drain") {
		t.Fatalf("the id with other inputs: %v", e)
	}

	// Applied under the id (below the level), replayed with the digest.
	h.expect("", h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("old-1")))
	if r := h.expectUnchanged(h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("old-1"), withCommandDigest())); !r.Replayed {
		t.Fatal("a command recorded under its id did not replay with CommandDigest")
	}

	h.advance(time.Hour)
	h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now})
	if got := keys(); len(got) != 0 {
		t.Fatalf("commands left after expire: %v", got)
	}
}
