package fsm

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// overcommit.set_default

func milli(m api.Milli) *api.Milli { return &m }

func TestOvercommitSetDefault(t *testing.T) {
	set := func(cpu, mem *api.Milli, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: cpu, Memory: mem}, opts...)
	}
	wantDefault := func(want api.OvercommitDefault) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			if got := decode[api.OvercommitDefault](t, r); got != want {
				t.Errorf("result %+v, want %+v", got, want)
			}
			if got := h.overcommitDefault(); got != want {
				t.Errorf("stored %+v, want %+v", got, want)
			}
		}
	}
	boot := func(h *harness) { h.bootstrap() }
	cases := []opCase{
		{name: "cpu only", setup: boot, entry: set(milli(4000), nil, withVersion(1)), check: wantDefault(api.OvercommitDefault{CPU: 4000, Memory: 1000, Version: 2})},
		{name: "memory only", setup: boot, entry: set(nil, milli(900)), check: wantDefault(api.OvercommitDefault{CPU: 1000, Memory: 900, Version: 2})},
		{name: "both", setup: boot, entry: set(milli(16000), milli(0)), check: wantDefault(api.OvercommitDefault{CPU: 16000, Memory: 0, Version: 2})},
		{name: "second change keeps the other item", setup: func(h *harness) {
			boot(h)
			h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(2500)})
		}, entry: set(nil, milli(1500), withVersion(2)), check: wantDefault(api.OvercommitDefault{CPU: 2500, Memory: 1500, Version: 3})},
		{name: "version mismatch", setup: boot, entry: set(milli(2000), nil, withVersion(2)), code: api.CodeVersionMismatch},
		{name: "stale version", setup: func(h *harness) { boot(h); h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(2500)}) },
			entry: set(milli(2000), nil, withVersion(1)), code: api.CodeVersionMismatch},
		{name: "nothing given", setup: boot, entry: set(nil, nil), code: api.CodeInvalidArgument},
		{name: "cpu valid memory out of range", setup: boot, entry: set(milli(2000), milli(16001)), code: api.CodeInvalidArgument},
		{name: "default visible on nodes", setup: func(h *harness) {
			readyNode(h)
			h.report("node-a", "s1", api.Report{Capacity: api.Resources{CPU: 3000, MemoryBytes: 1000}})
		},
			entry: set(milli(1500), milli(2000)), check: func(t *testing.T, h *harness, _ Result) {
				n := h.node("node-a")
				want := api.Overcommit{CPU: 1500, CPUSource: "default", Memory: 2000, MemorySource: "default"}
				if *n.Overcommit != want || *n.Schedulable != (api.Resources{CPU: 4500, MemoryBytes: 2000}) {
					t.Errorf("overcommit %+v schedulable %+v", n.Overcommit, n.Schedulable)
				}
			}},
	}
	for _, raw := range []string{`{"cpu":16.001}`, `{"memory":16.001}`, `{"cpu":-0.001}`, `{"cpu":"-1"}`, `{"cpu":1.0001}`, `{"cpu":1e3}`, `{"memory":17}`} {
		cases = append(cases, opCase{name: "out of range " + raw, setup: boot, entry: ent(OpOvercommitSetDefault, json.RawMessage(raw)), code: api.CodeInvalidArgument})
	}
	for _, raw := range []string{`{"cpu":16}`, `{"cpu":"16.000"}`, `{"memory":0}`, `{"memory":0.001}`, `{"cpu":2.5,"memory":0.9}`} {
		cases = append(cases, opCase{name: "in range " + raw, setup: boot, entry: ent(OpOvercommitSetDefault, json.RawMessage(raw)),
			check: func(t *testing.T, h *harness, _ Result) {
				if v := h.overcommitDefault().Version; v != 2 {
					t.Errorf("version %d", v)
				}
			}})
	}
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// overcommit.set

