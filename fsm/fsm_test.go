package fsm

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// Helpers

// t0 is the fake clock's start; every entry's IssuedAt comes from the
// harness clock, never from time.Now.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

type entryOpt func(*Entry)

func withCommand(id string) entryOpt    { return func(e *Entry) { e.CommandID = id } }
func withVersion(v uint64) entryOpt     { return func(e *Entry) { e.ExpectedVersion = &v } }
func withIssuedAt(t time.Time) entryOpt { return func(e *Entry) { e.IssuedAt = t } }
func withActor(a string) entryOpt       { return func(e *Entry) { e.Actor = a } }
func withIgnoreUnknown() entryOpt       { return func(e *Entry) { e.IgnoreUnknown = true } }
func withRawArgs(raw string) entryOpt   { return func(e *Entry) { e.Args = json.RawMessage(raw) } }
func withArgsOf(other Entry) entryOpt   { return func(e *Entry) { e.Args = other.Args } }

// makeEntry JSON-encodes args (a json.RawMessage is used as is) into an
// entry issued at now.
func makeEntry(now time.Time, op string, args any, opts ...entryOpt) Entry {
	e := Entry{Op: op, IssuedAt: now}
	switch a := args.(type) {
	case nil:
	case json.RawMessage:
		e.Args = a
	default:
		b, err := json.Marshal(args)
		if err != nil {
			panic(err)
		}
		e.Args = b
	}
	for _, o := range opts {
		o(&e)
	}
	return e
}

func openFSM(t testing.TB) *FSM {
	t.Helper()
	f, err := Open(t.TempDir() + "/state.db")
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// harness is one FSM plus the fake clock that stamps its entries.
type harness struct {
	t   testing.TB
	f   *FSM
	now time.Time
}

func newHarness(t testing.TB) *harness {
	return &harness{t: t, f: openFSM(t), now: t0}
}

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

// entry builds an entry at the harness clock.
func (h *harness) entry(op string, args any, opts ...entryOpt) Entry {
	return makeEntry(h.now, op, args, opts...)
}

func (h *harness) apply(es ...Entry) []Result { return h.f.Apply(es) }

// dump is the state without the FSM clock, which every entry moves
// (accepted or not): "changed nothing" means nothing else changed.
func (h *harness) dump() string {
	h.t.Helper()
	b, err := h.f.DumpDecisions()
	if err != nil {
		h.t.Fatalf("dump: %v", err)
	}
	return string(b)
}

func resultCode(r Result) api.Code {
	if r.Error == nil {
		return ""
	}
	return api.CodeOf(r.Err())
}

// expect applies one entry and checks its code ("" = success). A rejected
// entry must leave the state byte-identical.
func (h *harness) expect(code api.Code, e Entry) Result {
	h.t.Helper()
	before := h.dump()
	r := h.f.Apply([]Entry{e})[0]
	if got := resultCode(r); got != code {
		h.t.Fatalf("%s %s: code %q (%v), want %q", e.Op, e.Args, got, r.Error, code)
	}
	if code != "" {
		if r.Value != nil {
			h.t.Fatalf("%s: failed result carries a value %s", e.Op, r.Value)
		}
		if after := h.dump(); after != before {
			h.t.Fatalf("%s rejected with %s but changed the state:\nbefore:\n%s\nafter:\n%s", e.Op, code, before, after)
		}
	}
	return r
}

// expectUnchanged applies one entry that must succeed without changing anything.
func (h *harness) expectUnchanged(e Entry) Result {
	h.t.Helper()
	before := h.dump()
	r := h.expect("", e)
	if after := h.dump(); after != before {
		h.t.Fatalf("%s should change nothing:\nbefore:\n%s\nafter:\n%s", e.Op, before, after)
	}
	return r
}

func (h *harness) ok(op string, args any, opts ...entryOpt) Result {
	h.t.Helper()
	return h.expect("", h.entry(op, args, opts...))
}

func (h *harness) fail(code api.Code, op string, args any, opts ...entryOpt) *api.Error {
	h.t.Helper()
	return h.expect(code, h.entry(op, args, opts...)).Error
}

func decode[T any](t testing.TB, r Result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Value, &v); err != nil {
		t.Fatalf("decode result %s: %v", r.Value, err)
	}
	return v
}

