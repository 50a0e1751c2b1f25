package fsm

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func (h *harness) pool(id string) *api.StoragePool {
	h.t.Helper()
	var p *api.StoragePool
	if err := h.f.View(func(tx *bolt.Tx) (err error) { p, err = GetStoragePool(tx, id); return }); err != nil {
		h.t.Fatalf("storage pool %s: %v", id, err)
	}
	return p
}

func (h *harness) poolIDs() []string {
	h.t.Helper()
	var l *api.StoragePoolList
	if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListStoragePools(tx, 0, ""); return }); err != nil {
		h.t.Fatalf("list storage pools: %v", err)
	}
	ids := []string{}
	for _, p := range l.Pools {
		ids = append(ids, p.PoolID)
	}
	return ids
}

func members(p *api.StoragePool) string {
	var out []string
	for _, m := range p.Nodes {
		out = append(out, m.NodeID)
	}
	return strings.Join(out, ",")
}

// poolReport is a schedulable node's report with extra pools and the
// coding template's image size.
func poolReport(defaultPool string, templateBytes uint64, extra ...api.Pool) api.Report {
	return api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: append(append([]api.Pool{}, defaultPoolAvailable...), extra...),
		DefaultPool: defaultPool, Templates: testTemplates, TemplateBytes: map[string]uint64{"kibotos-coding": templateBytes}}
}

var (
	nfsPool = api.Pool{PoolID: "nfs", Path: "/srv/nfs", Available: true, Shared: true}
	usbPool = api.Pool{PoolID: "usb", Path: "/srv/usb", Available: true}
)

// Pools exist at ctrl by the nodes' declarations: a node's private pool
// under its own id (also when an older node calls it "default"), shared
// pools with every admitted declaring node as member; a node that stops
// declaring it, is revoked or retired is no member; a declaration with the
// other sharing is a conflict, not a membership.
func TestPoolMembership(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.report("node-a", sessOf("node-a"), poolReport("", 0, nfsPool))
	h.report("node-b", sessOf("node-b"), poolReport("", 0, nfsPool))
	if got := h.poolIDs(); strings.Join(got, " ") != "nfs node-a:default node-b:default" {
		t.Fatalf("pools %v", got)
	}
	if p := h.pool("nfs"); !p.Shared || members(p) != "node-a,node-b" || p.CapacityBytes != nil || p.AvailableBytes != nil || p.Version != 1 {
		t.Fatalf("shared pool %+v members %s", p, members(p))
	}
	if p := h.pool("node-a:default"); p.Shared || members(p) != "node-a" || p.Nodes[0].Path != "/srv/default" || !p.Nodes[0].Available {
		t.Fatalf("private pool %+v", p)
	}
	// node-b declares it standalone: a conflict until its config agrees.
	standalone := nfsPool
	standalone.Shared = false
	h.report("node-b", sessOf("node-b"), poolReport("", 0, standalone))
	if p := h.pool("nfs"); members(p) != "node-a" || len(p.Conflicting) != 1 || p.Conflicting[0] != "node-b" {
		t.Fatalf("conflicting declaration: members %s conflicting %v", members(p), p.Conflicting)
	}
	// node-a drops it from its config.
	h.report("node-a", sessOf("node-a"), poolReport("", 0))
	if p := h.pool("nfs"); members(p) != "" {
		t.Fatalf("members %s after node-a stopped declaring it", members(p))
	}
	// Its member index entry goes with it (the view would hide a stale
	// one, which would only cost every later read of the pool).
	h.f.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketPoolMembers).Get(poolMemberKey("nfs", "node-a")) != nil {
			t.Errorf("pool member index still lists node-a in nfs")
		}
		return nil
	})
	// Revoked: not a member of its own private pool either.
	h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-b"})
	if p := h.pool("node-b:default"); members(p) != "" {
		t.Fatalf("revoked node-b still a member: %s", members(p))
	}
}

// A report's pool list is bounded and its ids valid: a bad one rejects
// the report and changes nothing.
func TestPoolReportValidation(t *testing.T) {
	many := make([]api.Pool, api.MaxPoolsPerNode+1)
	for i := range many {
		many[i] = api.Pool{PoolID: "p" + strings.Repeat("x", i%60) + string(rune('a'+i%26)), Path: "/srv"}
	}
	rep := func(pools ...api.Pool) func(h *harness) Entry {
		return ent(OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Report: api.Report{Pools: pools}})
	}
	runCases(t, []opCase{
		{name: "bad id", setup: readyNode, entry: rep(api.Pool{PoolID: "Bad Pool"}), code: api.CodeInvalidArgument},
		{name: "twice", setup: readyNode, entry: rep(usbPool, usbPool), code: api.CodeInvalidArgument},
		{name: "default and the private id", setup: readyNode, entry: rep(api.Pool{PoolID: "default"}, api.Pool{PoolID: "node-a:default"}), code: api.CodeInvalidArgument},
		{name: "too many", setup: readyNode, entry: rep(many...), code: api.CodeInvalidArgument},
		{name: "another node's private pool (moved disk)", setup: readyNode, entry: rep(api.Pool{PoolID: "node-x:default", Path: "/mnt/x"}), check: func(t *testing.T, h *harness, r Result) {
			if p := h.pool("node-x:default"); members(p) != "node-a" {
				t.Errorf("moved private pool members %s", members(p))
			}
		}},
	})
}

