package fsm

import (
	"fmt"
	"reflect"
	"slices"
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

// checkIndex verifies the node index holds exactly what every Workspace occupies.
func checkIndex(t testing.TB, f *FSM) {
	t.Helper()
	if err := f.View(func(tx *bolt.Tx) error { return indexProblem(tx) }); err != nil {
		t.Fatal(err)
	}
}

func indexProblem(tx *bolt.Tx) error {
	want, wantPending := map[string]bool{}, map[string]bool{}
	wantHolds := map[string]Holds{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for _, n := range occupied(w) {
			want[string(wsNodeKey(n, w.WorkspaceID))] = true
		}
		if n := pendingNode(w); n != "" {
			wantPending[string(wsNodeKey(n, w.WorkspaceID))] = true
		}
		for _, n := range nodesOf(w) {
			h, c := wantHolds[n], holdsOf(w, n)
			h.Instances += c.Instances
			h.Layers += c.Layers
			h.Volumes += c.Volumes
			h.Allocated.CPU += c.Allocated.CPU
			h.Allocated.MemoryBytes += c.Allocated.MemoryBytes
			if h == (Holds{}) {
				continue
			}
			wantHolds[n] = h
		}
		return nil
	}); err != nil {
		return err
	}
	got := map[string]bool{}
	tx.Bucket(bucketWorkspaceNodes).ForEach(func(k, _ []byte) error { got[string(k)] = true; return nil })
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("workspace node index %q, want %q", keys(got), keys(want))
	}
	gotPending := map[string]bool{}
	tx.Bucket(bucketWorkspaceCommands).ForEach(func(k, _ []byte) error { gotPending[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotPending, wantPending) {
		return fmt.Errorf("pending command index %q, want %q", keys(gotPending), keys(wantPending))
	}
	// The holds counters equal what the records hold, recounted.
	gotHolds := map[string]Holds{}
	if err := tx.Bucket(bucketNodeHolds).ForEach(func(k, _ []byte) error {
		h, err := nodeHolds(tx, string(k))
		gotHolds[string(k)] = h
		return err
	}); err != nil {
		return err
	}
	if !reflect.DeepEqual(gotHolds, wantHolds) {
		return fmt.Errorf("node holds counters %+v, recounted from the records %+v", gotHolds, wantHolds)
	}
	if err := poolUseProblem(tx); err != nil {
		return err
	}
	if err := volumesProblem(tx); err != nil {
		return err
	}
	if err := forksProblem(tx); err != nil {
		return err
	}
	return refsProblem(tx)
}

// poolUseProblem recounts what the Workspaces' layers take of each pool.
func poolUseProblem(tx *bolt.Tx) error {
	waits := map[string]bool{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err == nil && w.DeleteWaitsForPool != "" {
			waits[string(poolWaitKey(w.DeleteWaitsForPool, w.WorkspaceID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err == nil && v.DeleteWaitsForPool != "" {
			waits[string(poolWaitKey(v.DeleteWaitsForPool, v.VolumeID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	gotWaits := map[string]bool{}
	tx.Bucket(bucketPoolWaits).ForEach(func(k, _ []byte) error { gotWaits[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotWaits, waits) {
		return fmt.Errorf("pool waits index %q, want %q", keys(gotWaits), keys(waits))
	}
	want := map[string]PoolUse{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for pool, c := range workspaceCharges(w) {
			u := want[pool]
			u.Layers += c.Layers
			u.UsedBytes += c.UsedBytes
			want[pool] = u
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err != nil {
			return err
		}
		if pool, c := volumeCharge(v); pool != "" {
			u := want[pool]
			u.Volumes += c.Volumes
			u.UsedBytes += c.UsedBytes
			want[pool] = u
		}
		return nil
	}); err != nil {
		return err
	}
	got := map[string]PoolUse{}
	if err := tx.Bucket(bucketPoolUse).ForEach(func(k, _ []byte) error {
		u, err := poolUse(tx, string(k))
		got[string(k)] = u
		return err
	}); err != nil {
		return err
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("pool use counters %+v, recounted from the records %+v", got, want)
	}
	return nil
}

// volumesProblem checks the Volume indexes (names, pending commands) and
// that every Volume's attachment and use right are its Workspace's.
func volumesProblem(tx *bolt.Tx) error {
	names, cmds := map[string]bool{}, map[string]bool{}
	attachedTo := map[string]string{} // volume id → workspace id
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for _, m := range attachedVolumes(w) {
			if other, ok := attachedTo[m.VolumeID]; ok {
				return fmt.Errorf("volume %s attached to %s and %s", m.VolumeID, other, w.WorkspaceID)
			}
			attachedTo[m.VolumeID] = w.WorkspaceID
			v, err := getVolume(tx, m.VolumeID)
			if err != nil || v == nil {
				return fmt.Errorf("workspace %s lists volume %s without a record (%v)", w.WorkspaceID, m.VolumeID, err)
			}
			held := w.Layer != nil && w.Layer.Held
			if v.WorkspaceID != w.WorkspaceID || v.MountPath != m.Path || v.Held != held || (w.Layer != nil && v.NodeID != w.Layer.NodeID) {
				return fmt.Errorf("volume %s %+v is not in step with its workspace %s (layer %+v)", v.Name, v, w.WorkspaceID, w.Layer)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err != nil {
			return err
		}
		names[v.Name+"="+v.VolumeID] = true
		if v.Pending != nil {
			cmds[string(volCmdKey(v.Pending.NodeID, v.VolumeID))] = true
		}
		if v.WorkspaceID != "" && attachedTo[v.VolumeID] != v.WorkspaceID {
			return fmt.Errorf("volume %s says it is attached to %s, which does not list it", v.Name, v.WorkspaceID)
		}
		if v.WorkspaceID == "" && v.Held {
			return fmt.Errorf("volume %s is held while detached", v.Name)
		}
		return nil
	}); err != nil {
		return err
	}
	gotNames, gotCmds := map[string]bool{}, map[string]bool{}
	tx.Bucket(bucketVolumeNames).ForEach(func(k, v []byte) error { gotNames[string(k)+"="+string(v)] = true; return nil })
	tx.Bucket(bucketVolumeCommands).ForEach(func(k, _ []byte) error { gotCmds[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotNames, names) {
		return fmt.Errorf("volume names index %q, want %q", keys(gotNames), keys(names))
	}
	if !reflect.DeepEqual(gotCmds, cmds) {
		return fmt.Errorf("volume command index %q, want %q", keys(gotCmds), keys(cmds))
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(ids ...string) []string {
	out := append([]string{}, ids...)
	sort.Strings(out)
	return out
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

// ---------------------------------------------------------------------------
// workspace.node_result for a start

func TestWorkspaceStartResult(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.create("c1", smallWS)
	got := h.answer(w.WorkspaceID, OutcomeOK, "")
	if got.State != api.WorkspaceAvailable || got.Pending != nil || got.Failure != nil || got.Version != 2 ||
		got.NodeID != "node-a" || got.InstanceID != w.InstanceID || !got.Layer.Held {
		t.Errorf("after ok: %+v", got)
	}
	checkIndex(t, h.f)
}

// A result that carries the node's report (level 10) leaves the state a
// result entry and then a report entry would: the same Workspace, the
// same node record, report version and time. A report of another node or
// session is refused with the result, and a report the FSM refuses leaves
// the result applied and says why.
func TestWorkspaceResultWithReport(t *testing.T) {
	started := func() (*harness, WorkspaceResultArgs, ReportArgs) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		h.advance(time.Second)
		rep := ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: api.Report{
			Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
			Allocated: api.Resources{CPU: 1000, MemoryBytes: gib}, Instances: 1,
			InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "RUNNING"}},
		}}
		return h, h.resultArgs(w.WorkspaceID, OutcomeOK, ""), rep
	}
	apart, res, rep := started()
	apart.ok(OpWorkspaceResult, res)
	apart.ok(OpNodeReport, rep)

	together, res, rep := started()
	res.Report = &rep
	got := decode[ResultReport](t, together.ok(OpWorkspaceResult, res))
	if got.ReportError != nil || got.Report == nil || got.Report.ReportVersion != apart.node("node-a").Report.ReportVersion {
		t.Fatalf("outcome %+v, report %+v: want the report stored as version %d", got, got.Report, apart.node("node-a").Report.ReportVersion)
	}
	if a, b := apart.dump(), together.dump(); a != b {
		t.Fatalf("a result with its report:\n%s\nthe two as entries of their own:\n%s", b, a)
	}

	for _, other := range []ReportArgs{
		{NodeID: "node-b", SessionID: sessOf("node-b")},
		{NodeID: "node-a", SessionID: "s-old"},
	} {
		h, res, rep := started()
		rep.NodeID, rep.SessionID = other.NodeID, other.SessionID
		res.Report = &rep
		if err := h.fail(api.CodeInvalidArgument, OpWorkspaceResult, res); !strings.Contains(err.Message, "carries a report of node "+other.NodeID+" (session "+other.SessionID+")") {
			t.Fatalf("a result with the report of %+v: %v", other, err)
		}
	}

	h, res, rep := started()
	before := h.node("node-a").Report.ReportVersion
	rep.Report.Pools = append(rep.Report.Pools, rep.Report.Pools...)
	res.Report = &rep
	got = decode[ResultReport](t, h.ok(OpWorkspaceResult, res))
	if got.ReportError == nil || !strings.Contains(got.ReportError.Message, "lists storage pool") || got.Report != nil {
		t.Fatalf("a result with a report listing a pool twice: %+v", got)
	}
	if w := h.ws(res.WorkspaceID); w.State != api.WorkspaceAvailable || h.node("node-a").Report.ReportVersion != before {
		t.Fatalf("after a refused report: workspace %s, report version %d (was %d): want the result applied and the report not", w.State, h.node("node-a").Report.ReportVersion, before)
	}
}

func TestWorkspaceRefused(t *testing.T) {
	t.Run("placed on the other node", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		first := w.InstanceID
		got := h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceCreating || got.NodeID != "node-b" || got.Instances != 2 || got.InstanceID == first ||
			got.InstanceID != instanceIDFor(w.WorkspaceID, 2) || got.Failure != nil {
			t.Errorf("after refusal: %+v", got)
		}
		if *got.Layer != (api.LayerRight{NodeID: "node-b", PoolID: api.PrivatePoolID("node-b"), Held: true}) {
			t.Errorf("layer %+v", got.Layer)
		}
		if p := got.Pending; p == nil || p.Kind != api.WSCmdStart || p.NodeID != "node-b" || !reflect.DeepEqual(p.Refused, []string{"node-a"}) ||
			p.InstanceID != got.InstanceID || p.CommandID != fmt.Sprintf("%s/%d", w.WorkspaceID, got.Version) {
			t.Errorf("pending %+v", p)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("node-a still holds %+v", hd)
		}
		// A late answer of node-a to its old command changes nothing.
		old := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeOK}
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, old)); decode[map[string]bool](t, r)["applied"] {
			t.Error("old answer applied")
		}
		// The right command id from the wrong node.
		wrong := h.resultArgs(w.WorkspaceID, OutcomeOK, "")
		wrong.NodeID, wrong.SessionID = "node-a", sessOf("node-a")
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, wrong)); decode[map[string]bool](t, r)["applied"] {
			t.Error("answer of the wrong node applied")
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceAvailable || got.NodeID != "node-b" {
			t.Errorf("after ok: %+v", got)
		}
		checkIndex(t, h.f)
	})
	t.Run("refused by two nodes, placed on the third", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		h.schedNode("node-c", 1, 2000, 4*gib) // least free room: last choice
		w := h.create("c1", smallWS)
		h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		got := h.answer(w.WorkspaceID, OutcomeRefused, "memory tight")
		if got.State != api.WorkspaceCreating || got.NodeID != "node-c" || got.Instances != 3 ||
			!reflect.DeepEqual(got.Pending.Refused, []string{"node-a", "node-b"}) ||
			*got.Layer != (api.LayerRight{NodeID: "node-c", PoolID: api.PrivatePoolID("node-c"), Held: true}) {
			t.Errorf("after two refusals: %+v pending %+v layer %+v", got, got.Pending, got.Layer)
		}
		got = h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart || got.Layer != nil || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
			t.Errorf("refused everywhere: %+v", got)
		}
		checkIndex(t, h.f)
	})
	t.Run("no other node", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		got := h.answer(w.WorkspaceID, OutcomeRefused, "drained")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart ||
			!strings.Contains(got.Failure.Message, "node-a refused it (drained)") || !got.Failure.At.Equal(h.now) {
			t.Errorf("after refusal: %+v failure %+v", got, got.Failure)
		}
		if got.Layer != nil || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
			t.Errorf("refused create keeps %+v", got)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("holds %+v", hd)
		}
		// Started again it is placed anew, on any node.
		h.advance(time.Second)
		got2 := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
		if got2.State != api.WorkspaceStarting || got2.NodeID != "node-a" || got2.Failure != nil || got2.Instances != 2 {
			t.Errorf("start after refusal: %+v", got2)
		}
		checkIndex(t, h.f)
	})
	t.Run("start of a stopped Workspace refused: its layer pins it", func(t *testing.T) {
		h := newHarness(t)
		got := h.answer(startStoppedOnTwoNodes(h), OutcomeRefused, "memory tight")
		if got.State != api.WorkspaceFailed || got.Failure.Reason != api.FailureStart ||
			*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) || got.NodeID != "" || got.Pending != nil {
			t.Errorf("after refusal: %+v layer %+v", got, got.Layer)
		}
		checkIndex(t, h.f)
	})
}

// startStoppedOnTwoNodes starts a stopped Workspace on two nodes, its
// layer in node-a's private pool; it returns the Workspace.
func startStoppedOnTwoNodes(h *harness) string {
	twoNodes(h)
	w := h.stopped("c1", smallWS)
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	return w.WorkspaceID
}

// refuse answers the pending start with the node's refusal; exhausts is
// WorkspaceResultArgs.RefusalExhausts, which a leader sets from
// LevelRefusalExhausted on.
func (h *harness) refuse(id, why string, exhausts bool) *api.Workspace {
	h.t.Helper()
	h.advance(time.Second)
	a := h.resultArgs(id, OutcomeRefused, why)
	a.RefusalExhausts = exhausts
	if r := h.ok(OpWorkspaceResult, a); !decode[map[string]bool](h.t, r)["applied"] {
		h.t.Fatalf("refusal of %s not applied", id)
	}
	return h.ws(id)
}

// A node that refuses a start (memory tight, draining by its own, fresher
// account) has ctrl place the Workspace on another node; where none can
// take it, the Workspace has no room anywhere: FAILED with reason
// RESOURCE_EXHAUSTED, which the CLI ends with resource_exhausted (exit
// 15) like a create ctrl could place nowhere, not START_FAILED (13).
// Entries without RefusalExhausts (written below the level) apply as
// before.
func TestWorkspaceRefusalExhausts(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup returns the Workspace whose start is pending.
		setup    func(h *harness) string
		refusals []string // the successive nodes' reasons
		exhausts bool
		// wantNode: placed there (CREATING/STARTING); "" with wantReason:
		// FAILED for that reason.
		wantNode, wantReason string
		wantMsg              []string
	}{
		{name: "create, no other node", setup: func(h *harness) string {
			oneNode(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg: []string{"node node-a refused to start it (host memory is tight) and no other node can take it: no admitted node is ready with room",
				"1 refused this placement", "kibo workspace start " + WorkspaceIDFor("c1") + " places it again"}},
		{name: "create, the other node drained", setup: func(h *harness) string {
			twoNodes(h)
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-b"})
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"node node-a is draining"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg:    []string{"node node-a refused to start it (node node-a is draining)", "1 drained", "1 refused this placement"}},
		{name: "create, another node fits", setup: func(h *harness) string {
			twoNodes(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true, wantNode: "node-b"},
		{name: "create, refused by both nodes", setup: func(h *harness) string {
			twoNodes(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"node node-a is draining", "host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg:    []string{"nodes node-a, node-b refused to start it (node-b: host memory is tight) and no other node can take it", "2 refused this placement"}},
		{name: "start of a stopped Workspace, its layer in the refusing node's pool", setup: startStoppedOnTwoNodes, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted,
			wantMsg: []string{"node node-a refused to start it (host memory is tight)",
				"standalone pool " + api.PrivatePoolID("node-a") + " of node node-a, the only node that can start it, which refused it"}},
		{name: "a fork only its source's node can restore", setup: func(h *harness) string {
			oneNode(h)
			h.resumer("node-a", canResume)
			h.poolCapacity("nfs", 100*gib)
			src := h.pausedWS("c1", smallWS)
			return h.create("f1", fork(src.WorkspaceID)).WorkspaceID
		}, refusals: []string{"host memory is tight"}, exhausts: true,
			wantReason: api.FailureResourceExhausted, wantMsg: []string{"node node-a refused to start it (host memory is tight)"}},
		{name: "an entry from below the level: START_FAILED", setup: func(h *harness) string {
			oneNode(h)
			return h.create("c1", smallWS).WorkspaceID
		}, refusals: []string{"host memory is tight"},
			wantReason: api.FailureStart, wantMsg: []string{"node node-a refused it (host memory is tight) and no other node can take it"}},
		{name: "a stopped one from below the level: START_FAILED", setup: startStoppedOnTwoNodes, refusals: []string{"host memory is tight"},
			wantReason: api.FailureStart, wantMsg: []string{"which cannot now: refused this placement"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			id := tc.setup(h)
			var got *api.Workspace
			for _, why := range tc.refusals {
				got = h.refuse(id, why, tc.exhausts)
			}
			if tc.wantNode != "" {
				if got.NodeID != tc.wantNode || got.Failure != nil || got.Pending == nil || got.Pending.NodeID != tc.wantNode ||
					got.State != api.WorkspaceCreating {
					t.Fatalf("after the refusal: %+v pending %+v, want CREATING on %s", got, got.Pending, tc.wantNode)
				}
				checkIndex(t, h.f)
				return
			}
			if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != tc.wantReason || !got.Failure.At.Equal(h.now) {
				t.Fatalf("refused everywhere: %+v failure %+v, want FAILED %s", got, got.Failure, tc.wantReason)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(got.Failure.Message, m) {
					t.Errorf("failure message %q lacks %q", got.Failure.Message, m)
				}
			}
			if strings.ContainsAny(got.Failure.Message, "\r\n") {
				t.Errorf("failure message is not one line: %q", got.Failure.Message)
			}
			if got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || got.Layer != nil && got.Layer.Held {
				t.Errorf("refused everywhere, it keeps %+v layer %+v", got, got.Layer)
			}
			for _, n := range []string{"node-a", "node-b"} {
				if hd := h.holds(n); hd.Instances != 0 || hd.Layers != 0 || hd.Allocated != (api.Resources{}) {
					t.Errorf("%s still holds %+v", n, hd)
				}
			}
			checkIndex(t, h.f)
		})
	}
}

func TestWorkspaceStartFailed(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.create("c1", smallWS)
	got := h.answer(w.WorkspaceID, OutcomeFailed, "kernel panic")
	if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureStart || got.Failure.Message != "kernel panic" ||
		got.NodeID != "" || got.InstanceID != "" || got.Pending != nil {
		t.Errorf("after failed start: %+v", got)
	}
	if *got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
		t.Errorf("layer %+v, want kept and not held", got.Layer)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("holds %+v", hd)
	}
	// The layer pins the next start to node-a.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 3000}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID, NodeID: "node-b"})
	got = ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
	if got.State != api.WorkspaceStarting || got.NodeID != "node-a" || got.Failure != nil || got.InstanceID != instanceIDFor(w.WorkspaceID, 2) {
		t.Errorf("start after failure: %+v", got)
	}
	checkIndex(t, h.f)
}

func ptr[T any](v T) *T { return &v }

// Answers that are not the one ctrl waits for change nothing.
func TestWorkspaceResultIgnored(t *testing.T) {
	setup := func(h *harness) string {
		twoNodes(h)
		return h.create("c1", smallWS).WorkspaceID
	}
	notApplied := func(t *testing.T, h *harness, r Result) {
		if decode[map[string]bool](t, r)["applied"] {
			t.Errorf("applied: %s", r.Value)
		}
	}
	var id string
	args := func(mod func(a *WorkspaceResultArgs)) func(h *harness) Entry {
		return func(h *harness) Entry {
			a := h.resultArgs(id, OutcomeOK, "")
			mod(&a)
			return h.entry(OpWorkspaceResult, a)
		}
	}
	runCases(t, []opCase{
		{name: "old command id", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.CommandID = id + "/0" }), unchanged: true, check: notApplied},
		{name: "other workspace", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.WorkspaceID = "ws-nope" }), unchanged: true, check: notApplied},
		{name: "answered already", setup: func(h *harness) { id = setup(h); h.answer(id, OutcomeOK, "") },
			entry: func(h *harness) Entry {
				return h.entry(OpWorkspaceResult, WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: id, CommandID: id + "/1", Outcome: OutcomeFailed})
			}, unchanged: true, check: notApplied},
		// A node-originated write through a session that is not the live
		// one is refused like a report (and changes nothing).
		{name: "stale session", setup: func(h *harness) { id = setup(h); h.open("node-a", "s-new", 2) },
			entry: args(func(a *WorkspaceResultArgs) {}), code: api.CodeFailedPrecondition},
		{name: "closed session", setup: func(h *harness) { id = setup(h); h.closeSession("node-a", sessOf("node-a")) },
			entry: args(func(a *WorkspaceResultArgs) {}), code: api.CodeFailedPrecondition},
		{name: "unknown node", setup: func(h *harness) { id = setup(h) },
			entry: args(func(a *WorkspaceResultArgs) { a.NodeID = "node-x" }), code: api.CodeNotFound},
		{name: "live session after a reconnect", setup: func(h *harness) { id = setup(h); h.open("node-a", "s-new", 2) },
			entry: args(func(a *WorkspaceResultArgs) { a.SessionID = "s-new" }), check: func(t *testing.T, h *harness, r Result) {
				if !decode[map[string]bool](t, r)["applied"] || h.ws(id).State != api.WorkspaceAvailable {
					t.Errorf("answer through the new session: %s %+v", r.Value, h.ws(id))
				}
			}},
	})
}

// ---------------------------------------------------------------------------
// workspace.stop and workspace.start

func TestWorkspaceStopStart(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.running("c1", smallWS)
	id := w.WorkspaceID
	h.advance(time.Second)
	h.fail(api.CodeVersionMismatch, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version-1))
	h.fail(api.CodeVersionMismatch, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version+1))
	got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version))))
	if got.State != api.WorkspaceStopping || got.Pending == nil || got.Pending.Kind != api.WSCmdStop || got.Pending.NodeID != "node-a" ||
		got.Pending.InstanceID != w.InstanceID || got.NodeID != "node-a" || got.Version != w.Version+1 {
		t.Errorf("stopping: %+v pending %+v", got, got.Pending)
	}
	// Stop again while STOPPING: nothing to do.
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
	got = h.answer(id, OutcomeOK, "")
	if got.State != api.WorkspaceStopped || got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || got.StopUnconfirmed ||
		*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
		t.Errorf("stopped: %+v layer %+v", got, got.Layer)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("holds after stop %+v", hd)
	}
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}))
	h.expectUnchanged(h.entry(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true}))

	// node-b has more room now, but the layer is on node-a.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 2000}, Pools: defaultPoolAvailable, Templates: testTemplates})
	h.advance(time.Second)
	h.fail(api.CodeVersionMismatch, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}, withVersion(got.Version-1))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-b"})
	h.fail(api.CodeNotFound, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: "ws-nope"})
	started := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}, withVersion(got.Version))))
	if started.State != api.WorkspaceStarting || started.NodeID != "node-a" || started.InstanceID == w.InstanceID ||
		started.InstanceID != instanceIDFor(id, 2) || started.Instances != 2 || !started.Layer.Held || started.Layer.NodeID != "node-a" ||
		started.Pending.Kind != api.WSCmdStart {
		t.Errorf("started: %+v", started)
	}
	got = h.answer(id, OutcomeOK, "")
	if got.State != api.WorkspaceAvailable || got.InstanceID != started.InstanceID {
		t.Errorf("available again: %+v", got)
	}
	// Start of an AVAILABLE Workspace where it runs: nothing to do.
	h.expectUnchanged(h.entry(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}))
	h.expectUnchanged(h.entry(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-a"}))
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id, NodeID: "node-b"})
	checkIndex(t, h.f)
}

