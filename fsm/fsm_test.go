package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
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
// cluster.bootstrap

func TestBootstrap(t *testing.T) {
	good := BootstrapArgs{ClusterID: "cluster-1", NodeID: ctrlID, Roles: []string{"ctrl", "node"}, Address: "10.0.0.1:7000"}
	noCluster := func(t *testing.T, h *harness, _ Result) {
		h.f.View(func(tx *bolt.Tx) error {
			if id := ClusterID(tx); id != "" {
				t.Errorf("cluster id %q after a refused bootstrap", id)
			}
			return nil
		})
	}
	runCases(t, []opCase{
		{name: "ok", entry: ent(OpBootstrap, good), check: func(t *testing.T, h *harness, r Result) {
			if got := decode[map[string]string](t, r)["cluster_id"]; got != "cluster-1" {
				t.Errorf("result cluster_id %q", got)
			}
			h.f.View(func(tx *bolt.Tx) error {
				if id := ClusterID(tx); id != "cluster-1" {
					t.Errorf("ClusterID %q", id)
				}
				if v := tx.Bucket(bucketMeta).Get(keySchemaVersion); !bytes.Equal(v, []byte{0, 0, 0, 0, 0, 0, 0, SchemaVersion}) {
					t.Errorf("schema version %x", v)
				}
				return nil
			})
			n := h.node(ctrlID)
			if n.Admission != api.Admitted || n.RegistrationVersion != 1 || n.Address != good.Address ||
				!reflect.DeepEqual(n.Roles, good.Roles) || !n.AdmittedAt.Equal(h.now) || n.Status != api.NodeNotReady {
				t.Errorf("bootstrap node %+v", n)
			}
			if d := h.overcommitDefault(); d != (api.OvercommitDefault{CPU: 1000, Memory: 1000, Version: 1}) {
				t.Errorf("overcommit default %+v", d)
			}
		}},
		{name: "twice", setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "cluster-2", NodeID: "ctrl-2", Roles: []string{"ctrl"}}),
			code:  api.CodeFailedPrecondition},
		{name: "twice same args", setup: func(h *harness) { h.bootstrap() }, entry: ent(OpBootstrap, good), code: api.CodeFailedPrecondition},
		{name: "twice after an empty cluster id", setup: func(h *harness) {
			h.ok(OpBootstrap, BootstrapArgs{NodeID: ctrlID, Roles: []string{"ctrl"}})
		}, entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c2", NodeID: "ctrl-2", Roles: []string{"ctrl"}}), code: api.CodeFailedPrecondition},
		{name: "bad node id", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: "-ctrl", Roles: []string{"ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "empty node id", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", Roles: []string{"ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "no roles", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "unknown role", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID, Roles: []string{"admin"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "repeated role", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID, Roles: []string{"ctrl", "ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
	})
}

// ---------------------------------------------------------------------------
// enrollment.grant

func TestEnrollmentGrant(t *testing.T) {
	grantFor := func(id string) func(h *harness) Entry {
		return ent(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: "h", TTL: time.Hour})
	}
	var cases []opCase
	for _, id := range []string{"", "-a", ".a", "a b", "a/b", "ä", strings.Repeat("x", 64)} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad node id %q", id), setup: func(h *harness) { h.bootstrap() },
			entry: grantFor(id), code: api.CodeInvalidArgument})
	}
	for _, roles := range [][]string{nil, {}, {"admin"}, {"node", "node"}, {"ctrl", "Node"}} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad roles %q", roles), setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: roles, SecretHash: "h", TTL: time.Hour}),
			code:  api.CodeInvalidArgument})
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		cases = append(cases, opCase{name: fmt.Sprintf("ttl %v", ttl), setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"node"}, SecretHash: "h", TTL: ttl}),
			code:  api.CodeInvalidArgument})
	}
	cases = append(cases,
		opCase{name: "longest node id", setup: func(h *harness) { h.bootstrap() }, entry: grantFor("a" + strings.Repeat("._-9", 15) + "zz")},
		opCase{name: "bootstrap node already admitted", setup: func(h *harness) { h.bootstrap() }, entry: grantFor(ctrlID), code: api.CodeFailedPrecondition},
		opCase{name: "joined node already admitted", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: grantFor("node-a"), code: api.CodeFailedPrecondition},
		opCase{name: "retired node", setup: retiredNode, entry: grantFor("node-a"), code: api.CodeFailedPrecondition},
		opCase{name: "pending grant", setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"ctrl", "node"}, SecretHash: "h", TTL: 90 * time.Minute}),
			check: func(t *testing.T, h *harness, r Result) {
				if strings.Contains(string(r.Value), "secret") {
					t.Errorf("result leaks the secret hash: %s", r.Value)
				}
				g := decode[api.Grant](t, r)
				want := api.Grant{NodeID: "node-a", Roles: []string{"ctrl", "node"}, IssuedAt: h.now, ExpiresAt: h.now.Add(90 * time.Minute), State: api.GrantPending}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("result %+v, want %+v", g, want)
				}
				if got := h.grants()["node-a"]; !reflect.DeepEqual(got, want) {
					t.Errorf("listed %+v, want %+v", got, want)
				}
				if err := h.nodeErr("node-a"); api.CodeOf(err) != api.CodeNotFound {
					t.Errorf("a grant registered the node: %v", err)
				}
				h.advance(90 * time.Minute)
				if s := h.grants()["node-a"].State; s != api.GrantExpired {
					t.Errorf("grant at its expiry listed %s", s)
				}
			}},
		opCase{name: "new grant replaces the pending one", setup: func(h *harness) { h.bootstrap(); h.grant("node-a") },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"ctrl"}, SecretHash: "new-hash", TTL: time.Hour}),
			check: func(t *testing.T, h *harness, _ Result) {
				h.fail(api.CodeUnauthenticated, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
				h.ok(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: "new-hash"})
				if r := h.node("node-a").Roles; !reflect.DeepEqual(r, []string{"ctrl"}) {
					t.Errorf("roles %v", r)
				}
			}},
		opCase{name: "revoked node may be granted again", setup: func(h *harness) {
			h.bootstrap()
			h.join("node-a")
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
		}, entry: grantFor("node-a"), check: func(t *testing.T, h *harness, _ Result) {
			if s := h.grants()["node-a"].State; s != api.GrantPending {
				t.Errorf("grant %s", s)
			}
		}},
	)
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// enrollment.consume

