package fsm

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// logKeys are the keys of the command log, in key order.
func logKeys(t testing.TB, f *FSM) [][]byte {
	t.Helper()
	var keys [][]byte
	if err := f.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCommandLog).ForEach(func(k, _ []byte) error { keys = append(keys, bytes.Clone(k)); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}

// An entry with CommandLog appends its record to the command log, under
// its time and its key's digest, and nowhere else; a retry replays it,
// also on a replica restored from a snapshot (whose index is built from
// the log), and the id with other inputs is refused.
func TestCommandLog(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	long := strings.Repeat("k", bolt.MaxKeySize)
	var drains []Entry
	for i, id := range []string{"c-2", "c-1", long} {
		h.advance(time.Second)
		op := OpNodeDrain
		if i == 1 {
			op = OpNodeCancelDrain
		}
		drains = append(drains, h.entry(op, NodeArgs{NodeID: "node-a"}, withCommand(id), withCommandLog()))
		h.expect("", drains[i])
	}
	if keys := commandKeys(t, h.f); len(keys) != 0 {
		t.Fatalf("the command bucket holds %q; the log's records belong in the log", keys)
	}
	keys := logKeys(t, h.f)
	if len(keys) != 3 {
		t.Fatalf("the command log holds %d records, want 3", len(keys))
	}
	for i, k := range keys {
		want := commandTimeKey(drains[i].IssuedAt, commandKey(&drains[i]))
		if !bytes.Equal(k, want) {
			t.Errorf("record %d under %x, want %x (time order, the key's digest)", i, k, want)
		}
	}

	g := restored(t, h.f)
	for name, f := range map[string]*FSM{"applying": h.f, "restored": g} {
		for i, e := range drains {
			before := mustDump(t, f)
			r := f.Apply([]Entry{e})[0]
			if r.Error != nil || !r.Replayed {
				t.Errorf("%s replica: retry of command %d: %+v, want its result replayed", name, i, r)
			}
			if after := mustDump(t, f); withoutClock(after) != withoutClock(before) {
				t.Errorf("%s replica: a replay changed the state", name)
			}
		}
		other := makeEntry(h.now, OpNodeCancelDrain, NodeArgs{NodeID: "node-a"})
		other.CommandID, other.CommandDigest, other.CommandLog = "c-2", true, true
		r := f.Apply([]Entry{other})[0]
		if r.Error == nil || r.Error.Code != api.CodeFailedPrecondition || !strings.Contains(r.Error.Message, "already used for node.drain") {
			t.Errorf("%s replica: the id with other inputs: %+v", name, r)
		}
	}
}

// The layouts meet: a command recorded before the level (under its id or
// its digest) replays for an entry with CommandLog. An entry without the
// flag (from a leader whose voters do not all reach the level) applies as
// an older voter applies it, which does not see the log. Expiry
// drops the older layout's records first, then the log's, oldest first,
// counting both against one limit; a retry after expiry applies anew.
func TestCommandLogBesideOlderRecords(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	h.expect("", h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("by-id")))
	h.advance(time.Second)
	h.expect("", h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("by-digest"), withCommandDigest()))
	h.advance(time.Second)
	logged := h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("logged"), withCommandLog())
	h.expect("", logged)
	cut := h.now.Add(time.Nanosecond)
	h.advance(time.Hour)
	h.expect("", h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("later"), withCommandLog()))

	for _, e := range []Entry{
		h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("by-id"), withCommandLog()),
		h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("by-digest"), withCommandLog()),
	} {
		if r := h.expectUnchanged(e); !r.Replayed {
			t.Errorf("command %s, recorded before the level, did not replay", e.CommandID)
		}
	}

	// Limit 2: both older records, exactly, and more to come (the log's
	// first); then that one, not the later one.
	if r := decode[CommandsExpireResult](t, h.ok(OpCommandsExpire, CommandsExpireArgs{Before: cut, Limit: 2})); r != (CommandsExpireResult{Expired: 2, More: true}) {
		t.Fatalf("first bounded expiry %+v, want 2 and more", r)
	}
	if keys := commandKeys(t, h.f); len(keys) != 0 {
		t.Fatalf("older records left: %q", keys)
	}
	if r := decode[CommandsExpireResult](t, h.ok(OpCommandsExpire, CommandsExpireArgs{Before: cut, Limit: 2})); r != (CommandsExpireResult{Expired: 1}) {
		t.Fatalf("second bounded expiry %+v, want 1 and no more", r)
	}
	if keys := logKeys(t, h.f); len(keys) != 1 {
		t.Fatalf("the log holds %d records after expiry, want the later one", len(keys))
	}
	if r := h.expectUnchanged(h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("later"), withCommandLog())); !r.Replayed {
		t.Error("the command left after expiry did not replay")
	}
	if r := h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("logged"), withCommandLog()); r.Replayed {
		t.Error("an expired command replayed")
	}
	if r := h.ok(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withCommand("later"), withCommandDigest()); r.Replayed {
		t.Error("an entry without CommandLog replayed a record of the log, which an older voter does not have")
	}
	h.advance(time.Hour)
	if r := decode[CommandsExpireResult](t, h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now, Limit: 5})); r != (CommandsExpireResult{Expired: 3}) {
		t.Fatalf("expiry of the rest %+v, want 3 and no more", r)
	}
}

// BenchmarkCommandLookup is the lookup of a new command (none recorded
// under its id) over a log of n records, as every write with a command id
// makes before it applies.
func BenchmarkCommandLookup(b *testing.B) {
	for _, l := range commandLayouts {
		b.Run("layout="+l.name, func(b *testing.B) {
			h := newHarness(b)
			readyNode(h)
			var es []Entry
			for i := 0; i < 20_000; i++ {
				es = append(es, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(fmt.Sprintf("cmd-%d", i)), l.opt))
				if len(es) == 1000 {
					h.apply(es...)
					es = es[:0]
				}
			}
			probe := h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("new"), l.opt)
			err := h.f.db.Update(func(tx *bolt.Tx) error {
				if err := h.f.commands.beginBatch(tx); err != nil {
					return err
				}
				ac := &applyCtx{tx: tx, e: &probe, cache: h.f.cache, commands: h.f.commands}
				for b.Loop() {
					if rec, err := findCommand(ac); rec != nil || err != nil {
						return fmt.Errorf("found %v, %v", rec, err)
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