func TestWorkspaceStopForce(t *testing.T) {
	t.Run("available", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		id := h.running("c1", smallWS).WorkspaceID
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})))
		if got.State != api.WorkspaceStopping || got.Pending.Kind != api.WSCmdStopForce {
			t.Errorf("stopping: %+v", got)
		}
		got = h.answer(id, OutcomeOK, "")
		if got.State != api.WorkspaceStopped || !got.StopUnconfirmed || got.InstanceID != "" || got.Layer.Held {
			t.Errorf("force-stopped: %+v", got)
		}
		h.advance(time.Second)
		h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
		if got := h.ws(id); got.StopUnconfirmed {
			t.Error("start kept stop_unconfirmed")
		}
	})
	t.Run("stop --force overtakes a normal stop", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		id := h.running("c1", smallWS).WorkspaceID
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
		normal := h.resultArgs(id, OutcomeOK, "")
		h.advance(time.Second)
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, normal)); decode[map[string]bool](t, r)["applied"] {
			t.Error("answer to the superseded stop applied")
		}
		if got := h.answer(id, OutcomeOK, ""); got.State != api.WorkspaceStopped || !got.StopUnconfirmed {
			t.Errorf("%+v", got)
		}
	})
	t.Run("creating", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.create("c1", smallWS)
		h.advance(time.Second)
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID, Force: true})
		// The node's late answer to the start is ignored.
		late := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeOK}
		h.advance(time.Second)
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, late)); decode[map[string]bool](t, r)["applied"] {
			t.Error("late start answer applied")
		}
		if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.State != api.WorkspaceStopped || !got.StopUnconfirmed {
			t.Errorf("%+v", got)
		}
	})
}

