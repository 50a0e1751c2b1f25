package fsm

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// Workspace helpers

const gib = uint64(1) << 30

var defaultPoolAvailable = []api.Pool{{PoolID: DefaultPool, Path: "/srv/default", Available: true, CapacityBytes: 1 << 40, FreeBytes: 1 << 39}}

// testTemplates are built on every schedulable node of these tests.
var testTemplates = []string{"kibotos-base", "kibotos-coding"}

func sessOf(node string) string { return "s-" + node }

// schedNode admits node (unless it is the bootstrap node), opens session
// s-<node> incarnation inc, acknowledges the default overcommit and reports
// capacity with the default pool: the node is a placement candidate.
func (h *harness) schedNode(id string, inc uint64, cpu api.Milli, mem uint64) {
	h.t.Helper()
	if id != ctrlID && inc == 1 {
		h.join(id)
	}
	h.open(id, sessOf(id), inc)
	h.ok(OpOvercommitAck, OvercommitAckArgs{NodeID: id, SessionID: sessOf(id), Values: api.Multipliers{CPU: 1000, Memory: 1000}})
	h.report(id, sessOf(id), api.Report{Capacity: api.Resources{CPU: cpu, MemoryBytes: mem}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.poolCapacity(api.PrivatePoolID(id), 1<<40)
}

// poolCapacity gives a declared pool a capacity unless it has one.
func (h *harness) poolCapacity(pool string, size uint64) {
	h.t.Helper()
	var p *api.StoragePool
	if err := h.f.View(func(tx *bolt.Tx) (err error) { p, err = GetStoragePool(tx, pool); return }); err != nil {
		h.t.Fatalf("storage pool %s: %v", pool, err)
	}
	if p.CapacityBytes == nil {
		h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: pool, CapacityBytes: size})
	}
}

// oneNode: node-a with 4 CPU and 8 GiB is the only candidate.
func oneNode(h *harness) {
	h.t.Helper()
	h.bootstrap()
	h.schedNode("node-a", 1, 4000, 8*gib)
}

// twoNodes: node-a and node-b, 4 CPU and 8 GiB each.
func twoNodes(h *harness) {
	h.t.Helper()
	oneNode(h)
	h.schedNode("node-b", 1, 4000, 8*gib)
}

func wsArgs(cpu api.Milli, mem uint64) WorkspaceCreateArgs {
	return WorkspaceCreateArgs{Template: "kibotos-coding", CPU: cpu, MemoryBytes: mem}
}

var smallWS = wsArgs(1000, gib)

// create applies a create with command id cmd and returns the Workspace.
func (h *harness) create(cmd string, a WorkspaceCreateArgs) api.Workspace {
	h.t.Helper()
	h.advance(time.Second)
	w := decode[api.Workspace](h.t, h.ok(OpWorkspaceCreate, a, withCommand(cmd)))
	if w.WorkspaceID != WorkspaceIDFor(cmd) {
		h.t.Fatalf("create %s made %s, want %s", cmd, w.WorkspaceID, WorkspaceIDFor(cmd))
	}
	return w
}

func (h *harness) ws(id string) *api.Workspace {
	h.t.Helper()
	var w *api.Workspace
	if err := h.f.View(func(tx *bolt.Tx) (err error) { w, err = GetWorkspace(tx, id); return }); err != nil {
		h.t.Fatalf("get workspace %s: %v", id, err)
	}
	return w
}

func (h *harness) wsErr(id string) error {
	return h.f.View(func(tx *bolt.Tx) error { _, err := GetWorkspace(tx, id); return err })
}

// resultArgs is the node's answer to the Workspace's pending command.
func (h *harness) resultArgs(id, outcome, msg string) WorkspaceResultArgs {
	h.t.Helper()
	w := h.ws(id)
	if w.Pending == nil {
		h.t.Fatalf("workspace %s has no pending command: %+v", id, w)
	}
	return WorkspaceResultArgs{NodeID: w.Pending.NodeID, SessionID: sessOf(w.Pending.NodeID), WorkspaceID: id,
		CommandID: w.Pending.CommandID, Outcome: outcome, Error: msg}
}

// answer sends the node's answer to the pending command; it must apply.
func (h *harness) answer(id, outcome, msg string) *api.Workspace {
	h.t.Helper()
	h.advance(time.Second)
	r := h.ok(OpWorkspaceResult, h.resultArgs(id, outcome, msg))
	if !decode[map[string]bool](h.t, r)["applied"] {
		h.t.Fatalf("answer %s to %s not applied", outcome, id)
	}
	if err := h.wsErr(id); api.CodeOf(err) == api.CodeNotFound {
		return nil
	}
	return h.ws(id)
}