func TestEnrollmentConsume(t *testing.T) {
	consume := func(id, hash string, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: hash, Address: "10.0.0.9:7000"}, opts...)
	}
	grantAt := func(h *harness) { h.bootstrap(); h.grant("node-a", "ctrl", "node") }
	runCases(t, []opCase{
		{name: "no grant", setup: func(h *harness) { h.bootstrap() }, entry: consume("node-x", "h"), code: api.CodeUnauthenticated},
		{name: "wrong secret hash", setup: grantAt, entry: consume("node-a", "wrong"), code: api.CodeUnauthenticated},
		{name: "empty secret hash", setup: grantAt, entry: consume("node-a", ""), code: api.CodeUnauthenticated},
		{name: "other node's grant", setup: grantAt, entry: consume("node-b", secretOf("node-a")), code: api.CodeUnauthenticated},
		{name: "used", setup: func(h *harness) {
			grantAt(h)
			h.ok(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
		},
			entry: consume("node-a", secretOf("node-a")), code: api.CodeFailedPrecondition},
		{name: "expired at ExpiresAt", setup: grantAt,
			entry: func(h *harness) Entry {
				return h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")}, withIssuedAt(h.grants()["node-a"].ExpiresAt))
			}, code: api.CodeFailedPrecondition},
		{name: "expired after ExpiresAt", setup: grantAt,
			entry: consume("node-a", secretOf("node-a"), withIssuedAt(t0.Add(48*time.Hour))), code: api.CodeFailedPrecondition},
		{name: "just before ExpiresAt", setup: grantAt,
			entry: func(h *harness) Entry {
				return h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")}, withIssuedAt(h.grants()["node-a"].ExpiresAt.Add(-time.Nanosecond)))
			}},
		{name: "revoked", setup: func(h *harness) { grantAt(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: consume("node-a", secretOf("node-a")), code: api.CodeFailedPrecondition},
		{name: "success admits with the grant's roles", setup: grantAt, entry: consume("node-a", secretOf("node-a")),
			check: func(t *testing.T, h *harness, r Result) {
				res := decode[api.Node](t, r)
				n := h.node("node-a")
				if !reflect.DeepEqual(res, *n) {
					t.Errorf("result %+v\nstored %+v", res, *n)
				}
				if n.Admission != api.Admitted || !reflect.DeepEqual(n.Roles, []string{"ctrl", "node"}) || n.Address != "10.0.0.9:7000" ||
					!n.AdmittedAt.Equal(h.now) || n.RegistrationVersion != 1 || n.Status != api.NodeNotReady || n.Session != nil {
					t.Errorf("admitted node %+v", n)
				}
				g := h.grants()["node-a"]
				if g.State != api.GrantUsed || g.UsedAt == nil || !g.UsedAt.Equal(h.now) || g.UsedBy != "10.0.0.9:7000" {
					t.Errorf("grant after use %+v", g)
				}
			}},
		{name: "revoked node rejoins keeping its version history", setup: func(h *harness) {
			h.bootstrap()
			h.join("node-a")
			h.open("node-a", "s1", 3)
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) // version 3
			h.grant("node-a", "ctrl")
		}, entry: consume("node-a", secretOf("node-a")), check: func(t *testing.T, h *harness, _ Result) {
			n := h.node("node-a")
			if n.Admission != api.Admitted || n.RegistrationVersion != 4 || !reflect.DeepEqual(n.Roles, []string{"ctrl"}) || n.LastIncarnation != 3 {
				t.Errorf("rejoined node %+v", n)
			}
			if r := sessionOpenResult(t, h.ok(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2})); r.Refusal != RefusalStale {
				t.Errorf("older incarnation after rejoin: %+v", r)
			}
		}},
	})
}