// A FAILED Workspace whose Instance still holds resources: only stop --force
// ends it, and start says so.
func TestWorkspaceFailedWithInstance(t *testing.T) {
	for _, how := range []string{"stop failed", "no longer running"} {
		t.Run(how, func(t *testing.T) {
			h := newHarness(t)
			twoNodes(h)
			w := h.running("c1", smallWS)
			id := w.WorkspaceID
			var got *api.Workspace
			if how == "stop failed" {
				h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
				got = h.answer(id, OutcomeFailed, "guest did not shut down")
				if got.Failure == nil || got.Failure.Reason != api.FailureStop {
					t.Fatalf("%+v", got)
				}
			} else {
				h.advance(time.Second)
				h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
					InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: "killed by the OOM killer"}}})
				got = h.ws(id)
				if got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning || got.Failure.Message != "killed by the OOM killer" {
					t.Fatalf("%+v", got)
				}
			}
			if got.State != api.WorkspaceFailed || got.InstanceID != w.InstanceID || got.NodeID != "node-a" || !got.Layer.Held || got.Pending != nil {
				t.Errorf("failed: %+v", got)
			}
			if hd := h.holds("node-a"); hd.Instances != 1 || hd.Layers != 1 {
				t.Errorf("holds %+v", hd)
			}
			h.advance(time.Second)
			if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}); !strings.Contains(err.Message, "stop --force "+id) {
				t.Errorf("start error does not tell to stop --force: %s", err.Message)
			}
			if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id}); !strings.Contains(err.Message, "stop --force") {
				t.Errorf("stop error does not tell to use --force: %s", err.Message)
			}
			h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
			got = h.answer(id, OutcomeOK, "")
			if got.State != api.WorkspaceStopped || got.Failure != nil || !got.StopUnconfirmed || got.InstanceID != "" {
				t.Errorf("after stop --force: %+v", got)
			}
			checkIndex(t, h.f)
		})
	}
}

