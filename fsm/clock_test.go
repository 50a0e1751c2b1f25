package fsm

import (
	"bytes"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// A new leader with a slower clock issues earlier times; every replica
// uses max(IssuedAt, latest IssuedAt applied) instead.
func TestIssuedAtClamp(t *testing.T) {
	cases := []struct {
		name  string
		check func(t *testing.T, h *harness)
	}{
		{"an earlier entry takes the latest time", func(t *testing.T, h *harness) {
			late := h.now.Add(10 * time.Second)
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withIssuedAt(late))
			h.ok(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2}, withIssuedAt(h.now), withCommand("open-2"))
			if got := h.node("node-a").Session.StartedAt; !got.Equal(late) {
				t.Errorf("session started at %s, want the clamped %s", got, late)
			}
			var rec *commandRecord
			h.f.View(func(tx *bolt.Tx) (err error) {
				rec, err = getRecord[commandRecord](tx, bucketCommands, []byte("open-2"))
				return
			})
			if rec == nil || !rec.AppliedAt.Equal(late) {
				t.Errorf("command record %+v, want applied at %s", rec, late)
			}
		}},
		{"later entries keep their own time", func(t *testing.T, h *harness) {
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withIssuedAt(h.now.Add(10*time.Second)))
			later := h.now.Add(20 * time.Second)
			h.ok(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2}, withIssuedAt(later))
			if got := h.node("node-a").Session.StartedAt; !got.Equal(later) {
				t.Errorf("session started at %s, want %s", got, later)
			}
		}},
		{"an expired grant stays expired under a slower leader", func(t *testing.T, h *harness) {
			h.ok(OpEnrollmentGrant, GrantArgs{NodeID: "node-b", Roles: []string{"node"}, SecretHash: secretOf("node-b"), TTL: time.Minute})
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withIssuedAt(h.now.Add(2*time.Minute)))
			h.fail(api.CodeFailedPrecondition, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-b", SecretHash: secretOf("node-b")}, withIssuedAt(h.now.Add(30*time.Second)))
		}},
		{"a rejected entry moves the clock too", func(t *testing.T, h *harness) {
			late := h.now.Add(5 * time.Minute)
			h.fail(api.CodeNotFound, OpNodeDrain, NodeArgs{NodeID: "node-x"}, withIssuedAt(late))
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
			if got := h.node("node-a").DrainRequestedAt; got == nil || !got.Equal(late) {
				t.Errorf("drain requested at %v, want %s", got, late)
			}
		}},
		{"an ignored unknown entry moves the clock too", func(t *testing.T, h *harness) {
			late := h.now.Add(5 * time.Minute)
			h.ok("future.op", nil, withIgnoreUnknown(), withIssuedAt(late))
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
			if got := h.node("node-a").DrainRequestedAt; got == nil || !got.Equal(late) {
				t.Errorf("drain requested at %v, want %s", got, late)
			}
		}},
		{"within one batch", func(t *testing.T, h *harness) {
			late := h.now.Add(time.Minute)
			rs, err := h.f.ApplyBatch([]Entry{
				h.entry(OpNodeCancelDrain, NodeArgs{NodeID: ctrlID}, withIssuedAt(late)),
				h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}),
			})
			if err != nil || rs[1].Error != nil {
				t.Fatalf("batch: %v %+v", err, rs)
			}
			if got := h.node("node-a").DrainRequestedAt; got == nil || !got.Equal(late) {
				t.Errorf("drain requested at %v, want %s", got, late)
			}
		}},
		{"the clock survives a snapshot", func(t *testing.T, h *harness) {
			late := h.now.Add(time.Hour)
			h.ok(OpNodeCancelDrain, NodeArgs{NodeID: ctrlID}, withIssuedAt(late))
			var snap bytes.Buffer
			if err := h.f.Snapshot(&snap); err != nil {
				t.Fatal(err)
			}
			c := &harness{t: t, f: openFSM(t), now: h.now}
			if err := c.f.Restore(&snap); err != nil {
				t.Fatal(err)
			}
			c.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
			if got := c.node("node-a").DrainRequestedAt; got == nil || !got.Equal(late) {
				t.Errorf("restored replica: drain requested at %v, want %s", got, late)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			readyNode(h)
			h.advance(time.Second)
			tc.check(t, h)
		})
	}
}

// The clock depends on the log alone: a log whose times jump back and
// forth gives the same state in one batch and one entry per batch.
func TestIssuedAtClampBatchSplits(t *testing.T) {
	build := func() (*harness, []Entry) {
		h := newHarness(t)
		readyNode(h)
		var log []Entry
		offsets := []time.Duration{10, -5, 3, 30, 1, -60, 31, 31, 2}
		for i, off := range offsets {
			at := withIssuedAt(h.now.Add(off * time.Second))
			if i%2 == 0 {
				log = append(log, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, at))
			} else {
				log = append(log, h.entry(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, at, withCommand("c"+string(rune('0'+i)))))
			}
		}
		return h, log
	}
	a, log := build()
	if _, err := a.f.ApplyBatch(log); err != nil {
		t.Fatal(err)
	}
	b, _ := build()
	for _, e := range log {
		if _, err := b.f.ApplyBatch([]Entry{e}); err != nil {
			t.Fatal(err)
		}
	}
	da, db := mustDump(t, a.f), mustDump(t, b.f)
	if da != db {
		t.Fatalf("batch splits disagree:\n%s", diffLines(da, db))
	}
	want := a.now.Add(31 * time.Second).UTC().Format(time.RFC3339Nano)
	if !bytes.Contains([]byte(da), []byte(`"clock"="`+want+`"`)) {
		t.Errorf("clock is not the latest time %s:\n%s", want, da)
	}
}