func TestPoolSetCapacity(t *testing.T) {
	set := func(pool string, size uint64, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpPoolSetCapacity, PoolCapacityArgs{PoolID: pool, CapacityBytes: size}, opts...)
	}
	declared := func(h *harness) { oneNode(h) } // node-a:default has 1 TiB (schedNode)
	runCases(t, []opCase{
		{name: "unknown pool", setup: declared, entry: set("nowhere", gib), code: api.CodeNotFound},
		{name: "bad id", setup: declared, entry: set("Bad", gib), code: api.CodeInvalidArgument},
		{name: "zero", setup: declared, entry: set("node-a:default", 0), code: api.CodeInvalidArgument},
		{name: "over 1 EiB", setup: declared, entry: set("node-a:default", api.MaxPoolCapacity+1), code: api.CodeInvalidArgument},
		{name: "stale version", setup: declared, entry: set("node-a:default", gib, withVersion(1)), code: api.CodeVersionMismatch},
		{name: "set", setup: declared, entry: set("node-a:default", 3*gib, withVersion(2)), check: func(t *testing.T, h *harness, r Result) {
			p := decode[api.StoragePool](t, r)
			if *p.CapacityBytes != 3*gib || *p.AvailableBytes != 3*gib || p.Version != 3 || members(&p) != "node-a" {
				t.Errorf("after set-capacity: %+v", p)
			}
		}},
	})
}

// Capacity is ctrl's: a pool without one takes no new layer, a layer
// takes its template's image size, one that does not fit is refused (15)
// with nothing created, and a delete gives the room back.
func TestPoolCapacityPlacement(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	h.join("node-a")
	h.open("node-a", sessOf("node-a"), 1)
	h.ok(OpOvercommitAck, OvercommitAckArgs{NodeID: "node-a", SessionID: sessOf("node-a"), Values: api.Multipliers{CPU: 1000, Memory: 1000}})
	h.report("node-a", sessOf("node-a"), poolReport("", 4*gib))

	err := h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, smallWS, withCommand("c1"))
	if !strings.Contains(err.Message, "no capacity set") || !strings.Contains(err.Message, "kibo storage-pool set-capacity") {
		t.Errorf("create into a pool without capacity: %v", err)
	}
	pinned := smallWS
	pinned.NodeID = "node-a"
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, pinned, withCommand("c1")); !strings.Contains(err.Message, "no capacity set") {
		t.Errorf("pinned create into a pool without capacity: %v", err)
	}
	h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "node-a:default", CapacityBytes: 6 * gib})
	w := h.create("c1", smallWS)
	if w.Layer.SizeBytes != 4*gib || w.Layer.PoolID != "node-a:default" {
		t.Fatalf("layer %+v", w.Layer)
	}
	if p := h.pool("node-a:default"); p.UsedBytes != 4*gib || *p.AvailableBytes != 2*gib || p.Layers != 1 {
		t.Fatalf("after one layer: %+v", p)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if err := h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, smallWS, withCommand("c2")); !strings.Contains(err.Message, "storage pool is full") {
		t.Errorf("create into a full pool: %v", err)
	}
	// Shrinking below what is used is allowed: nothing new fits.
	h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "node-a:default", CapacityBytes: gib})
	if p := h.pool("node-a:default"); *p.AvailableBytes != 0 {
		t.Errorf("available %d with capacity below use", *p.AvailableBytes)
	}
	h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "node-a:default", CapacityBytes: 8 * gib})
	h.advance(time.Second)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if p := h.pool("node-a:default"); p.UsedBytes != 0 || p.Layers != 0 {
		t.Errorf("after delete: %+v", p)
	}
}

// standaloneLayer: node-a's default pool is the standalone "usb" pool
// holding the layer of a STOPPED Workspace; node-a is then isolated.
func standaloneLayer(h *harness) api.Workspace {
	h.t.Helper()
	oneNode(h)
	h.report("node-a", sessOf("node-a"), poolReport("usb", gib, usbPool))
	h.poolCapacity("usb", 10*gib)
	w := h.stopped("c1", smallWS)
	if api.LayerPoolID(w.Layer) != "usb" {
		h.t.Fatalf("layer %+v", w.Layer)
	}
	h.closeSession("node-a", sessOf("node-a"))
	h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	return w
}