// stop --force of a FAILED Workspace whose node no longer has the Instance
// (not taken over after a restart): ctrl releases what it held, the
// Workspace stays FAILED with its error and starts directly.
func TestWorkspaceStopForceInstanceGone(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	w := h.running("c1", smallWS)
	id := w.WorkspaceID
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
	h.answer(id, OutcomeFailed, "prepare guest stop: deadline_exceeded: the guest agent did not answer")
	h.advance(time.Second)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
	h.advance(time.Second)
	res := h.resultArgs(id, OutcomeOK, "")
	res.NotOnNode = true
	h.ok(OpWorkspaceResult, res)
	got := h.ws(id)
	if got.State != api.WorkspaceFailed || got.Failure == nil || !strings.HasPrefix(got.Failure.Message, "prepare guest stop:") ||
		got.InstanceID != "" || got.NodeID != "" || got.Layer.Held || !got.StopUnconfirmed || got.Pending != nil {
		t.Fatalf("after stop --force with the Instance gone from its node: %+v", got)
	}
	if hd := h.holds("node-a"); hd.Instances != 0 || hd.Layers != 0 {
		t.Errorf("holds after the release: %+v", hd)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
	if got := h.ws(id); got.State != api.WorkspaceStarting {
		t.Errorf("start of the released FAILED Workspace: %+v", got)
	}
	checkIndex(t, h.f)
}

// A VMM that host OOM killed: with OOMStops (every voter at
// LevelTroubleshooting) ctrl stops the Workspace itself (STOPPING with a
// stop --force for the node, then STOPPED and startable); an entry
// without it fails the Workspace as before the level, and so does any
// other unexpected exit.
func TestWorkspaceOOMKilledStops(t *testing.T) {
	for _, c := range []struct {
		name            string
		oomKilled, rule bool
	}{{"oom with the rule", true, true}, {"oom below the level", true, false}, {"other exit", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			twoNodes(h)
			w := h.running("c1", smallWS)
			h.advance(time.Second)
			h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), OOMStops: c.rule,
				Report: api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
					InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: "node reports the Instance as no longer running: host OOM killed the VMM", OOMKilled: c.oomKilled}}}})
			got := h.ws(w.WorkspaceID)
			if !(c.oomKilled && c.rule) {
				if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning {
					t.Fatalf("%+v; want FAILED no longer running", got)
				}
				return
			}
			if got.State != api.WorkspaceStopping || got.Pending == nil || got.Pending.Kind != api.WSCmdStopForce || got.Pending.InstanceID != w.InstanceID ||
				got.Failure != nil || got.LastError == nil || !strings.Contains(got.LastError.Message, "host OOM killed the VMM") {
				t.Fatalf("after the OOM kill: %+v; want STOPPING by ctrl's own stop --force, the reason as last error", got)
			}
			got = h.answer(w.WorkspaceID, OutcomeOK, "")
			if got.State != api.WorkspaceStopped || got.InstanceID != "" || got.Layer.Held || !got.StopUnconfirmed || got.LastError == nil {
				t.Fatalf("after the node ended the Instance: %+v; want STOPPED, the reason kept", got)
			}
			h.advance(time.Second)
			h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
			checkIndex(t, h.f)
		})
	}
}