func TestOvercommitSet(t *testing.T) {
	capacity := api.Resources{CPU: 8000, MemoryBytes: 16 << 30}
	reported := func(h *harness) { readyNode(h); h.report("node-a", "s1", api.Report{Capacity: capacity}) } // version 3
	set := func(cpu, mem *MultiplierChange, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: cpu, Memory: mem}, opts...)
	}
	val := func(m api.Milli) *MultiplierChange { return &MultiplierChange{Value: m} }
	def := &MultiplierChange{Default: true}
	expectOC := func(want api.Overcommit, sched api.Resources) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			n := h.node("node-a")
			if *n.Overcommit != want {
				t.Errorf("overcommit %+v, want %+v", *n.Overcommit, want)
			}
			if *n.Schedulable != sched {
				t.Errorf("schedulable %+v, want %+v", *n.Schedulable, sched)
			}
			if res := decode[api.Node](t, r); !reflect.DeepEqual(res, *n) {
				t.Errorf("result %+v\nstored %+v", res, *n)
			}
		}
	}
	cases := []opCase{
		{name: "cpu only", setup: reported, entry: set(val(2500), nil, withVersion(3)),
			check: expectOC(api.Overcommit{CPU: 2500, CPUSource: "node", Memory: 1000, MemorySource: "default"}, api.Resources{CPU: 20000, MemoryBytes: 16 << 30})},
		{name: "memory keeps cpu", setup: func(h *harness) {
			reported(h)
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: val(2500)})
		},
			entry: set(nil, val(900), withVersion(4)),
			check: expectOC(api.Overcommit{CPU: 2500, CPUSource: "node", Memory: 900, MemorySource: "node"}, api.Resources{CPU: 20000, MemoryBytes: (16 << 30) * 9 / 10})},
		{name: "cpu back to default", setup: func(h *harness) {
			reported(h)
			h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(3000)})
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: val(2500), Memory: val(900)})
		}, entry: set(def, nil),
			check: func(t *testing.T, h *harness, r Result) {
				expectOC(api.Overcommit{CPU: 3000, CPUSource: "default", Memory: 900, MemorySource: "node"}, api.Resources{CPU: 24000, MemoryBytes: (16 << 30) * 9 / 10})(t, h, r)
				if o := h.node("node-a").OvercommitOverride; o == nil || o.CPU != nil || o.Memory == nil || *o.Memory != 900 {
					t.Errorf("override %+v", o)
				}
			}},
		{name: "both back to default clears the override", setup: func(h *harness) {
			reported(h)
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: val(2500), Memory: val(900)})
		}, entry: set(def, def), check: func(t *testing.T, h *harness, r Result) {
			expectOC(api.Overcommit{CPU: 1000, CPUSource: "default", Memory: 1000, MemorySource: "default"}, capacity)(t, h, r)
			if o := h.node("node-a").OvercommitOverride; o != nil {
				t.Errorf("override %+v", o)
			}
		}},
		{name: "default wins over a value", setup: reported, entry: set(&MultiplierChange{Default: true, Value: 5000}, nil),
			check: expectOC(api.Overcommit{CPU: 1000, CPUSource: "default", Memory: 1000, MemorySource: "default"}, capacity)},
		{name: "zero", setup: reported, entry: set(val(0), val(0)),
			check: expectOC(api.Overcommit{CPU: 0, CPUSource: "node", Memory: 0, MemorySource: "node"}, api.Resources{})},
		{name: "fractional capacity rounds down", setup: func(h *harness) {
			readyNode(h)
			h.report("node-a", "s1", api.Report{Capacity: api.Resources{CPU: 3, MemoryBytes: 1001}})
		}, entry: set(val(1500), val(1999)), check: expectOC(api.Overcommit{CPU: 1500, CPUSource: "node", Memory: 1999, MemorySource: "node"}, api.Resources{CPU: 4, MemoryBytes: 2000})},
		{name: "no report no schedulable", setup: readyNode, entry: set(val(2000), nil), check: func(t *testing.T, h *harness, _ Result) {
			if n := h.node("node-a"); n.Schedulable != nil || n.Overcommit.CPU != 2000 {
				t.Errorf("node %+v", n)
			}
		}},
		{name: "version mismatch", setup: reported, entry: set(val(2000), nil, withVersion(2)), code: api.CodeVersionMismatch},
		{name: "unknown node", setup: reported, entry: ent(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-x", CPU: val(2000)}), code: api.CodeNotFound},
		{name: "nothing given", setup: reported, entry: set(nil, nil), code: api.CodeInvalidArgument},
		{name: "cpu out of range", setup: reported, entry: set(val(16001), nil), code: api.CodeInvalidArgument},
		{name: "memory out of range", setup: reported, entry: set(val(2000), val(16001)), code: api.CodeInvalidArgument},
		{name: "negative", setup: reported, entry: set(nil, val(-1)), code: api.CodeInvalidArgument},
		{name: "too many places", setup: reported, entry: ent(OpOvercommitSet, json.RawMessage(`{"node_id":"node-a","cpu":{"value":2.0001}}`)), code: api.CodeInvalidArgument},
		{name: "sixteen", setup: reported, entry: ent(OpOvercommitSet, json.RawMessage(`{"node_id":"node-a","cpu":{"value":16},"memory":{"value":"16.000"}}`)),
			check: expectOC(api.Overcommit{CPU: 16000, CPUSource: "node", Memory: 16000, MemorySource: "node"}, api.Resources{CPU: 128000, MemoryBytes: 256 << 30})},
		{name: "default change does not touch a node override", setup: func(h *harness) {
			reported(h)
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: val(2500)})
		}, entry: ent(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(4000), Memory: milli(2000)}), check: func(t *testing.T, h *harness, _ Result) {
			if o := *h.node("node-a").Overcommit; o != (api.Overcommit{CPU: 2500, CPUSource: "node", Memory: 2000, MemorySource: "default"}) {
				t.Errorf("overcommit %+v", o)
			}
		}},
	}
	runCases(t, cases)
}

