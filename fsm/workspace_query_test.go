package fsm

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

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