func (h *harness) node(id string) *api.Node {
	h.t.Helper()
	var n *api.Node
	if err := h.f.View(func(tx *bolt.Tx) error {
		var err error
		if n, err = GetNode(tx, id); err != nil {
			return err
		}
		// The control sessions' shortcut reads the same.
		if d, err := NodeDrainRequested(tx, id); err != nil || d != n.DrainRequested {
			h.t.Errorf("node %s: NodeDrainRequested %v, %v; the record says %v", id, d, err, n.DrainRequested)
		}
		// A list reads the same, but of the host usage only whether
		// memory is tight (the usage is the get's).
		want := *n
		if want.HostUsage != nil {
			tight := want.HostUsage.MemoryTight
			want.MemoryTight, want.HostUsage = &tight, nil
		}
		l, err := ListNodes(tx, 0, "")
		if err != nil {
			return err
		}
		for _, got := range l.Nodes {
			if got.NodeID == id && !reflect.DeepEqual(got, want) {
				h.t.Errorf("node %s listed %+v\nwant %+v", id, got, want)
			}
		}
		return nil
	}); err != nil {
		h.t.Fatalf("get node %s: %v", id, err)
	}
	return n
}

func (h *harness) nodeErr(id string) error {
	return h.f.View(func(tx *bolt.Tx) error {
		_, err := GetNode(tx, id)
		if _, derr := NodeDrainRequested(tx, id); api.CodeOf(derr) != api.CodeOf(err) || (err == nil) != (derr == nil) {
			h.t.Errorf("node %s: NodeDrainRequested says %v, GetNode %v", id, derr, err)
		}
		return err
	})
}

func (h *harness) version(id string) uint64 { h.t.Helper(); return h.node(id).RegistrationVersion }

func (h *harness) grants() map[string]api.Grant {
	h.t.Helper()
	out := map[string]api.Grant{}
	if err := h.f.View(func(tx *bolt.Tx) error {
		gs, err := ListGrants(tx, h.now)
		for _, g := range gs {
			out[g.NodeID] = g
		}
		return err
	}); err != nil {
		h.t.Fatalf("list grants: %v", err)
	}
	return out
}

func (h *harness) overcommitDefault() api.OvercommitDefault {
	h.t.Helper()
	var d api.OvercommitDefault
	if err := h.f.View(func(tx *bolt.Tx) (err error) { d, err = GetOvercommitDefault(tx); return }); err != nil {
		h.t.Fatal(err)
	}
	return d
}

// Fixtures.

const ctrlID = "ctrl-1"

func (h *harness) bootstrap() {
	h.t.Helper()
	h.ok(OpBootstrap, BootstrapArgs{ClusterID: "cluster-1", NodeID: ctrlID, Roles: []string{"ctrl", "node"}, Address: "10.0.0.1:7000"})
}

func secretOf(id string) string { return "sha256-of-secret-" + id }

func (h *harness) grant(id string, roles ...string) {
	h.t.Helper()
	if len(roles) == 0 {
		roles = []string{"node"}
	}
	h.ok(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: roles, SecretHash: secretOf(id), TTL: time.Hour})
}

// join grants and consumes: the node is admitted without a session.
func (h *harness) join(id string, roles ...string) {
	h.t.Helper()
	h.grant(id, roles...)
	h.advance(time.Second)
	h.ok(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: secretOf(id), Address: "addr-" + id})
}

func (h *harness) open(id, session string, inc uint64) {
	h.t.Helper()
	r := h.ok(OpSessionOpen, SessionOpenArgs{NodeID: id, SessionID: session, Incarnation: inc, Release: "v0.2.0", Revision: "abc"})
	if res := decode[SessionOpenResult](h.t, r); !res.Accepted {
		h.t.Fatalf("session %s of %s incarnation %d refused: %+v", session, id, inc, res)
	}
}