// Both items out of range: the error must not depend on map iteration order
// (replicas must produce identical results).
func TestOvercommitSetErrorDeterministic(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	e := h.entry(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 17000}, Memory: &MultiplierChange{Value: -5}})
	first := h.expect(api.CodeInvalidArgument, e).Error.Message
	for i := 0; i < 200; i++ {
		if msg := h.expect(api.CodeInvalidArgument, e).Error.Message; msg != first {
			t.Fatalf("same entry gave different errors:\n%s\n%s", first, msg)
		}
	}
	if !strings.Contains(first, "cpu") {
		t.Errorf("first reported item should be cpu: %s", first)
	}
}

// ---------------------------------------------------------------------------
// node.overcommit_ack

func TestOvercommitAck(t *testing.T) {
	ack := func(sess string, cpu, mem api.Milli) func(h *harness) Entry {
		return ent(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-a", SessionID: sess, Values: api.Multipliers{CPU: cpu, Memory: mem}})
	}
	acked := func(want bool) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			n := h.node("node-a")
			if n.Overcommit.Acknowledged != want {
				t.Errorf("acknowledged %v, want %v (ack %+v, effective %+v)", n.Overcommit.Acknowledged, want, n.OvercommitAck, n.Overcommit)
			}
			if res := decode[api.Node](t, r); !reflect.DeepEqual(res, *n) {
				t.Errorf("result %+v\nstored %+v", res, *n)
			}
			if n.RegistrationVersion != 3 {
				t.Errorf("version %d", n.RegistrationVersion)
			}
		}
	}
	withOverride := func(h *harness) {
		readyNode(h)
		h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 2500}})
		h.open("node-a", "s2", 2) // version 4; a new session must ack again
	}
	runCases(t, []opCase{
		{name: "unknown node", setup: readyNode, entry: ent(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-x", SessionID: "s1"}), code: api.CodeNotFound},
		{name: "not the live session", setup: readyNode, entry: ack("s0", 1000, 1000), code: api.CodeFailedPrecondition},
		{name: "closed session", setup: func(h *harness) { readyNode(h); h.closeSession("node-a", "s1") }, entry: ack("s1", 1000, 1000), code: api.CodeFailedPrecondition},
		{name: "equal to the default", setup: readyNode, entry: ack("s1", 1000, 1000), check: acked(true)},
		{name: "cpu differs", setup: readyNode, entry: ack("s1", 2000, 1000), check: acked(false)},
		{name: "memory differs", setup: readyNode, entry: ack("s1", 1000, 999), check: acked(false)},
		{name: "equal to the override", setup: withOverride, entry: ack("s2", 2500, 1000), check: func(t *testing.T, h *harness, r Result) {
			if !h.node("node-a").Overcommit.Acknowledged {
				t.Fatal("not acknowledged")
			}
			// A later set or set-default that changes the effective values unacknowledges.
			h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{CPU: milli(4000)}) // cpu overridden: still acknowledged
			if !h.node("node-a").Overcommit.Acknowledged {
				t.Error("default change of an overridden item cleared the ack")
			}
			h.ok(OpOvercommitSetDefault, OvercommitDefaultArgs{Memory: milli(1200)})
			if h.node("node-a").Overcommit.Acknowledged {
				t.Error("still acknowledged after the default memory changed")
			}
			h.ok(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-a", SessionID: "s2", Values: api.Multipliers{CPU: 2500, Memory: 1200}})
			if !h.node("node-a").Overcommit.Acknowledged {
				t.Error("not acknowledged after the new ack")
			}
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 3000}})
			if h.node("node-a").Overcommit.Acknowledged {
				t.Error("still acknowledged after set")
			}
		}},
	})
}