func TestWorkspaceInstanceFailedReport(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	a := h.running("c1", smallWS)               // node-a
	b := h.running("c2", smallWS)               // node-b
	c := h.create("c3", smallWS)                // node-a, CREATING
	d := h.running("c4", wsArgs(1000, 128<<20)) // node-b
	if a.NodeID != "node-a" || b.NodeID != "node-b" || c.NodeID != "node-a" || d.NodeID != "node-b" {
		t.Fatalf("fixture placement %s %s %s %s", a.NodeID, b.NodeID, c.NodeID, d.NodeID)
	}
	h.advance(time.Second)
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
		InstanceStates: []api.InstanceState{
			{InstanceID: a.InstanceID, State: "FAILED"},
			{InstanceID: b.InstanceID, State: "FAILED"}, // not node-a's: ignored
			{InstanceID: c.InstanceID, State: "FAILED"}, // not AVAILABLE: the start's answer decides
			{InstanceID: d.InstanceID, State: "RUNNING"},
			{InstanceID: "inst-unknown", State: "FAILED"},
		}})
	got := h.ws(a.WorkspaceID)
	if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureNoLongerRunning ||
		got.Failure.Message == "" || !got.Failure.At.Equal(h.now) || got.Version != a.Version+1 {
		t.Errorf("a: %+v", got)
	}
	for _, w := range []api.Workspace{b, c, d} {
		if got := h.ws(w.WorkspaceID); !reflect.DeepEqual(*got, w) {
			t.Errorf("%s changed: %+v", w.WorkspaceID, got)
		}
	}
	// An old Instance reported FAILED after a new start is ignored.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: b.WorkspaceID})
	h.answer(b.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: b.WorkspaceID})
	nb := h.answer(b.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	h.report("node-b", sessOf("node-b"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
		InstanceStates: []api.InstanceState{{InstanceID: b.InstanceID, State: "FAILED"}}})
	if got := h.ws(b.WorkspaceID); got.State != api.WorkspaceAvailable || got.Version != nb.Version {
		t.Errorf("old instance failed the new one: %+v", got)
	}
	checkIndex(t, h.f)
}

// ---------------------------------------------------------------------------
// workspace.delete

func TestWorkspaceDelete(t *testing.T) {
	t.Run("available", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.running("c1", smallWS)
		id := w.WorkspaceID
		h.advance(time.Second)
		h.fail(api.CodeVersionMismatch, OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version+1))
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}, withVersion(w.Version))))
		if got.State != api.WorkspaceDeleting || got.Pending == nil || got.Pending.Kind != api.WSCmdDelete || got.Pending.NodeID != "node-a" || got.Pending.InstanceID != w.InstanceID {
			t.Errorf("deleting: %+v", got)
		}
		h.expectUnchanged(h.entry(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id}))
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id})
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id})
		if got := h.answer(id, OutcomeOK, ""); got != nil {
			t.Errorf("still stored: %+v", got)
		}
		if err := h.wsErr(id); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		if hd := h.holds("node-a"); hd != (Holds{}) {
			t.Errorf("holds %+v", hd)
		}
		h.fail(api.CodeNotFound, OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id})
		checkIndex(t, h.f)
	})
	t.Run("stopped: the layer's node deletes it", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.stopped("c1", smallWS)
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
		if got.State != api.WorkspaceDeleting || got.Pending == nil || got.Pending.NodeID != "node-a" || got.Pending.InstanceID != "" || got.NodeID != "" {
			t.Errorf("deleting: %+v pending %+v", got, got.Pending)
		}
		if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{w.WorkspaceID}) {
			t.Errorf("pending on node-a %v", p)
		}
		checkIndex(t, h.f)
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		if p := h.pendingOn("node-a"); len(p) != 0 {
			t.Errorf("pending on node-a %v", p)
		}
		checkIndex(t, h.f)
	})
	t.Run("a label named pending is no pending command", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		args := smallWS
		args.Labels = map[string]string{"pending": `"pending":{"node_id":"node-a"}`}
		w := h.stopped("c1", args)
		if p := h.pendingOn("node-a"); len(p) != 0 {
			t.Errorf("pending on node-a %v; the Workspace is stopped, no command waits", p)
		}
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{w.WorkspaceID}) {
			t.Errorf("pending on node-a %v after the delete", p)
		}
	})
	t.Run("never placed: gone at once", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		h.answer(w.WorkspaceID, OutcomeRefused, "drained") // FAILED, no layer
		h.advance(time.Second)
		got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})))
		if got.DeletedAt == nil || !got.DeletedAt.Equal(h.now) {
			t.Errorf("result %+v", got)
		}
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		checkIndex(t, h.f)
	})
	t.Run("delete failed", func(t *testing.T) {
		h := newHarness(t)
		twoNodes(h)
		w := h.running("c1", smallWS)
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		got := h.answer(w.WorkspaceID, OutcomeFailed, "device busy")
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Pending != nil {
			t.Errorf("%+v", got)
		}
		// Deleting again sends the delete again.
		h.advance(time.Second)
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("get after delete: %v", err)
		}
		checkIndex(t, h.f)
	})
}

// Expected versions of start, stop and delete: a mismatch changes nothing.
func TestWorkspaceVersionMismatch(t *testing.T) {
	var w api.Workspace
	avail := func(h *harness) { twoNodes(h); w = h.running("c1", smallWS) }   // version 2
	stopped := func(h *harness) { twoNodes(h); w = h.stopped("c1", smallWS) } // version 4
	var cases []opCase
	for _, c := range []struct {
		op    string
		setup func(h *harness)
		v     uint64
	}{{OpWorkspaceStart, stopped, 4}, {OpWorkspaceStop, avail, 2}, {OpWorkspaceDelete, avail, 2}, {OpWorkspaceDelete, stopped, 4}} {
		for _, bad := range []uint64{0, c.v - 1, c.v + 1} {
			cases = append(cases, opCase{name: fmt.Sprintf("%s at %d expecting %d", c.op, c.v, bad), setup: c.setup,
				entry: func(h *harness) Entry {
					return h.entry(c.op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, withVersion(bad))
				}, code: api.CodeVersionMismatch})
		}
		cases = append(cases, opCase{name: fmt.Sprintf("%s at %d expecting it", c.op, c.v), setup: c.setup,
			entry: func(h *harness) Entry {
				return h.entry(c.op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}, withVersion(c.v))
			}, check: func(t *testing.T, h *harness, r Result) {
				if got := decode[api.Workspace](t, r); got.Version != c.v+1 {
					t.Errorf("version %d, want %d", got.Version, c.v+1)
				}
			}})
	}
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// node.drain with Workspaces

