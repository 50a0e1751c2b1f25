package fsm

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// node.session_open

func TestSessionOpen(t *testing.T) {
	open := func(id, sess string, inc uint64) func(h *harness) Entry {
		return ent(OpSessionOpen, SessionOpenArgs{NodeID: id, SessionID: sess, Incarnation: inc, Release: "v0.2.1", Revision: "def", Address: "10.0.0.2:7000"})
	}
	refused := func(reason string) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			res := sessionOpenResult(t, r)
			if res.Accepted || res.Refusal != reason || res.Message == "" {
				t.Errorf("got %+v, want refusal %s", res, reason)
			}
		}
	}
	accepted := func(sess string, inc, version uint64) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			if res := sessionOpenResult(t, r); !res.Accepted || res.Refusal != "" {
				t.Fatalf("refused: %+v", res)
			}
			n := h.node("node-a")
			want := api.Session{Incarnation: inc, SessionID: sess, Release: "v0.2.1", Revision: "def", Alive: true, StartedAt: h.now}
			if n.Session == nil || !reflect.DeepEqual(*n.Session, want) {
				t.Errorf("session %+v, want %+v", n.Session, want)
			}
			if n.RegistrationVersion != version || n.LastIncarnation != inc || n.Release != "v0.2.1" || n.Revision != "def" ||
				n.Address != "10.0.0.2:7000" || n.Status != api.NodeReady || n.Isolated || n.IsolatedAt != nil || n.IsolatedIncarnation != 0 {
				t.Errorf("node after open %+v", n)
			}
		}
	}
	joined := func(h *harness) { h.bootstrap(); h.join("node-a") }
	runCases(t, []opCase{
		{name: "unknown node", setup: joined, entry: open("node-x", "s1", 1), unchanged: true, check: refused(RefusalNotAdmitted)},
		{name: "before bootstrap", entry: open("node-x", "s1", 1), code: api.CodeFailedPrecondition},
		{name: "first open", setup: joined, entry: open("node-a", "s1", 1), check: accepted("s1", 1, 2)},
		{name: "incarnation zero", setup: joined, entry: open("node-a", "s1", 0), check: accepted("s1", 0, 2)},
		{name: "same incarnation reconnects", setup: func(h *harness) { joined(h); h.open("node-a", "s1", 5) },
			entry: open("node-a", "s2", 5), check: accepted("s2", 5, 3)},
		{name: "newer incarnation replaces live session", setup: func(h *harness) { joined(h); h.open("node-a", "s1", 5) },
			entry: open("node-a", "s2", 6), check: accepted("s2", 6, 3)},
		{name: "stale incarnation", setup: func(h *harness) { joined(h); h.open("node-a", "s1", 5) },
			entry: open("node-a", "s2", 4), unchanged: true, check: refused(RefusalStale)},
		{name: "stale incarnation after close", setup: func(h *harness) { joined(h); h.open("node-a", "s1", 5); h.closeSession("node-a", "s1") },
			entry: open("node-a", "s2", 1), unchanged: true, check: refused(RefusalStale)},
		{name: "isolated incarnation", setup: isolatedNode, entry: open("node-a", "s2", 1), unchanged: true, check: refused(RefusalIsolated)},
		{name: "older than isolated incarnation", setup: isolatedNode, entry: open("node-a", "s2", 0), unchanged: true, check: refused(RefusalIsolated)},
		{name: "newer incarnation clears isolation", setup: isolatedNode, entry: open("node-a", "s2", 2), check: accepted("s2", 2, 5)},
		{name: "retired", setup: retiredNode, entry: open("node-a", "s2", 2), unchanged: true, check: refused(RefusalNotAdmitted)},
		{name: "retired after isolate, isolated incarnation", setup: func(h *harness) { isolatedNode(h); h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"}) },
			entry: open("node-a", "s2", 1), unchanged: true, check: refused(RefusalIsolated)},
		{name: "retired after isolate, new incarnation", setup: func(h *harness) { isolatedNode(h); h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"}) },
			entry: open("node-a", "s2", 2), unchanged: true, check: refused(RefusalNotAdmitted)},
		{name: "revoked", setup: func(h *harness) { joined(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: open("node-a", "s1", 1), unchanged: true, check: refused(RefusalNotAdmitted)},
		{name: "resets the overcommit acknowledgement", setup: func(h *harness) {
			readyNode(h)
			h.ok(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-a", SessionID: "s1", Values: api.Multipliers{CPU: 1000, Memory: 1000}})
		}, entry: open("node-a", "s2", 2), check: func(t *testing.T, h *harness, _ Result) {
			if n := h.node("node-a"); n.OvercommitAck != nil || n.Overcommit.Acknowledged {
				t.Errorf("ack survived a new session: %+v %+v", n.OvercommitAck, n.Overcommit)
			}
		}},
		{name: "empty address keeps the old one", setup: joined,
			entry: ent(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s1", Incarnation: 1}),
			check: func(t *testing.T, h *harness, _ Result) {
				if a := h.node("node-a").Address; a != "addr-node-a" {
					t.Errorf("address %q", a)
				}
			}},
	})
}

func TestSessionOpenBumpsVersionEachTime(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	h.join("node-a")
	v := h.version("node-a")
	for i := 1; i <= 6; i++ {
		h.advance(time.Second)
		h.open("node-a", fmt.Sprintf("s%d", i), uint64(1+i/2))
		if got := h.version("node-a"); got != v+uint64(i) {
			t.Fatalf("after open %d: version %d, want %d", i, got, v+uint64(i))
		}
	}
}

// ---------------------------------------------------------------------------
// node.session_close

func TestSessionClose(t *testing.T) {
	closeS := func(id, sess string) func(h *harness) Entry {
		return ent(OpSessionClose, SessionCloseArgs{NodeID: id, SessionID: sess, Reason: "lost"})
	}
	notClosed := func(t *testing.T, h *harness, r Result) {
		if decode[map[string]bool](t, r)["closed"] {
			t.Error("closed=true")
		}
	}
	runCases(t, []opCase{
		{name: "unknown node", setup: readyNode, entry: closeS("node-x", "s1"), code: api.CodeNotFound},
		{name: "wrong session id", setup: readyNode, entry: closeS("node-a", "s0"), unchanged: true, check: notClosed},
		{name: "no session yet", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: closeS("node-a", ""), unchanged: true, check: notClosed},
		{name: "already closed", setup: func(h *harness) { readyNode(h); h.closeSession("node-a", "s1") }, entry: closeS("node-a", "s1"), unchanged: true, check: notClosed},
		{name: "superseded session", setup: func(h *harness) { readyNode(h); h.open("node-a", "s2", 2) }, entry: closeS("node-a", "s1"), unchanged: true, check: notClosed},
		{name: "live session", setup: readyNode, entry: closeS("node-a", "s1"), check: func(t *testing.T, h *harness, r Result) {
			if !decode[map[string]bool](t, r)["closed"] {
				t.Error("closed=false")
			}
			n := h.node("node-a")
			if s := n.Session; s.Alive || s.EndReason != "lost" || s.EndedAt == nil || !s.EndedAt.Equal(h.now) || s.SessionID != "s1" {
				t.Errorf("session %+v", s)
			}
			if n.RegistrationVersion != 3 || n.Status != api.NodeNotReady {
				t.Errorf("node %+v", n)
			}
		}},
	})
}

// ---------------------------------------------------------------------------
// node.report

func TestNodeReport(t *testing.T) {
	rep := api.Report{ReportVersion: 99, Capacity: api.Resources{CPU: 8000, MemoryBytes: 16 << 30}, Allocated: api.Resources{CPU: 2000, MemoryBytes: 4 << 30},
		Instances: 2, Volumes: 1, Pools: []api.Pool{{PoolID: "p1", Path: "/srv/p1", Available: true, CapacityBytes: 100, FreeBytes: 50}}}
	report := func(id, sess string) func(h *harness) Entry {
		return ent(OpNodeReport, ReportArgs{NodeID: id, SessionID: sess, Report: rep})
	}
	f1 := 0.25
	runCases(t, []opCase{
		{name: "unknown node", setup: readyNode, entry: report("node-x", "s1"), code: api.CodeNotFound},
		{name: "not the live session", setup: readyNode, entry: report("node-a", "s0"), code: api.CodeFailedPrecondition},
		{name: "superseded session", setup: func(h *harness) { readyNode(h); h.open("node-a", "s2", 2) }, entry: report("node-a", "s1"), code: api.CodeFailedPrecondition},
		{name: "closed session", setup: func(h *harness) { readyNode(h); h.closeSession("node-a", "s1") }, entry: report("node-a", "s1"), code: api.CodeFailedPrecondition},
		{name: "no session", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: report("node-a", ""), code: api.CodeFailedPrecondition},
		{name: "first report", setup: readyNode, entry: report("node-a", "s1"), check: func(t *testing.T, h *harness, r Result) {
			if got := decode[map[string]uint64](t, r)["report_version"]; got != 1 {
				t.Errorf("report_version %d", got)
			}
			n := h.node("node-a")
			want := rep
			want.ReportVersion, want.ReportedAt, want.DefaultPool = 1, h.now, "node-a:default"
			if !reflect.DeepEqual(*n.Report, want) {
				t.Errorf("report %+v\nwant %+v", *n.Report, want)
			}
			if n.RegistrationVersion != 3 || n.HostUsage != nil || n.Session.Clock != nil {
				t.Errorf("node %+v", n)
			}
		}},
		{name: "versions increment, host usage kept", setup: func(h *harness) {
			readyNode(h)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Report: rep, HostUsage: &api.HostUsage{SampledAt: t0, CPUIdle: &f1}})
			h.report("node-a", "s1", rep)
		}, entry: report("node-a", "s1"), check: func(t *testing.T, h *harness, r Result) {
			if got := decode[map[string]uint64](t, r)["report_version"]; got != 3 {
				t.Errorf("report_version %d", got)
			}
			n := h.node("node-a")
			if n.Report.ReportVersion != 3 || n.RegistrationVersion != 5 || n.HostUsage == nil || *n.HostUsage.CPUIdle != f1 {
				t.Errorf("node %+v", n)
			}
		}},
		{name: "host usage not shown once the session ended", setup: func(h *harness) {
			readyNode(h)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Report: rep, HostUsage: &api.HostUsage{SampledAt: t0, CPUIdle: &f1}})
		}, entry: ent(OpSessionClose, SessionCloseArgs{NodeID: "node-a", SessionID: "s1", Reason: "lost"}), check: func(t *testing.T, h *harness, r Result) {
			if n := h.node("node-a"); n.HostUsage != nil {
				t.Errorf("host usage of a node without a session: %+v", *n.HostUsage)
			}
		}},
		{name: "report version continues across sessions", setup: func(h *harness) { readyNode(h); h.report("node-a", "s1", rep); h.open("node-a", "s2", 2) },
			entry: report("node-a", "s2"), check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]uint64](t, r)["report_version"]; got != 2 {
					t.Errorf("report_version %d", got)
				}
			}},
	})
}