// running creates a Workspace and answers its start ok: AVAILABLE.
func (h *harness) running(cmd string, a WorkspaceCreateArgs) api.Workspace {
	h.t.Helper()
	w := h.create(cmd, a)
	return *h.answer(w.WorkspaceID, OutcomeOK, "")
}

// stopped creates, starts and stops a Workspace: STOPPED, layer kept.
func (h *harness) stopped(cmd string, a WorkspaceCreateArgs) api.Workspace {
	h.t.Helper()
	w := h.running(cmd, a)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	return *h.answer(w.WorkspaceID, OutcomeOK, "")
}

func (h *harness) holds(node string) Holds {
	h.t.Helper()
	var hd Holds
	if err := h.f.View(func(tx *bolt.Tx) (err error) { hd, err = nodeHolds(tx, node); return }); err != nil {
		h.t.Fatal(err)
	}
	return hd
}

func (h *harness) listWS(f WorkspaceFilter, size int, token string) (*api.WorkspaceList, error) {
	var l *api.WorkspaceList
	err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListWorkspaces(tx, f, size, token); return })
	return l, err
}

// listIDs lists every page and returns the ids.
func (h *harness) listIDs(f WorkspaceFilter) []string {
	h.t.Helper()
	l, err := h.listWS(f, 0, "")
	if err != nil {
		h.t.Fatalf("list %+v: %v", f, err)
	}
	ids := []string{}
	for _, w := range l.Workspaces {
		ids = append(ids, w.WorkspaceID)
	}
	return ids
}

