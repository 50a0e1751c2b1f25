package fsm

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// mustHalt applies es as one batch, which must halt at pos with nothing of
// it committed (the clock included).
func mustHalt(t *testing.T, f *FSM, es []Entry, pos int) *HaltError {
	t.Helper()
	before := mustDump(t, f)
	rs, err := f.ApplyBatch(es)
	var h *HaltError
	if !errors.As(err, &h) {
		t.Fatalf("batch of %d: error %v, want a *HaltError", len(es), err)
	}
	if rs != nil {
		t.Errorf("a halted batch returned results %+v", rs)
	}
	if h.Pos != pos {
		t.Errorf("halted at entry %d, want %d (%v)", h.Pos, pos, h)
	}
	if after := mustDump(t, f); after != before {
		t.Fatalf("halted batch committed something:\n%s", diffLines(before, after))
	}
	return h
}

func TestUnknownOpHalts(t *testing.T) {
	teleport := func(h *harness, opts ...entryOpt) Entry {
		return h.entry("node.teleport", NodeArgs{NodeID: "node-a"}, opts...)
	}
	drain := func(h *harness) Entry { return h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}) }
	cases := []struct {
		name  string
		batch func(h *harness) []Entry
		pos   int
	}{
		{"alone", func(h *harness) []Entry { return []Entry{teleport(h)} }, 0},
		{"with a command id", func(h *harness) []Entry { return []Entry{teleport(h, withCommand("tp"))} }, 0},
		{"after an accepted entry", func(h *harness) []Entry { return []Entry{drain(h), teleport(h)} }, 1},
		{"between accepted entries", func(h *harness) []Entry { return []Entry{drain(h), teleport(h), drain(h)} }, 1},
		{"after a later clock", func(h *harness) []Entry {
			return []Entry{h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withIssuedAt(h.now.Add(time.Hour))), teleport(h)}
		}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			readyNode(h)
			h.advance(time.Minute)
			es := tc.batch(h)
			he := mustHalt(t, h.f, es, tc.pos)
			if !he.Unknown || he.Op != "node.teleport" || he.Err != nil {
				t.Errorf("halt %+v, want unknown node.teleport", he)
			}
			if msg := he.Error(); !strings.Contains(msg, `"node.teleport"`) || !strings.Contains(msg, "upgrade") {
				t.Errorf("message %q does not name the op and the fix", msg)
			}
			// Replayed (the member restarted without an upgrade) it halts
			// again at the same entry.
			mustHalt(t, h.f, es, tc.pos)
			// The state is as before: the same batch without the unknown
			// entry applies as on a fresh replica.
			rest := append(append([]Entry(nil), es[:tc.pos]...), es[tc.pos+1:]...)
			if _, err := h.f.ApplyBatch(rest); err != nil {
				t.Fatalf("batch without the unknown entry: %v", err)
			}
		})
	}
}

// Entries with IgnoreUnknown are skipped the same way on every replica
// and every batch split: empty result, nothing recorded.
func TestIgnoreUnknownSkippedOnEveryReplica(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	base := mustDump(t, h.f)
	var log []Entry
	for i := 0; i < 6; i++ {
		h.advance(time.Second)
		switch i % 3 {
		case 0:
			log = append(log, h.entry("node.teleport", NodeArgs{NodeID: "node-a"}, withIgnoreUnknown(), withCommand("tp")))
		case 1:
			log = append(log, h.entry("future.op", nil, withIgnoreUnknown()))
		default:
			log = append(log, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}))
		}
	}
	// Two replicas at the same state: one applies the log in one batch,
	// the other one entry per batch.
	a, b := openFSM(t), openFSM(t)
	for _, f := range []*FSM{a, b} {
		var snap strings.Builder
		if err := h.f.Snapshot(&snap); err != nil {
			t.Fatal(err)
		}
		if err := f.Restore(strings.NewReader(snap.String())); err != nil {
			t.Fatal(err)
		}
	}
	ra, err := a.ApplyBatch(log)
	if err != nil {
		t.Fatalf("one batch: %v", err)
	}
	var rb []Result
	for _, e := range log {
		r, err := b.ApplyBatch([]Entry{e})
		if err != nil {
			t.Fatalf("entry %s: %v", e.Op, err)
		}
		rb = append(rb, r...)
	}
	if !reflect.DeepEqual(ra, rb) {
		t.Fatalf("results differ:\n%+v\n%+v", ra, rb)
	}
	for i, e := range log {
		if handlers[e.Op] == nil && !reflect.DeepEqual(ra[i], Result{}) {
			t.Errorf("ignored %s: result %+v, want empty", e.Op, ra[i])
		}
	}
	da, db := mustDump(t, a), mustDump(t, b)
	if da != db {
		t.Fatalf("replicas differ:\n%s", diffLines(da, db))
	}
	if strings.Contains(da, `"tp"`) {
		t.Error("the ignored entry's command id was recorded")
	}
	// Only the drains and the clock changed.
	if withoutClock(da) == withoutClock(base) {
		t.Error("the drains did not apply")
	}
}