func TestNodeReportClock(t *testing.T) {
	s := int64(time.Second)
	cases := []struct {
		offset, uncertainty int64
		over                bool
	}{
		{31 * s, s / 2, true},
		{30*s + 4*s/10, s / 2, false},
		{-31 * s, s / 2, true},
		{-(30*s + 4*s/10), s / 2, false},
		{30*s + s/2, s / 2, false}, // exactly 30 s after uncertainty: not over
		{30*s + s/2 + 1, s / 2, true},
		{30 * s, 0, false},
		{30*s + 1, 0, true},
		{0, 0, false},
		{40 * s, 15 * s, false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("offset %v uncertainty %v", time.Duration(c.offset), time.Duration(c.uncertainty)), func(t *testing.T) {
			h := newHarness(t)
			readyNode(h)
			h.advance(time.Second)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Clock: &ClockArgs{OffsetNS: c.offset, UncertaintyNS: c.uncertainty, KernelSync: "synchronized"}})
			want := api.Clock{OffsetNS: c.offset, UncertaintyNS: c.uncertainty, MeasuredAt: h.now, Over: c.over, KernelSync: "synchronized"}
			if got := h.node("node-a").Session.Clock; got == nil || *got != want {
				t.Errorf("clock %+v, want %+v", got, want)
			}
			// A later report without a measurement keeps it.
			h.advance(time.Second)
			h.report("node-a", "s1", api.Report{})
			if got := h.node("node-a").Session.Clock; got == nil || *got != want {
				t.Errorf("clock after a report without measurement %+v", got)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// node.drain and node.cancel_drain

func TestDrainAndCancelDrain(t *testing.T) {
	busy := api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 << 30}, Instances: 1}
	readyBusy := func(h *harness) { readyNode(h); h.report("node-a", "s1", busy) } // version 3
	draining := func(h *harness) { readyBusy(h); h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}) }
	status := func(want string) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			if n := h.node("node-a"); n.Status != want {
				t.Errorf("status %s, want %s", n.Status, want)
			}
		}
	}
	var cases []opCase
	for _, op := range []string{OpNodeDrain, OpNodeCancelDrain} {
		cases = append(cases,
			opCase{name: op + "/version mismatch", setup: readyBusy, entry: ent(op, NodeArgs{NodeID: "node-a"}, withVersion(2)), code: api.CodeVersionMismatch},
			opCase{name: op + "/version ahead", setup: readyBusy, entry: ent(op, NodeArgs{NodeID: "node-a"}, withVersion(4)), code: api.CodeVersionMismatch},
			opCase{name: op + "/unknown node", setup: readyBusy, entry: ent(op, NodeArgs{NodeID: "node-x"}), code: api.CodeNotFound},
			opCase{name: op + "/unknown node with version", setup: readyBusy, entry: ent(op, NodeArgs{NodeID: "node-x"}, withVersion(0)), code: api.CodeNotFound},
			opCase{name: op + "/retired", setup: retiredNode, entry: ent(op, NodeArgs{NodeID: "node-a"}), code: api.CodeFailedPrecondition},
		)
	}
	cases = append(cases,
		opCase{name: "drain with expected version, instances held", setup: readyBusy,
			entry: ent(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withVersion(3)),
			check: func(t *testing.T, h *harness, r Result) {
				res := decode[api.Node](t, r)
				n := h.node("node-a")
				if !reflect.DeepEqual(res, *n) {
					t.Errorf("result %+v\nstored %+v", res, *n)
				}
				if n.Status != api.NodeDraining || !n.DrainRequested || n.DrainRequestedAt == nil || !n.DrainRequestedAt.Equal(h.now) || n.RegistrationVersion != 4 {
					t.Errorf("node %+v", n)
				}
				// Volumes still held: DRAINING; nothing held: DRAINED.
				h.report("node-a", "s1", api.Report{Volumes: 1})
				if s := h.node("node-a").Status; s != api.NodeDraining {
					t.Errorf("with a volume: %s", s)
				}
				h.report("node-a", "s1", api.Report{RetainedLayers: 1})
				if s := h.node("node-a").Status; s != api.NodeDraining {
					t.Errorf("with a retained layer: %s", s)
				}
				h.report("node-a", "s1", api.Report{})
				if s := h.node("node-a").Status; s != api.NodeDrained {
					t.Errorf("empty: %s", s)
				}
			}},
		opCase{name: "drain with nothing held", setup: func(h *harness) { readyNode(h); h.report("node-a", "s1", api.Report{}) },
			entry: ent(OpNodeDrain, NodeArgs{NodeID: "node-a"}), check: status(api.NodeDrained)},
		opCase{name: "drain again keeps the first request time", setup: draining, entry: ent(OpNodeDrain, NodeArgs{NodeID: "node-a"}),
			check: func(t *testing.T, h *harness, _ Result) {
				n := h.node("node-a")
				if n.DrainRequestedAt == nil || !n.DrainRequestedAt.Before(h.now) || n.RegistrationVersion != 5 {
					t.Errorf("node %+v", n)
				}
			}},
		opCase{name: "cancel drain", setup: draining, entry: ent(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}, withVersion(4)),
			check: func(t *testing.T, h *harness, r Result) {
				n := h.node("node-a")
				if n.Status != api.NodeReady || n.DrainRequested || n.DrainRequestedAt != nil || n.RegistrationVersion != 5 {
					t.Errorf("node %+v", n)
				}
				if res := decode[api.Node](t, r); res.Status != api.NodeReady {
					t.Errorf("result status %s", res.Status)
				}
			}},
		opCase{name: "cancel drain without session", setup: func(h *harness) { draining(h); h.closeSession("node-a", "s1") },
			entry: ent(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"}), check: status(api.NodeNotReady)},
		opCase{name: "drain revoked node", setup: func(h *harness) { readyBusy(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: ent(OpNodeDrain, NodeArgs{NodeID: "node-a"}), check: status(api.NodeRevoked)},
	)
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// node.isolate

func TestIsolate(t *testing.T) {
	isolate := func(opts ...entryOpt) func(h *harness) Entry {
		return ent(OpNodeIsolate, NodeArgs{NodeID: "node-a"}, opts...)
	}
	closed := func(h *harness) { readyNode(h); h.closeSession("node-a", "s1") } // version 3
	runCases(t, []opCase{
		{name: "live session", setup: readyNode, entry: isolate(), code: api.CodeFailedPrecondition},
		{name: "live session right version", setup: readyNode, entry: isolate(withVersion(2)), code: api.CodeFailedPrecondition},
		{name: "version mismatch", setup: closed, entry: isolate(withVersion(2)), code: api.CodeVersionMismatch},
		{name: "unknown node", setup: closed, entry: ent(OpNodeIsolate, NodeArgs{NodeID: "node-x"}), code: api.CodeNotFound},
		{name: "retired", setup: retiredNode, entry: isolate(), code: api.CodeFailedPrecondition},
		{name: "after session close", setup: closed, entry: isolate(withVersion(3)), check: func(t *testing.T, h *harness, r Result) {
			if res := decode[api.IsolateResult](t, r); res != (api.IsolateResult{NodeID: "node-a"}) {
				t.Errorf("result %+v", res)
			}
			n := h.node("node-a")
			if n.Status != api.NodeIsolated || !n.Isolated || n.IsolatedIncarnation != 1 || n.IsolatedAt == nil || !n.IsolatedAt.Equal(h.now) || n.RegistrationVersion != 4 {
				t.Errorf("node %+v", n)
			}
			for _, inc := range []uint64{0, 1} {
				r := h.expectUnchanged(h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s9", Incarnation: inc}))
				if res := sessionOpenResult(t, r); res.Accepted || res.Refusal != RefusalIsolated {
					t.Errorf("incarnation %d after isolate: %+v", inc, res)
				}
			}
			h.open("node-a", "s2", 2)
			if n := h.node("node-a"); n.Isolated || n.Status != api.NodeReady {
				t.Errorf("after a new incarnation: %+v", n)
			}
		}},
		{name: "never connected node", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: isolate(), check: func(t *testing.T, h *harness, _ Result) {
			if n := h.node("node-a"); !n.Isolated || n.IsolatedIncarnation != 0 {
				t.Errorf("node %+v", n)
			}
			h.open("node-a", "s1", 1)
		}},
		{name: "isolated while draining", setup: func(h *harness) { closed(h); h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}) }, entry: isolate(),
			check: func(t *testing.T, h *harness, _ Result) {
				if s := h.node("node-a").Status; s != api.NodeIsolated {
					t.Errorf("status %s", s)
				}
			}},
	})
}

// ---------------------------------------------------------------------------
// node.retire

func TestRetire(t *testing.T) {
	retire := func(opts ...entryOpt) func(h *harness) Entry {
		return ent(OpNodeRetire, NodeArgs{NodeID: "node-a"}, opts...)
	}
	retiredChecks := func(t *testing.T, h *harness, r Result) {
		n := h.node("node-a")
		if res := decode[api.Node](t, r); !reflect.DeepEqual(res, *n) {
			t.Errorf("result %+v\nstored %+v", res, *n)
		}
		if n.Status != api.NodeRetired || !n.Retired || n.RetiredAt == nil || !n.RetiredAt.Equal(h.now) {
			t.Errorf("node %+v", n)
		}
		if n.Session != nil && n.Session.Alive {
			t.Errorf("session still alive: %+v", n.Session)
		}
		h.advance(time.Second)
		h.fail(api.CodeFailedPrecondition, OpNodeDrain, NodeArgs{NodeID: "node-a"})
		h.fail(api.CodeFailedPrecondition, OpNodeCancelDrain, NodeArgs{NodeID: "node-a"})
		h.fail(api.CodeFailedPrecondition, OpNodeIsolate, NodeArgs{NodeID: "node-a"})
		h.fail(api.CodeFailedPrecondition, OpNodeRetire, NodeArgs{NodeID: "node-a"})
		h.fail(api.CodeFailedPrecondition, OpNodeDrain, NodeArgs{NodeID: "node-a"}, withVersion(n.RegistrationVersion))
		h.fail(api.CodeFailedPrecondition, OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 2000}})
		h.fail(api.CodeFailedPrecondition, OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"node"}, SecretHash: "x", TTL: time.Hour})
		res := sessionOpenResult(t, h.expectUnchanged(h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s9", Incarnation: 99})))
		if res.Accepted || res.Refusal != RefusalNotAdmitted {
			t.Errorf("session of retired node: %+v", res)
		}
	}
	runCases(t, []opCase{
		{name: "READY", setup: readyNode, entry: retire(), code: api.CodeFailedPrecondition},
		{name: "NOT_READY", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: retire(), code: api.CodeFailedPrecondition},
		{name: "DRAINING", setup: func(h *harness) {
			readyNode(h)
			h.report("node-a", "s1", api.Report{Instances: 1})
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		}, entry: retire(), code: api.CodeFailedPrecondition},
		{name: "REVOKED", setup: func(h *harness) {
			h.bootstrap()
			h.join("node-a")
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
		}, entry: retire(), code: api.CodeFailedPrecondition},
		{name: "unknown node", setup: readyNode, entry: ent(OpNodeRetire, NodeArgs{NodeID: "node-x"}), code: api.CodeNotFound},
		{name: "DRAINED version mismatch", setup: drainedNode, entry: retire(withVersion(3)), code: api.CodeVersionMismatch},
		{name: "DRAINED", setup: drainedNode, entry: retire(withVersion(4)), check: func(t *testing.T, h *harness, r Result) {
			if s := h.node("node-a").Session; s.Alive || s.EndReason != "retired" || s.EndedAt == nil {
				t.Errorf("session %+v", s)
			}
			h.fail(api.CodeFailedPrecondition, OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1"})
			retiredChecks(t, h, r)
		}},
		{name: "isolated", setup: isolatedNode, entry: retire(), check: func(t *testing.T, h *harness, r Result) {
			retiredChecks(t, h, r)
			res := sessionOpenResult(t, h.expectUnchanged(h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s9", Incarnation: 1})))
			if res.Refusal != RefusalIsolated {
				t.Errorf("isolated incarnation of a retired node: %+v", res)
			}
		}},
		{name: "isolated and revoked with a pending grant", setup: func(h *harness) {
			isolatedNode(h)
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
			h.grant("node-a")
		}, entry: retire(), check: func(t *testing.T, h *harness, r Result) {
			if s := h.grants()["node-a"].State; s != api.GrantRevoked {
				t.Errorf("pending grant after retire: %s", s)
			}
			h.fail(api.CodeFailedPrecondition, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
			retiredChecks(t, h, r)
		}},
	})
}

// ---------------------------------------------------------------------------
// Queries

func TestListNodesPaging(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	ids := []string{ctrlID, "node-a", "node-b", "node-c", "node-d"}
	for _, id := range ids[1:] {
		h.join(id)
	}
	// Reports so that the listed nodes carry derived fields.
	h.open("node-b", "sb", 1)
	h.report("node-b", "sb", api.Report{Capacity: api.Resources{CPU: 2000, MemoryBytes: 100}})

	list := func(size int, token string) *api.NodeList {
		var l *api.NodeList
		if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListNodes(tx, size, token); return }); err != nil {
			t.Fatal(err)
		}
		return l
	}
	for _, size := range []int{0, 1, 2, 3, 4, 5, 6, 100} {
		var got []string
		token, pages := "", 0
		for {
			l := list(size, token)
			pages++
			if size > 0 && len(l.Nodes) > size {
				t.Fatalf("page size %d: page of %d", size, len(l.Nodes))
			}
			for _, n := range l.Nodes {
				got = append(got, n.NodeID)
				if want := h.node(n.NodeID); !reflect.DeepEqual(n, *want) {
					t.Errorf("listed %+v\nget %+v", n, *want)
				}
			}
			if l.NextPageToken == "" {
				break
			}
			if pages > 10 {
				t.Fatalf("page size %d: no end", size)
			}
			token = l.NextPageToken
		}
		if !reflect.DeepEqual(got, ids) {
			t.Errorf("page size %d: %v, want %v", size, got, ids)
		}
		wantPages := 1
		if size > 0 {
			wantPages = (len(ids) + size - 1) / size
		}
		if pages != wantPages {
			t.Errorf("page size %d: %d pages, want %d", size, pages, wantPages)
		}
	}
	// A token that is not a node id starts at the next one.
	if l := list(2, "node-b0"); len(l.Nodes) != 2 || l.Nodes[0].NodeID != "node-c" || l.NextPageToken != "" {
		t.Errorf("token between ids: %+v", l)
	}
	if l := list(0, "zzz"); len(l.Nodes) != 0 || l.Nodes == nil {
		t.Errorf("token after the last id: %+v", l)
	}
	var empty *api.NodeList
	newHarness(t).f.View(func(tx *bolt.Tx) (err error) { empty, err = ListNodes(tx, 0, ""); return })
	if empty == nil || empty.Nodes == nil || len(empty.Nodes) != 0 {
		t.Errorf("empty state: %+v", empty)
	}
}

func TestGetNodeUnknown(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	if err := h.nodeErr("node-x"); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("got %v", err)
	}
}

func TestLiveSessions(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	h.join("node-b")
	h.open("node-b", "sb", 1)
	h.open(ctrlID, "sc", 1)
	h.closeSession("node-b", "sb")
	var live map[string]string
	h.f.View(func(tx *bolt.Tx) (err error) { live, err = LiveSessions(tx); return })
	if want := map[string]string{ctrlID: "sc", "node-a": "s1"}; !reflect.DeepEqual(live, want) {
		t.Errorf("live %v, want %v", live, want)
	}
}