func (h *harness) pendingOn(node string) []string {
	h.t.Helper()
	var ids []string
	if err := h.f.View(func(tx *bolt.Tx) error {
		ws, err := PendingCommands(tx, node)
		for _, w := range ws {
			ids = append(ids, w.WorkspaceID)
		}
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	return ids
}

// ---------------------------------------------------------------------------
// workspace.create

func TestWorkspaceCreate(t *testing.T) {
	create := func(a WorkspaceCreateArgs, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpWorkspaceCreate, a, append([]entryOpt{withCommand("c1")}, opts...)...)
	}
	placedOn := func(node string) func(t *testing.T, h *harness, r Result) {
		return func(t *testing.T, h *harness, r Result) {
			w := decode[api.Workspace](t, r)
			if w.NodeID != node {
				t.Errorf("placed on %s, want %s", w.NodeID, node)
			}
			checkIndex(t, h.f)
		}
	}
	pinned := func(node string) WorkspaceCreateArgs { a := smallWS; a.NodeID = node; return a }
	cases := []opCase{
		{name: "first create", setup: twoNodes, entry: create(WorkspaceCreateArgs{Template: "kibotos-coding", CPU: 2000, MemoryBytes: 2 * gib, Labels: map[string]string{"team": "x"}}),
			check: func(t *testing.T, h *harness, r Result) {
				w := decode[api.Workspace](t, r)
				if stored := h.ws(w.WorkspaceID); !reflect.DeepEqual(*stored, w) {
					t.Errorf("result %+v\nstored %+v", w, *stored)
				}
				id := WorkspaceIDFor("c1")
				want := api.Workspace{WorkspaceID: id, Version: 1, State: api.WorkspaceCreating, Template: "kibotos-coding",
					CPU: 2000, MemoryBytes: 2 * gib, Labels: map[string]string{"team": "x"}, Network: &api.NetworkPolicy{Egress: api.EgressNone}, CreatedAt: h.now, UpdatedAt: h.now,
					NodeID: "node-a", InstanceID: instanceIDFor(id, 1), Instances: 1,
					Layer:   &api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a"), Held: true},
					Pending: &api.WorkspaceCommand{Kind: api.WSCmdStart, CommandID: id + "/1", NodeID: "node-a", InstanceID: instanceIDFor(id, 1), IssuedAt: h.now}}
				if !reflect.DeepEqual(w, want) {
					t.Errorf("workspace\n %+v\nwant\n %+v", w, want)
				}
				if !strings.HasPrefix(id, "ws-") || !strings.HasPrefix(w.InstanceID, "inst-") {
					t.Errorf("ids %s %s", id, w.InstanceID)
				}
				if hd := h.holds("node-a"); hd != (Holds{Instances: 1, Layers: 1, Allocated: api.Resources{CPU: 2000, MemoryBytes: 2 * gib}}) {
					t.Errorf("holds %+v", hd)
				}
				if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{id}) {
					t.Errorf("pending on node-a %v", p)
				}
				checkIndex(t, h.f)
			}},
		{name: "most free room", setup: func(h *harness) {
			twoNodes(h)
			h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 2000, MemoryBytes: gib}, Pools: defaultPoolAvailable, Templates: testTemplates})
		}, entry: create(smallWS), check: placedOn("node-b")},
		{name: "most free room relative to size", setup: func(h *harness) {
			oneNode(h)
			h.schedNode("node-b", 1, 16000, 32*gib)
		}, entry: create(smallWS), check: placedOn("node-b")},
		{name: "pinned to the less free node", setup: func(h *harness) {
			oneNode(h)
			h.schedNode("node-b", 1, 16000, 32*gib)
		}, entry: create(pinned("node-a")), check: placedOn("node-a")},
		{name: "pinned to a drained node", setup: func(h *harness) { twoNodes(h); h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"}) },
			entry: create(pinned("node-a")), code: api.CodeFailedPrecondition},
		{name: "pinned to an unknown node", setup: twoNodes, entry: create(pinned("node-x")), code: api.CodeNotFound},
		{name: "pinned to a ctrl-only node", setup: func(h *harness) { twoNodes(h); h.join("ctrl-2", "ctrl") },
			entry: create(pinned("ctrl-2")), code: api.CodeFailedPrecondition},
		{name: "pinned to a full node", setup: func(h *harness) { twoNodes(h); h.create("c0", wsArgs(4000, gib)) },
			entry: create(pinned("node-a")), code: api.CodeFailedPrecondition},
		{name: "pinned to a node without the default pool", setup: func(h *harness) {
			twoNodes(h)
			h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}})
		}, entry: create(pinned("node-a")), code: api.CodeFailedPrecondition},
		{name: "default pool unavailable: placed elsewhere", setup: func(h *harness) {
			twoNodes(h)
			h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: []api.Pool{{PoolID: DefaultPool}}, Templates: testTemplates})
		}, entry: create(smallWS), check: placedOn("node-b")},
		{name: "no room anywhere", setup: func(h *harness) { twoNodes(h); h.create("c0", wsArgs(4000, gib)); h.create("c00", wsArgs(4000, gib)) },
			entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "ctrl counts its own placements before the node reports", setup: func(h *harness) { oneNode(h); h.create("c0", wsArgs(3000, gib)) },
			entry: create(wsArgs(2000, gib)), code: api.CodeResourceExhausted},
		{name: "ctrl counts its own memory placements", setup: func(h *harness) { oneNode(h); h.create("c0", wsArgs(1000, 7*gib)) },
			entry: create(wsArgs(1000, gib+64<<20)), code: api.CodeResourceExhausted},
		{name: "exactly the room left", setup: func(h *harness) { oneNode(h); h.create("c0", wsArgs(3000, 7*gib)) },
			entry: create(wsArgs(1000, gib)), check: placedOn("node-a")},
		{name: "overcommit not acknowledged", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 2000}})
		}, entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "overcommit raises the room", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpOvercommitSet, OvercommitSetArgs{NodeID: "node-a", CPU: &MultiplierChange{Value: 2000}})
			h.ok(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Values: api.Multipliers{CPU: 2000, Memory: 1000}})
			h.create("c0", wsArgs(4000, gib))
		}, entry: create(wsArgs(4000, gib)), check: placedOn("node-a")},
		{name: "no report", setup: func(h *harness) { h.bootstrap(); h.join("node-a"); h.open("node-a", "s1", 1) },
			entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "no session", setup: func(h *harness) { oneNode(h); h.closeSession("node-a", sessOf("node-a")) },
			entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "memory tight", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates},
				HostUsage: &api.HostUsage{MemoryTight: true}})
		}, entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "no nodes", setup: func(h *harness) { h.bootstrap() }, entry: create(smallWS), code: api.CodeResourceExhausted},
		{name: "no command id", setup: twoNodes, entry: ent(OpWorkspaceCreate, smallWS), code: api.CodeInvalidArgument},
		{name: "smallest memory", setup: twoNodes, entry: create(wsArgs(1000, MinWorkspaceMemory)), check: placedOn("node-a")},
	}
	bad := map[string]WorkspaceCreateArgs{}
	for _, tmpl := range []string{"", "Kibotos", "-x", ".x", "a b", "a/b", strings.Repeat("x", 64)} {
		a := smallWS
		a.Template = tmpl
		bad[fmt.Sprintf("template %q", tmpl)] = a
	}
	for _, cpu := range []api.Milli{0, -1000, 500, 1500, 1, MaxWorkspaceCPU + 1000} {
		bad[fmt.Sprintf("cpu %s", cpu)] = wsArgs(cpu, gib)
	}
	for _, mem := range []uint64{0, 1, MinWorkspaceMemory - 1<<20, gib + 1} {
		bad[fmt.Sprintf("memory %d", mem)] = wsArgs(1000, mem)
	}
	for _, k := range []string{"", "-a", "a-", "a b", "ä", "a:b", strings.Repeat("k", 64)} {
		a := smallWS
		a.Labels = map[string]string{"ok": "1", k: "v"}
		bad[fmt.Sprintf("label key %q", k)] = a
	}
	long := smallWS
	long.Labels = map[string]string{"k": strings.Repeat("v", 254)}
	bad["label value too long"] = long
	many := smallWS
	many.Labels = map[string]string{}
	for i := 0; i < 65; i++ {
		many.Labels[fmt.Sprintf("k%d", i)] = "v"
	}
	bad["65 labels"] = many
	for name, a := range bad {
		cases = append(cases, opCase{name: "invalid " + name, setup: twoNodes, entry: create(a), code: api.CodeInvalidArgument})
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].name < cases[j].name })
	runCases(t, cases)
}