func (h *harness) closeSession(id, session string) {
	h.t.Helper()
	r := h.ok(OpSessionClose, SessionCloseArgs{NodeID: id, SessionID: session, Reason: "shutdown"})
	if !decode[map[string]bool](h.t, r)["closed"] {
		h.t.Fatalf("session %s of %s not closed", session, id)
	}
}

func (h *harness) report(id, session string, rep api.Report) {
	h.t.Helper()
	h.ok(OpNodeReport, ReportArgs{NodeID: id, SessionID: session, Report: rep})
}

// readyNode: bootstrapped cluster, node-a admitted with live session s1 incarnation 1.
func readyNode(h *harness) {
	h.t.Helper()
	h.bootstrap()
	h.join("node-a")
	h.open("node-a", "s1", 1)
}

// drainedNode: node-a has reported nothing held and is DRAINED with session s1 live.
func drainedNode(h *harness) {
	h.t.Helper()
	readyNode(h)
	h.report("node-a", "s1", api.Report{})
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
	if s := h.node("node-a").Status; s != api.NodeDrained {
		h.t.Fatalf("fixture: status %s, want DRAINED", s)
	}
}

// isolatedNode: node-a's session s1 (incarnation 1) closed and the node isolated.
func isolatedNode(h *harness) {
	h.t.Helper()
	readyNode(h)
	h.closeSession("node-a", "s1")
	h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"})
}

func retiredNode(h *harness) {
	h.t.Helper()
	drainedNode(h)
	h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"})
}

func sessionOpenResult(t testing.TB, r Result) SessionOpenResult {
	t.Helper()
	return decode[SessionOpenResult](t, r)
}

// opCase is one row of an op table: build the state, apply one entry,
// check the code (a rejection must change nothing) and the outcome.
type opCase struct {
	name      string
	setup     func(h *harness)
	entry     func(h *harness) Entry
	code      api.Code
	unchanged bool // a success that must not change the state
	check     func(t *testing.T, h *harness, r Result)
}

func runCases(t *testing.T, cases []opCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			if c.setup != nil {
				c.setup(h)
			}
			h.advance(time.Second)
			e := c.entry(h)
			var r Result
			if c.unchanged {
				if c.code != "" {
					t.Fatal("bad case: unchanged with an error code")
				}
				r = h.expectUnchanged(e)
			} else {
				r = h.expect(c.code, e)
			}
			if c.check != nil {
				c.check(t, h, r)
			}
		})
	}
}

func ent(op string, args any, opts ...entryOpt) func(h *harness) Entry {
	return func(h *harness) Entry { return h.entry(op, args, opts...) }
}

// ---------------------------------------------------------------------------
// Every op

// allOps is every op of ops.go; TestEveryOpHasAHandler keeps it in step.
var allOps = []string{
	OpBootstrap, OpEnrollmentGrant, OpEnrollmentRevoke, OpEnrollmentConsume,
	OpSessionOpen, OpSessionClose, OpNodeReport, OpNodeDrain, OpNodeCancelDrain,
	OpNodeIsolate, OpNodeRetire, OpOvercommitSetDefault, OpOvercommitSet,
	OpOvercommitAck, OpCommandsExpire,
	OpWorkspaceCreate, OpWorkspaceStart, OpWorkspaceStop, OpWorkspaceDelete, OpWorkspaceResult,
	OpWorkspaceSetNetwork,
	OpEgressCreate, OpEgressUpdate, OpEgressDelete, OpResolverCreate, OpResolverDelete,
	OpPoolSetCapacity, OpPoolDeclareLost,
	OpVolumeCreate, OpVolumeResize, OpVolumeDelete, OpVolumeResult, OpMemberLevel, OpWorkspacePause,
	OpTemplatePublish, OpTemplateDelete, OpPlatformPublish, OpPlatformApprove, OpPlatformWithdraw,
	OpTransferExport, OpTransferResult, OpTransferDelete, OpTransferProgress,
	OpOperatorIssue, OpOperatorRevoke,
	OpCARotateBegin, OpCARotateSign, OpCARotateFinish,
	OpNamespaceCreate, OpNamespaceDelete, OpAPIKeyCreate, OpAPIKeyRevoke, OpNamespaceQuota, OpAPIKeyUsed,
	OpWorkspaceSetTimeout, OpWorkspaceTimedOut, OpNamespaceDefaults, OpWorkspaceIdlePause,
}