// ---------------------------------------------------------------------------
// enrollment.revoke

func TestEnrollmentRevoke(t *testing.T) {
	revoke := ent(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
	runCases(t, []opCase{
		{name: "unknown", setup: func(h *harness) { h.bootstrap() }, entry: revoke, code: api.CodeNotFound},
		{name: "pending grant", setup: func(h *harness) { h.bootstrap(); h.grant("node-a") }, entry: revoke,
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != true || got["node_revoked"] != false {
					t.Errorf("result %v", got)
				}
				if s := h.grants()["node-a"].State; s != api.GrantRevoked {
					t.Errorf("grant state %s", s)
				}
				h.fail(api.CodeFailedPrecondition, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
			}},
		{name: "admitted node with a live session", setup: readyNode, entry: revoke,
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != false || got["node_revoked"] != true {
					t.Errorf("result %v", got)
				}
				n := h.node("node-a")
				if n.Status != api.NodeRevoked || n.Admission != api.Revoked || n.RegistrationVersion != 3 {
					t.Errorf("revoked node %+v", n)
				}
				if s := n.Session; s.Alive || s.EndedAt == nil || !s.EndedAt.Equal(h.now) || s.EndReason != "revoked" {
					t.Errorf("session after revoke %+v", s)
				}
				h.f.View(func(tx *bolt.Tx) error {
					live, _ := LiveSessions(tx)
					if _, ok := live["node-a"]; ok {
						t.Errorf("live sessions %v", live)
					}
					return nil
				})
				h.fail(api.CodeFailedPrecondition, OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1"})
				if res := sessionOpenResult(t, h.expectUnchanged(h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2}))); res.Accepted || res.Refusal != RefusalNotAdmitted {
					t.Errorf("session of a revoked node: %+v", res)
				}
			}},
		{name: "already revoked changes nothing", setup: func(h *harness) { readyNode(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: revoke, unchanged: true, check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != false || got["node_revoked"] != false {
					t.Errorf("result %v", got)
				}
			}},
		{name: "retired node stays retired", setup: retiredNode, entry: revoke, unchanged: true, check: func(t *testing.T, h *harness, _ Result) {
			if s := h.node("node-a").Status; s != api.NodeRetired {
				t.Errorf("status %s", s)
			}
		}},
	})
}

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