// withTestHandler registers a handler for op for the test's duration (no
// test of this package runs in parallel with the others at top level).
func withTestHandler(t *testing.T, op string, h handler) {
	t.Helper()
	handlers[op] = h
	t.Cleanup(func() { delete(handlers, op) })
}

// An internal error halts the batch even after the handler wrote: half an
// entry is never committed, and no error result is recorded for it.
func TestInternalErrorHalts(t *testing.T) {
	writeNode := func(ac *applyCtx) error {
		n, err := mustNode(ac.tx, "node-a")
		if err != nil {
			return err
		}
		n.DrainRequested = true
		return putNode(ac, n)
	}
	withTestHandler(t, "test.write_then_fail", func(ac *applyCtx) (any, error) {
		if err := writeNode(ac); err != nil {
			return nil, err
		}
		return nil, errors.New("disk on fire")
	})
	withTestHandler(t, "test.unencodable_result", func(ac *applyCtx) (any, error) {
		if err := writeNode(ac); err != nil {
			return nil, err
		}
		return math.Inf(1), nil
	})
	cases := []struct {
		name  string
		setup func(h *harness)
		entry func(h *harness) Entry
		want  string
	}{
		{"handler error after its write", nil,
			func(h *harness) Entry { return h.entry("test.write_then_fail", nil) }, "disk on fire"},
		{"handler error after its write, with a command id", nil,
			func(h *harness) Entry { return h.entry("test.write_then_fail", nil, withCommand("c1")) }, "disk on fire"},
		{"result that does not encode", nil,
			func(h *harness) Entry { return h.entry("test.unencodable_result", nil, withCommand("c2")) }, "encode the result"},
		{"corrupt record read by a real handler", func(h *harness) {
			if err := h.f.db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketNodes).Put([]byte("node-a"), []byte("{not json"))
			}); err != nil {
				t.Fatal(err)
			}
		}, func(h *harness) Entry { return h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}) }, "state record nodes/node-a is corrupt"},
		{"corrupt command record", func(h *harness) {
			if err := h.f.db.Update(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketCommands).Put([]byte("c3"), []byte("{not json"))
			}); err != nil {
				t.Fatal(err)
			}
		}, func(h *harness) Entry { return h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand("c3")) }, "state record commands/c3 is corrupt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			readyNode(h)
			if tc.setup != nil {
				tc.setup(h)
			}
			h.advance(time.Minute)
			e := tc.entry(h)
			he := mustHalt(t, h.f, []Entry{h.entry(OpNodeCancelDrain, NodeArgs{NodeID: ctrlID}), e}, 1)
			if he.Unknown || he.Op != e.Op || !strings.Contains(he.Error(), tc.want) {
				t.Errorf("halt %+v (%v), want %s failing with %q", he, he, e.Op, tc.want)
			}
		})
	}
}

// A batch whose transaction does not commit halts as a whole: no entry of
// it gets a result, and its command is not recorded in either layout (the
// command log's index forgets what the batch added).
func TestCommitFailureHalts(t *testing.T) {
	for _, layout := range []struct {
		name string
		opts []entryOpt
	}{{"id", nil}, {"log", []entryOpt{withCommandLog()}}} {
		t.Run(layout.name, func(t *testing.T) {
			h := newHarness(t)
			readyNode(h)
			d1 := append([]entryOpt{withCommand("d1")}, layout.opts...)
			h.f.beforeCommit = func(*bolt.Tx) error { return errors.New("no space left on device") }
			h.advance(time.Minute)
			he := mustHalt(t, h.f, []Entry{
				h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, d1...),
				h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}),
			}, -1)
			if he.Unknown || !strings.Contains(he.Error(), "no space left on device") {
				t.Errorf("halt %v", he)
			}
			// Apply (tests, benchmarks) reports it on every entry.
			for i, r := range h.f.Apply([]Entry{h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"})}) {
				if resultCode(r) != "internal" {
					t.Errorf("entry %d: %+v, want internal", i, r)
				}
			}
			h.f.beforeCommit = nil
			if r := h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, d1...); r.Replayed {
				t.Error("the failed batch recorded its command")
			}
			if r := h.expectUnchanged(h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, d1...)); !r.Replayed {
				t.Error("the command applied after the failed batch did not replay")
			}
		})
	}
}