func TestEveryOpHasAHandler(t *testing.T) {
	if len(handlers) != len(allOps) {
		t.Fatalf("%d handlers but %d ops in the test list: add the new op to allOps and test it", len(handlers), len(allOps))
	}
	for _, op := range allOps {
		if handlers[op] == nil {
			t.Errorf("op %s has no handler", op)
		}
	}
}

func TestMalformedArgsEveryOp(t *testing.T) {
	for _, op := range allOps {
		for _, raw := range []string{`"not an object"`, `{"node_id":7,"before":7,"cpu":true}`, `[1,2]`, `{`, ``} {
			t.Run(op+"/"+raw, func(t *testing.T) {
				h := newHarness(t)
				readyNode(h)
				h.advance(time.Second)
				h.expect(api.CodeInvalidArgument, h.entry(op, nil, withRawArgs(raw)))
			})
		}
	}
}

// ---------------------------------------------------------------------------
// Unknown ops

// An unknown op without IgnoreUnknown halts the batch: TestUnknownOpHalts.
func TestUnknownOp(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	r := h.expectUnchanged(h.entry("node.teleport", NodeArgs{NodeID: "node-a"}, withIgnoreUnknown(), withCommand("tp")))
	if !reflect.DeepEqual(r, Result{}) {
		t.Errorf("ignored unknown op result %+v", r)
	}
	r = h.expectUnchanged(h.entry("", nil, withIgnoreUnknown()))
	if !reflect.DeepEqual(r, Result{}) {
		t.Errorf("ignored empty op result %+v", r)
	}
	// IgnoreUnknown does not change a known op.
	h.expect(api.CodeNotFound, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-x"}, withIgnoreUnknown()))
	h.expect("", h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withIgnoreUnknown()))
}

// A batch is one transaction, but each entry sees the effects of the ones
// before it, and a rejected entry in the middle changes nothing.
func TestBatchSemantics(t *testing.T) {
	h := newHarness(t)
	rs := h.apply(
		h.entry(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID, Roles: []string{"ctrl"}}),
		h.entry(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"node"}, SecretHash: "h", TTL: time.Minute}),
		h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: "bad"}),
		h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: "h"}),
		h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s1", Incarnation: 1}),
		h.entry(OpNodeIsolate, NodeArgs{NodeID: "node-a"}),
		h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withVersion(2)),
	)
	want := []api.Code{"", "", api.CodeUnauthenticated, "", "", api.CodeFailedPrecondition, ""}
	for i, r := range rs {
		if resultCode(r) != want[i] {
			t.Errorf("entry %d: %v, want %q", i, r.Error, want[i])
		}
	}
	if n := h.node("node-a"); n.Status != api.NodeDrained || n.RegistrationVersion != 3 {
		t.Errorf("node %+v", n)
	}
}

// Nothing but bootstrap is accepted before the cluster exists: a grant or a
// node record from before bootstrap could otherwise collide with it.
func TestOpsBeforeBootstrapRefused(t *testing.T) {
	h := newHarness(t)
	before := h.dump()
	for _, e := range []Entry{
		h.entry(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"node"}, SecretHash: "x", TTL: time.Hour}),
		h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}),
		h.entry(OpCommandsExpire, CommandsExpireArgs{Before: h.now}),
	} {
		res := h.f.Apply([]Entry{e})[0]
		if res.Error == nil || res.Error.Code != api.CodeFailedPrecondition {
			t.Fatalf("%s before bootstrap: %+v, want failed_precondition", e.Op, res)
		}
	}
	if before != h.dump() {
		t.Fatal("refused ops before bootstrap changed the state")
	}
}