func TestWorkspaceDrain(t *testing.T) {
	status := func(h *harness) string { h.t.Helper(); return h.node("node-a").Status }
	t.Run("stop", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.running("c1", smallWS)
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		// The node reports nothing yet: ctrl's own records keep it DRAINING.
		if s := status(h); s != api.NodeDraining {
			t.Fatalf("with a running Workspace: %s", s)
		}
		h.fail(api.CodeFailedPrecondition, OpNodeRetire, NodeArgs{NodeID: "node-a"})
		h.advance(time.Second)
		h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, smallWS, withCommand("c2"))
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("stopping: %s", s)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if s := status(h); s != api.NodeDrained {
			t.Errorf("stopped: %s", s)
		}
		// Its layer is still there, but no use right is held: start waits
		// for cancel-drain.
		h.advance(time.Second)
		h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpNodeCancelDrain, NodeArgs{NodeID: "node-a"})
		h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("starting: %s", s)
		}
	})
	t.Run("delete", func(t *testing.T) {
		h := newHarness(t)
		oneNode(h)
		w := h.create("c1", smallWS)
		h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		if s := status(h); s != api.NodeDraining {
			t.Fatalf("with a CREATING Workspace: %s", s)
		}
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		if s := status(h); s != api.NodeDraining {
			t.Errorf("deleting: %s", s)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if s := status(h); s != api.NodeDrained {
			t.Errorf("deleted: %s", s)
		}
		// ListNodes derives the same.
		var l *api.NodeList
		h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListNodes(tx, 0, ""); return })
		for _, n := range l.Nodes {
			if n.NodeID == "node-a" && n.Status != api.NodeDrained {
				t.Errorf("listed %s", n.Status)
			}
		}
		h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"})
	})
}

// ---------------------------------------------------------------------------
// node.isolate with Workspaces

func TestWorkspaceIsolate(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	pinA := smallWS
	pinA.NodeID = "node-a"
	avail := h.running("c1", pinA)   // AVAILABLE on node-a
	creating := h.create("c2", pinA) // CREATING on node-a
	stopped := h.stopped("c3", pinA) // STOPPED, layer on node-a
	delStopped := h.stopped("c4", pinA)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: delStopped.WorkspaceID}) // DELETING, pending on node-a
	delRunning := h.running("c5", pinA)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: delRunning.WorkspaceID}) // DELETING, running on node-a
	stopping := h.running("c6", pinA)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopping.WorkspaceID}) // STOPPING on node-a
	pinB := smallWS
	pinB.NodeID = "node-b"
	other := h.running("c7", pinB)
	otherBefore := *h.ws(other.WorkspaceID)
	stoppedBefore := *h.ws(stopped.WorkspaceID)

	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	h.closeSession("node-a", sessOf("node-a"))
	h.advance(time.Second)
	r := h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	res := decode[api.IsolateResult](t, r)
	// Layers held: avail, creating, delRunning, stopping. Failed: avail,
	// creating, stopping. Commands: creating, delStopped, delRunning, stopping.
	if want := (api.IsolateResult{NodeID: "node-a", RetainedLayersReleased: 4, WorkspacesFailed: 3, CommandsFailed: 4}); res != want {
		t.Errorf("result %+v, want %+v", res, want)
	}
	for _, w := range []api.Workspace{avail, creating, stopping} {
		got := h.ws(w.WorkspaceID)
		if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Reason != api.FailureUnavailable || !got.Failure.At.Equal(h.now) ||
			got.NodeID != "" || got.InstanceID != "" || got.Pending != nil || !got.StopUnconfirmed ||
			*got.Layer != (api.LayerRight{NodeID: "node-a", PoolID: api.PrivatePoolID("node-a")}) {
			t.Errorf("%s after isolate: %+v layer %+v", w.WorkspaceID, got, got.Layer)
		}
	}
	// Their files are in node-a's private pool: the deletes wait for a
	// member of it (no record dropped, no file left behind).
	for _, w := range []api.Workspace{delStopped, delRunning} {
		if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceDeleting || got.Pending != nil || got.NodeID != "" || got.DeleteWaitsForPool != "node-a:default" {
			t.Errorf("DELETING %s after isolate: %+v", w.WorkspaceID, got)
		}
	}
	if got := h.ws(other.WorkspaceID); !reflect.DeepEqual(*got, otherBefore) {
		t.Errorf("node-b's Workspace changed: %+v", got)
	}
	if got := h.ws(stopped.WorkspaceID); !reflect.DeepEqual(*got, stoppedBefore) {
		t.Errorf("stopped Workspace changed: %+v", got)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("node-a holds %+v", hd)
	}
	if p := h.pendingOn("node-a"); len(p) != 0 {
		t.Errorf("pending on node-a %v", p)
	}
	if ids := h.listIDs(WorkspaceFilter{NodeID: "node-a"}); len(ids) != 0 {
		t.Errorf("listed on node-a %v", ids)
	}
	checkIndex(t, h.f)

	// The layer is in node-a's private pool: start waits for node-a.
	h.advance(time.Second)
	h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: avail.WorkspaceID})
	// A FAILED Workspace without an Instance stops at once.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: stopping.WorkspaceID})
	if got := h.ws(stopping.WorkspaceID); got.State != api.WorkspaceStopped || got.Failure != nil || got.Pending != nil {
		t.Errorf("stop after isolate: %+v", got)
	}
	// node-a comes back with a new incarnation: its first report hands it
	// the waiting deletes.
	h.schedNode("node-a", 2, 4000, 8*gib)
	for _, w := range []api.Workspace{delStopped, delRunning} {
		if got := h.ws(w.WorkspaceID); got.Pending == nil || got.Pending.Kind != api.WSCmdDelete || got.Pending.NodeID != "node-a" || got.DeleteWaitsForPool != "" {
			t.Errorf("DELETING %s after node-a came back: %+v pending %+v", w.WorkspaceID, got, got.Pending)
		}
		h.answer(w.WorkspaceID, OutcomeOK, "")
		if err := h.wsErr(w.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("%s after node-a removed its files: %v", w.WorkspaceID, err)
		}
	}
	h.advance(time.Second)
	got := ptr(decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: avail.WorkspaceID})))
	if got.State != api.WorkspaceStarting || got.NodeID != "node-a" || got.StopUnconfirmed || got.Failure != nil || got.InstanceID == avail.InstanceID {
		t.Errorf("start after return: %+v", got)
	}
	checkIndex(t, h.f)
}

// ---------------------------------------------------------------------------
// Queries