// Each create is placed with what the ones before it took: equal nodes fill
// alternately, ties going to the smaller node id.
func TestWorkspaceCreateSpreads(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	var got []string
	for i := 0; i < 4; i++ {
		got = append(got, h.create(fmt.Sprintf("c%d", i), wsArgs(2000, gib)).NodeID)
	}
	if want := []string{"node-a", "node-b", "node-a", "node-b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("placed on %v, want %v", got, want)
	}
	h.advance(time.Second)
	h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, wsArgs(1000, gib), withCommand("c9"))
	// Reported allocations lower than ctrl's own records do not free room.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, wsArgs(1000, gib), withCommand("c9"))
	checkIndex(t, h.f)
}

// Two creates racing for the last room in one batch: only the first wins.
func TestWorkspaceCreateRaceInOneBatch(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.advance(time.Second)
	rs := h.apply(h.entry(OpWorkspaceCreate, wsArgs(3000, gib), withCommand("c1")), h.entry(OpWorkspaceCreate, wsArgs(3000, gib), withCommand("c2")))
	if resultCode(rs[0]) != "" || resultCode(rs[1]) != api.CodeResourceExhausted {
		t.Fatalf("results %+v %+v", rs[0].Error, rs[1].Error)
	}
	if err := h.wsErr(WorkspaceIDFor("c2")); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("refused create stored: %v", err)
	}
}

// Label errors do not depend on map order: replicas give the same error.
func TestWorkspaceCreateErrorDeterministic(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	a := smallWS
	a.Labels = map[string]string{}
	for i := 0; i < 20; i++ {
		a.Labels[fmt.Sprintf("-bad%02d", i)] = "v"
	}
	e := h.entry(OpWorkspaceCreate, a, withCommand("c1"))
	first := h.expect(api.CodeInvalidArgument, e).Error.Message
	for i := 0; i < 100; i++ {
		if msg := h.expect(api.CodeInvalidArgument, e).Error.Message; msg != first {
			t.Fatalf("same entry gave different errors:\n%s\n%s", first, msg)
		}
	}
	if !strings.Contains(first, "-bad00") {
		t.Errorf("first reported key should be the smallest: %s", first)
	}
}

func TestWorkspaceCreateIdempotent(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	e := h.entry(OpWorkspaceCreate, smallWS, withCommand("c1"), withActor("alice"))
	first := h.expect("", e)
	w := decode[api.Workspace](t, first)
	// The Workspace moves on; a retry still replays the first result.
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Minute)
	retry := e
	retry.IssuedAt, retry.Actor = h.now, "bob"
	r := h.expectUnchanged(retry)
	if !r.Replayed || string(r.Value) != string(first.Value) {
		t.Errorf("retry %+v, want replay of %s", r, first.Value)
	}
	if got := decode[api.Workspace](t, r).WorkspaceID; got != w.WorkspaceID {
		t.Errorf("retry names %s, first %s", got, w.WorkspaceID)
	}
	// Same id, other inputs.
	other := smallWS
	other.CPU = 2000
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, other, withCommand("c1"))
	labelled := smallWS
	labelled.Labels = map[string]string{"a": "b"}
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, labelled, withCommand("c1"))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, withCommand("c1"))

	// A refused create is not recorded: the same id succeeds once there is room.
	h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, wsArgs(4000, gib), withCommand("big"))
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if r := h.ok(OpWorkspaceCreate, wsArgs(4000, gib), withCommand("big")); r.Replayed {
		t.Error("refused create replayed")
	}
	// Once the record expired, the same id names an existing Workspace.
	h.advance(time.Hour)
	h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now})
	h.fail(api.CodeAlreadyExists, OpWorkspaceCreate, smallWS, withCommand("c1"))
	// ... and even after that Workspace was deleted: an id is never reused.
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if h.answer(w.WorkspaceID, OutcomeOK, "") != nil {
		t.Fatal("deleted Workspace still there")
	}
	h.advance(time.Hour)
	h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now})
	if err := h.fail(api.CodeAlreadyExists, OpWorkspaceCreate, smallWS, withCommand("c1")); !strings.Contains(err.Error(), "was deleted at") {
		t.Errorf("reuse of a deleted Workspace's id: %v", err)
	}
}