// A standalone pool's only host that is up but full says so, as a lack of
// room (15), not as a node to wait for.
func TestStandaloneHostFull(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.report("node-a", sessOf("node-a"), poolReport("usb", gib, usbPool))
	h.poolCapacity("usb", 10*gib)
	w := h.stopped("c1", smallWS)
	h.running("c2", wsArgs(4000, gib)) // every CPU of node-a
	err := h.fail(api.CodeResourceExhausted, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if want := "its writable layer is in standalone pool usb of node node-a, the only node that can start it, which has no room for it now: not enough CPU; free room on node-a"; !strings.Contains(err.Message, want) {
		t.Errorf("start on a full host: %v, want %q", err, want)
	}
}

// A standalone pool whose only host is gone waits for it, or for another
// host that declares the same pool id (its disk moved there).
func TestPoolMovedToAnotherHost(t *testing.T) {
	h := newHarness(t)
	w := standaloneLayer(h)
	h.schedNode("node-c", 1, 4000, 8*gib)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}); !strings.Contains(err.Message, "its writable layer is in standalone pool usb of node node-a, the only node that can start it, which cannot now: isolated;") {
		t.Errorf("start before the pool moved: %v", err)
	}
	h.report("node-c", sessOf("node-c"), poolReport("", gib, usbPool))
	if p := h.pool("usb"); members(p) != "node-a,node-c" {
		t.Fatalf("members %s", members(p))
	}
	got := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
	if got.NodeID != "node-c" || got.Layer.NodeID != "node-c" || api.LayerPoolID(got.Layer) != "usb" {
		t.Fatalf("start after the pool moved: node %s layer %+v", got.NodeID, got.Layer)
	}
}

func TestPoolDeclareLost(t *testing.T) {
	lost := func(pool string, confirm bool, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpPoolDeclareLost, PoolDeclareLostArgs{PoolID: pool, ConfirmDataLost: confirm}, opts...)
	}
	retired := func(h *harness) {
		standaloneLayer(h)
		h.ok(OpNodeRetire, NodeArgs{NodeID: "node-a"})
	}
	runCases(t, []opCase{
		{name: "without confirmation", setup: retired, entry: lost("usb", false), code: api.CodeInvalidArgument},
		{name: "unknown pool", setup: retired, entry: lost("nowhere", true), code: api.CodeNotFound},
		{name: "still declared by an isolated node", setup: func(h *harness) { standaloneLayer(h) }, entry: lost("usb", true), code: api.CodeFailedPrecondition},
		{name: "stale version", setup: retired, entry: lost("usb", true, withVersion(7)), code: api.CodeVersionMismatch},
		{name: "an Instance still uses a layer there", setup: func(h *harness) {
			oneNode(h)
			h.report("node-a", sessOf("node-a"), poolReport("usb", gib, usbPool))
			h.poolCapacity("usb", 10*gib)
			h.running("c1", smallWS)
			h.report("node-a", sessOf("node-a"), poolReport("", gib)) // usb gone from its config
		}, entry: lost("usb", true), code: api.CodeFailedPrecondition},
		{name: "ends the objects", setup: retired, entry: lost("usb", true), check: func(t *testing.T, h *harness, r Result) {
			res := decode[api.PoolLostResult](t, r)
			id := WorkspaceIDFor("c1")
			if res.RetainedLayers != 1 || len(res.Workspaces) != 1 || res.Workspaces[0] != id {
				t.Fatalf("result %+v", res)
			}
			if ids := h.poolIDs(); strings.Join(ids, " ") != "node-a:default" {
				t.Errorf("pools after declare-lost: %v", ids)
			}
			if w := h.ws(id); !w.Layer.Lost || w.Layer.Held {
				t.Errorf("layer %+v", w.Layer)
			}
			h.schedNode("node-b", 1, 4000, 8*gib)
			if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: id}); !strings.Contains(err.Message, "lost with storage pool usb") {
				t.Errorf("start of a lost layer: %v", err)
			}
			h.advance(time.Second)
			if w := decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id})); w.DeletedAt == nil {
				t.Errorf("delete of a Workspace whose layer was lost waited: %+v", w)
			}
			// The id declared again is a new, empty pool.
			h.report("node-b", sessOf("node-b"), poolReport("", gib, usbPool))
			if p := h.pool("usb"); p.CapacityBytes != nil || p.Layers != 0 || p.Version != 1 {
				t.Errorf("re-declared pool %+v", p)
			}
		}},
	})
}