func TestListWorkspaces(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	lbl := func(a WorkspaceCreateArgs, node string, labels map[string]string) WorkspaceCreateArgs {
		a.NodeID, a.Labels = node, labels
		return a
	}
	prodX := map[string]string{"team": "x", "env": "prod"}
	avail := h.running("c1", lbl(smallWS, "node-a", prodX))
	creating := h.create("c2", lbl(smallWS, "node-b", map[string]string{"team": "x"}))
	stopped := h.stopped("c3", lbl(smallWS, "node-a", prodX))
	failed := h.create("c4", lbl(smallWS, "node-b", map[string]string{"team": "y", "env": "prod"}))
	failed = *h.answer(failed.WorkspaceID, OutcomeFailed, "boom")
	restarted := h.stopped("c5", lbl(smallWS, "node-a", nil))
	oldInstance := restarted.InstanceID
	if oldInstance == "" {
		oldInstance = instanceIDFor(restarted.WorkspaceID, 1)
	}
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: restarted.WorkspaceID})
	restarted = *h.answer(restarted.WorkspaceID, OutcomeOK, "")

	cases := []struct {
		name string
		f    WorkspaceFilter
		want []string
	}{
		{"default hides STOPPED", WorkspaceFilter{}, sorted(avail.WorkspaceID, creating.WorkspaceID, failed.WorkspaceID, restarted.WorkspaceID)},
		{"all", WorkspaceFilter{All: true}, sorted(avail.WorkspaceID, creating.WorkspaceID, stopped.WorkspaceID, failed.WorkspaceID, restarted.WorkspaceID)},
		{"state STOPPED", WorkspaceFilter{States: []string{api.WorkspaceStopped}}, sorted(stopped.WorkspaceID)},
		{"states AVAILABLE,CREATING", WorkspaceFilter{States: []string{api.WorkspaceAvailable, api.WorkspaceCreating}}, sorted(avail.WorkspaceID, creating.WorkspaceID, restarted.WorkspaceID)},
		{"state nobody is in", WorkspaceFilter{States: []string{api.WorkspaceDeleting}}, []string{}},
		{"label team=x", WorkspaceFilter{Labels: map[string]string{"team": "x"}}, sorted(avail.WorkspaceID, creating.WorkspaceID)},
		{"label team=x all", WorkspaceFilter{Labels: map[string]string{"team": "x"}, All: true}, sorted(avail.WorkspaceID, creating.WorkspaceID, stopped.WorkspaceID)},
		{"labels must all match", WorkspaceFilter{Labels: map[string]string{"team": "x", "env": "prod"}}, sorted(avail.WorkspaceID)},
		{"label env=prod", WorkspaceFilter{Labels: map[string]string{"env": "prod"}}, sorted(avail.WorkspaceID, failed.WorkspaceID)},
		{"label and state", WorkspaceFilter{Labels: map[string]string{"env": "prod"}, States: []string{api.WorkspaceFailed}}, sorted(failed.WorkspaceID)},
		{"label value differs", WorkspaceFilter{Labels: map[string]string{"team": "z"}}, []string{}},
		{"node-a: current executions only", WorkspaceFilter{NodeID: "node-a"}, sorted(avail.WorkspaceID, restarted.WorkspaceID)},
		{"node-b", WorkspaceFilter{NodeID: "node-b"}, sorted(creating.WorkspaceID)},
		{"node without Workspaces", WorkspaceFilter{NodeID: ctrlID}, []string{}},
		{"current instance", WorkspaceFilter{InstanceID: restarted.InstanceID}, []string{restarted.WorkspaceID}},
		{"instance of a CREATING Workspace", WorkspaceFilter{InstanceID: creating.InstanceID}, []string{creating.WorkspaceID}},
		{"old instance", WorkspaceFilter{InstanceID: oldInstance}, []string{}},
		{"unknown instance", WorkspaceFilter{InstanceID: "inst-nope"}, []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := h.listIDs(c.f); !reflect.DeepEqual(got, c.want) {
				t.Errorf("listed %v, want %v", got, c.want)
			}
		})
	}
	if restarted.InstanceID == oldInstance {
		t.Fatal("fixture: restart kept the instance id")
	}
	if _, err := h.listWS(WorkspaceFilter{NodeID: "node-x"}, 0, ""); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("unknown node: %v", err)
	}
	// Listed records are the stored ones.
	l, _ := h.listWS(WorkspaceFilter{All: true}, 0, "")
	for _, w := range l.Workspaces {
		if got := h.ws(w.WorkspaceID); !reflect.DeepEqual(*got, w) {
			t.Errorf("listed %+v\nget %+v", w, *got)
		}
	}

	// Paging.
	all := sorted(avail.WorkspaceID, creating.WorkspaceID, stopped.WorkspaceID, failed.WorkspaceID, restarted.WorkspaceID)
	for _, f := range []WorkspaceFilter{{All: true}, {}} {
		want := h.listIDs(f)
		for _, size := range []int{0, 1, 2, 3, len(want), len(want) + 1} {
			var got []string
			token, pages := "", 0
			for {
				l, err := h.listWS(f, size, token)
				if err != nil {
					t.Fatal(err)
				}
				pages++
				if size > 0 && len(l.Workspaces) > size {
					t.Fatalf("page size %d: page of %d", size, len(l.Workspaces))
				}
				for _, w := range l.Workspaces {
					got = append(got, w.WorkspaceID)
				}
				if l.NextPageToken == "" {
					break
				}
				if pages > 10 {
					t.Fatalf("page size %d: no end", size)
				}
				token = l.NextPageToken
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("filter %+v page size %d: %v, want %v", f, size, got, want)
			}
			wantPages := 1
			if size > 0 && len(want) > 0 {
				wantPages = (len(want) + size - 1) / size
			}
			if pages != wantPages {
				t.Errorf("filter %+v page size %d: %d pages, want %d", f, size, pages, wantPages)
			}
		}
	}
	if l, _ := h.listWS(WorkspaceFilter{All: true}, 2, all[1]); len(l.Workspaces) != 2 || l.Workspaces[0].WorkspaceID != all[2] {
		t.Errorf("from token %s: %+v", all[1], l)
	}
	if l, _ := h.listWS(WorkspaceFilter{All: true}, 0, "zzz"); l.Workspaces == nil || len(l.Workspaces) != 0 || l.NextPageToken != "" {
		t.Errorf("token after the last id: %+v", l)
	}
}

func TestGetWorkspaceUnknown(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	if err := h.wsErr("ws-nope"); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("got %v", err)
	}
}

// A snapshot carries Workspaces, their index and their command records.
func TestWorkspaceSnapshotRoundTrip(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.running("c1", smallWS)
	h.stopped("c2", smallWS)
	var buf strings.Builder
	if err := h.f.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	want := h.dump()
	c := &harness{t: t, f: openFSM(t), now: h.now}
	if err := c.f.Restore(strings.NewReader(buf.String())); err != nil {
		t.Fatal(err)
	}
	if got := c.dump(); got != want {
		t.Fatalf("restored state differs:\n%s", diffLines(want, got))
	}
	checkIndex(t, c.f)
	if r := c.expectUnchanged(c.entry(OpWorkspaceCreate, smallWS, withCommand("c1"))); !r.Replayed {
		t.Error("create not replayed after restore")
	}
}

// A delete waiting for the layer's node when that node is retired: the
// files are still on the retired host's disk, so the delete waits for a
// host that declares that pool (the disk moved there) or for declare-lost;
// a delete issued after the retirement waits the same way.
func TestWorkspaceRetireWithPendingDelete(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	pinA := smallWS
	pinA.NodeID = "node-a"
	w := h.stopped("c1", pinA)
	kept := h.stopped("c2", pinA)
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if s := h.node("node-a").Status; s != api.NodeDrained {
		t.Fatalf("status %s", s)
	}
	h.advance(time.Second)
	h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"})
	if got := h.ws(w.WorkspaceID); got.State != api.WorkspaceDeleting || got.Pending != nil || got.DeleteWaitsForPool != "node-a:default" {
		t.Errorf("DELETING workspace after retire: %+v", got)
	}
	if p := h.pendingOn("node-a"); len(p) != 0 {
		t.Errorf("pending on the retired node: %v", p)
	}
	h.advance(time.Second)
	if got := decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: kept.WorkspaceID})); got.DeleteWaitsForPool != "node-a:default" || got.DeletedAt != nil {
		t.Errorf("delete after retire: %+v", got)
	}
	checkIndex(t, h.f)
	// node-b mounts node-a's disk and declares its pool: both deletes go there.
	h.report("node-b", sessOf("node-b"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Templates: testTemplates,
		Pools: append(append([]api.Pool{}, defaultPoolAvailable...), api.Pool{PoolID: "node-a:default", Path: "/mnt/node-a", Available: true})})
	for _, id := range []string{w.WorkspaceID, kept.WorkspaceID} {
		if got := h.ws(id); got.Pending == nil || got.Pending.NodeID != "node-b" || got.Layer.NodeID != "node-b" || api.LayerPoolID(got.Layer) != "node-a:default" {
			t.Fatalf("%s after the pool moved to node-b: %+v", id, got)
		}
		h.answer(id, OutcomeOK, "")
		if err := h.wsErr(id); api.CodeOf(err) != api.CodeNotFound {
			t.Errorf("%s after node-b removed its files: %v", id, err)
		}
	}
	checkIndex(t, h.f)
}