// After isolate, a shared pool's files are removed by another member at
// once; a standalone pool's wait (DELETING, cleanup pending) until a
// member can, and declare-lost ends that wait with the pool.
func TestPoolDeleteAfterIsolate(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	for _, n := range []string{"node-a", "node-b"} {
		h.report(n, sessOf(n), poolReport("nfs", gib, nfsPool))
	}
	h.poolCapacity("nfs", 10*gib)
	pinA := smallWS
	pinA.NodeID = "node-a"
	shared := h.running("c1", pinA)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: shared.WorkspaceID}) // waits for node-a
	h.closeSession("node-a", sessOf("node-a"))
	h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"})
	got := h.ws(shared.WorkspaceID)
	if got.State != api.WorkspaceDeleting || got.Pending == nil || got.Pending.NodeID != "node-b" || got.Layer.NodeID != "node-b" || got.NodeID != "" {
		t.Fatalf("shared pool delete after isolate: %+v pending %+v layer %+v", got, got.Pending, got.Layer)
	}
	h.answer(shared.WorkspaceID, OutcomeOK, "")
	if err := h.wsErr(shared.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("after node-b removed the files: %v", err)
	}
	if p := h.pool("nfs"); p.Layers != 0 || p.UsedBytes != 0 {
		t.Errorf("nfs after the delete: %+v", p)
	}

	// A standalone pool of node-c's alone.
	h.schedNode("node-c", 1, 4000, 8*gib)
	h.report("node-c", sessOf("node-c"), poolReport("usb", gib, usbPool))
	h.poolCapacity("usb", 10*gib)
	pinC := smallWS
	pinC.NodeID = "node-c"
	alone := h.stopped("c2", pinC)
	h.closeSession("node-c", sessOf("node-c"))
	h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-c"})
	h.advance(time.Second)
	if got := decode[api.Workspace](t, h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: alone.WorkspaceID})); got.State != api.WorkspaceDeleting || got.Pending != nil || got.DeleteWaitsForPool != "usb" {
		t.Fatalf("standalone delete after isolate: %+v", got)
	}
	h.ok(OpNodeRetire, NodeArgs{NodeID: "node-c"})
	res := decode[api.PoolLostResult](t, h.ok(OpPoolDeclareLost, PoolDeclareLostArgs{PoolID: "usb", ConfirmDataLost: true}))
	if res.RetainedLayers != 1 {
		t.Errorf("declare-lost result %+v", res)
	}
	if err := h.wsErr(alone.WorkspaceID); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("a delete waiting for a lost pool: %v", err)
	}
	checkIndex(t, h.f)
}

// A node that could not take an Instance over because its layer's pool
// did not open says so with the stage its error begins with; ctrl keeps
// the stage with the failure.
func TestPoolUnavailableAtTakeoverFailsWithStage(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", smallWS)
	msg := "PREPARING_RETAINED_LAYER: storage pool is unavailable: pool node-a:default at /srv/default did not open for takeover"
	rep := poolReport("", 0)
	rep.InstanceStates = []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: msg}}
	h.report("node-a", sessOf("node-a"), rep)
	got := h.ws(w.WorkspaceID)
	if got.State != api.WorkspaceFailed || got.Failure == nil || got.Failure.Stage != api.StagePreparingRetainedLayer || got.Failure.Message != msg || got.Failure.Reason != api.FailureNoLongerRunning {
		t.Fatalf("after the report: %+v failure %+v", got, got.Failure)
	}
}

// A snapshot of a release before pools were counted: restored, the
// pools' use is recounted from the Workspaces' layers, so a later delete
// does not drive a counter below zero.
func TestRestoreRecountsPoolUse(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.report("node-a", sessOf("node-a"), poolReport("", 2*gib))
	w := h.stopped("c1", smallWS)
	var buf bytes.Buffer
	if err := h.f.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	// Make it an older release's: no pool buckets.
	path := filepath.Join(t.TempDir(), "old.db")
	os.WriteFile(path, buf.Bytes(), 0o600)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketPools, bucketPoolUse, bucketPoolMembers, bucketPoolWaits} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	old, _ := os.ReadFile(path)
	c := &harness{t: t, f: openFSM(t), now: h.now}
	if err := c.f.Restore(bytes.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, c.f)
	c.report("node-a", sessOf("node-a"), poolReport("", 2*gib)) // declares the pool again
	if p := c.pool("node-a:default"); p.Layers != 1 || p.UsedBytes != 2*gib {
		t.Fatalf("restored pool %+v", p)
	}
	c.advance(time.Second)
	c.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	c.answer(w.WorkspaceID, OutcomeOK, "")
	if p := c.pool("node-a:default"); p.Layers != 0 || p.UsedBytes != 0 {
		t.Errorf("after the delete: %+v", p)
	}
	checkIndex(t, c.f)
}