// A layer in a shared pool moves with its Workspace: stopped on node-a, it
// starts on node-b, and isolating node-a leaves it startable elsewhere.
func TestWorkspaceSharedPool(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	shared := append([]api.Pool{{PoolID: "shared", Path: "/srv/shared", Available: true, Shared: true}}, defaultPoolAvailable...)
	for _, n := range []string{"node-a", "node-b"} {
		h.schedNode(n, 1, 4000, 8*gib)
		h.report(n, sessOf(n), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: shared, DefaultPool: "shared", Templates: testTemplates})
	}
	h.poolCapacity("shared", 1<<40)
	a := smallWS
	a.NodeID = "node-a"
	w := h.create("c1", a)
	if w.Layer == nil || *w.Layer != (api.LayerRight{NodeID: "node-a", PoolID: "shared", Shared: true, Held: true}) {
		t.Fatalf("layer of a create on a node whose default pool is shared: %+v", w.Layer)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	moved := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID, NodeID: "node-b"}))
	if moved.NodeID != "node-b" || moved.Layer.NodeID != "node-b" || !moved.Layer.Held || moved.Pending.NodeID != "node-b" {
		t.Fatalf("start on node-b: %+v layer %+v", moved, moved.Layer)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Errorf("node-a still holds %+v after the Workspace moved", hd)
	}
	// node-b dies and is isolated: the layer's use right is released and
	// the Workspace starts on node-a, which reaches the same pool.
	h.closeSession("node-b", sessOf("node-b"))
	res := decode[api.IsolateResult](t, h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-b"}))
	if res.RetainedLayersReleased != 1 || res.WorkspacesFailed != 1 {
		t.Errorf("isolate result %+v", res)
	}
	h.advance(time.Second)
	again := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if again.NodeID != "node-a" || again.Layer.NodeID != "node-a" {
		t.Errorf("start after isolate: %+v layer %+v", again, again.Layer)
	}
	checkIndex(t, h.f)
}

// A Workspace is placed only on a node that reports its template built,
// even when another node has more room; a template no node has is named.
func TestWorkspaceTemplatePlacement(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	// node-b is emptier but has only kibotos-base.
	h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: 3000},
		Pools: defaultPoolAvailable, Templates: testTemplates})
	h.report("node-b", sessOf("node-b"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: []string{"kibotos-base"}})
	if w := h.create("c1", smallWS); w.NodeID != "node-a" {
		t.Errorf("kibotos-coding is only on node-a, placed on %s", w.NodeID)
	}
	base := smallWS
	base.Template = "kibotos-base"
	if w := h.create("c2", base); w.NodeID != "node-b" {
		t.Errorf("kibotos-base on both: the emptier node-b should take it, got %s", w.NodeID)
	}
	pinned := smallWS
	pinned.NodeID = "node-b"
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, pinned, withCommand("c3"))
	none := smallWS
	none.Template = "nowhere"
	err := h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, none, withCommand("c4"))
	if !strings.Contains(err.Error(), "template nowhere is not built on any node") {
		t.Errorf("unknown template: %v", err)
	}
	checkIndex(t, h.f)
}

// A node's ended-Instance records: ctrl stores the conclusion of an
// Instance it no longer waits for and lets the node delete the record; one
// still current waits; records of Instances ctrl never placed go too.
func TestWorkspaceEndedRecords(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", smallWS)
	first := w.InstanceID
	base := api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates}
	endedAt := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	reportEnded := func(ended ...api.EndedInstance) ReportResult {
		t.Helper()
		r := base
		r.Ended = ended
		h.advance(time.Second)
		return decode[ReportResult](t, h.ok(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Report: r}))
	}
	// Still its current Instance (the stop's answer not taken yet): kept.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if res := reportEnded(api.EndedInstance{InstanceID: first, EndedAt: endedAt, How: "stopped"}); len(res.Forget) != 0 {
		t.Fatalf("forget %v while ctrl still waits for the stop", res.Forget)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	res := reportEnded(api.EndedInstance{InstanceID: first, EndedAt: endedAt, How: "stopped"},
		api.EndedInstance{InstanceID: "vm-not-ours", EndedAt: endedAt, How: "stopped"})
	if !slices.Equal(res.Forget, []string{first, "vm-not-ours"}) {
		t.Fatalf("forget %v", res.Forget)
	}
	got := h.ws(w.WorkspaceID)
	want := api.CleanupConclusion{InstanceID: first, NodeID: "node-a", ObservedAt: endedAt, How: "stopped"}
	if got.Cleanup == nil || *got.Cleanup != want {
		t.Fatalf("conclusion %+v, want %+v", got.Cleanup, want)
	}
	// Concluded once: a repeated record is just forgotten again.
	if res := reportEnded(api.EndedInstance{InstanceID: first, EndedAt: endedAt, How: "stopped"}); !slices.Equal(res.Forget, []string{first}) {
		t.Fatalf("repeat: forget %v", res.Forget)
	}
	if n := h.node("node-a"); n.Report == nil || n.Report.Ended != nil {
		t.Errorf("ended records were stored in the registration: %+v", n.Report)
	}
	checkIndex(t, h.f)
}

// A reader sees what the node last reported of the current Instance's
// denied packets; the stored record never holds it.
func TestViewWorkspaceDenied(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	a := h.running("c1", smallWS)
	view := func() *api.Workspace {
		t.Helper()
		var w *api.Workspace
		if err := h.f.View(func(tx *bolt.Tx) (err error) { w, err = ViewWorkspace(tx, a.WorkspaceID); return }); err != nil {
			t.Fatal(err)
		}
		return w
	}
	if d := view().Denied; d != nil {
		t.Errorf("denied before a report names the Instance: %+v", d)
	}
	h.advance(time.Second)
	h.report(a.NodeID, sessOf(a.NodeID), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
		InstanceStates: []api.InstanceState{{InstanceID: a.InstanceID, State: "RUNNING", DeniedPackets: 17}, {InstanceID: "inst-other", State: "RUNNING", DeniedPackets: 3}}})
	if d := view().Denied; d == nil || d.Packets != 17 || !d.ReportedAt.Equal(h.now) {
		t.Errorf("denied after the report: %+v, want 17 as of %s", d, h.now)
	}
	if stored := h.ws(a.WorkspaceID); stored.Denied != nil {
		t.Errorf("the stored record holds a denied count: %+v", stored.Denied)
	}
	// Stopped: no current Instance, no count.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: a.WorkspaceID})
	h.answer(a.WorkspaceID, OutcomeOK, "")
	if d := view().Denied; d != nil {
		t.Errorf("denied of a stopped Workspace: %+v", d)
	}
}
