package fsm

import (
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func (h *harness) vol(ref string) *api.Volume {
	h.t.Helper()
	var v *api.Volume
	if err := h.f.View(func(tx *bolt.Tx) (err error) { v, err = GetVolume(tx, "", ref); return }); err != nil {
		h.t.Fatalf("volume %s: %v", ref, err)
	}
	return v
}

func (h *harness) volErr(ref string) error {
	return h.f.View(func(tx *bolt.Tx) error { _, err := GetVolume(tx, "", ref); return err })
}

// createVolume creates a Volume with command id cmd and answers its
// create ok: AVAILABLE.
func (h *harness) createVolume(cmd string, a VolumeCreateArgs) *api.Volume {
	h.t.Helper()
	h.advance(time.Second)
	v := decode[api.Volume](h.t, h.ok(OpVolumeCreate, a, withCommand(cmd)))
	if v.VolumeID != VolumeIDFor(cmd) || v.State != api.VolumeCreating || v.Pending == nil || v.Pending.Kind != api.VolCmdCreate {
		h.t.Fatalf("create %s: %+v", cmd, v)
	}
	return h.volAnswer(v.Name, OutcomeOK, "", false)
}

// volAnswer sends the node's answer to the Volume's pending command.
func (h *harness) volAnswer(ref, outcome, msg string, fsPending bool) *api.Volume {
	h.t.Helper()
	v := h.vol(ref)
	if v.Pending == nil {
		h.t.Fatalf("volume %s has no pending command: %+v", ref, v)
	}
	h.advance(time.Second)
	r := h.ok(OpVolumeResult, VolumeResultArgs{NodeID: v.Pending.NodeID, SessionID: sessOf(v.Pending.NodeID), VolumeID: v.VolumeID,
		CommandID: v.Pending.CommandID, Outcome: outcome, Error: msg, FilesystemPending: fsPending})
	if !decode[map[string]bool](h.t, r)["applied"] {
		h.t.Fatalf("answer %s to volume %s not applied", outcome, ref)
	}
	if api.CodeOf(h.volErr(v.VolumeID)) == api.CodeNotFound {
		return nil
	}
	return h.vol(v.VolumeID)
}

func (h *harness) volumeTasks(node string) []string {
	h.t.Helper()
	var out []string
	if err := h.f.View(func(tx *bolt.Tx) error {
		vs, err := PendingVolumeCommands(tx, node)
		for _, v := range vs {
			out = append(out, v.Name+":"+v.Pending.Kind)
		}
		return err
	}); err != nil {
		h.t.Fatal(err)
	}
	return out
}

var dataVol = VolumeCreateArgs{Name: "data", SizeBytes: 2 * gib}

func TestVolumeCreate(t *testing.T) {
	create := func(a VolumeCreateArgs, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpVolumeCreate, a, append([]entryOpt{withCommand("v1")}, opts...)...)
	}
	withPool := func(a VolumeCreateArgs, pool, node string) VolumeCreateArgs {
		a.PoolID, a.NodeID = pool, node
		return a
	}
	runCases(t, []opCase{
		{name: "no command id", setup: oneNode, entry: ent(OpVolumeCreate, dataVol), code: api.CodeInvalidArgument},
		{name: "bad name", setup: oneNode, entry: create(VolumeCreateArgs{Name: "Data", SizeBytes: gib}), code: api.CodeInvalidArgument},
		{name: "name like an id", setup: oneNode, entry: create(VolumeCreateArgs{Name: "vol-x", SizeBytes: gib}), code: api.CodeInvalidArgument},
		{name: "too small", setup: oneNode, entry: create(VolumeCreateArgs{Name: "d", SizeBytes: 1 << 20}), code: api.CodeInvalidArgument},
		{name: "not whole MiB", setup: oneNode, entry: create(VolumeCreateArgs{Name: "d", SizeBytes: gib + 1}), code: api.CodeInvalidArgument},
		{name: "over 16 TiB", setup: oneNode, entry: create(VolumeCreateArgs{Name: "d", SizeBytes: api.MaxVolumeSize + api.VolumeSizeUnit}), code: api.CodeInvalidArgument},
		{name: "unknown pool", setup: oneNode, entry: create(withPool(dataVol, "nowhere", "")), code: api.CodeNotFound},
		{name: "unknown node", setup: oneNode, entry: create(withPool(dataVol, "", "node-x")), code: api.CodeNotFound},
		{name: "draining node", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
		}, entry: create(withPool(dataVol, "", "node-a")), code: api.CodeFailedPrecondition},
		{name: "node does not report the pool", setup: oneNode, entry: create(withPool(dataVol, "usb", "node-a")), code: api.CodeFailedPrecondition},
		{name: "no capacity", setup: func(h *harness) {
			oneNode(h)
			h.report("node-a", sessOf("node-a"), poolReport("", gib, usbPool))
		}, entry: create(withPool(dataVol, "usb", "")), code: api.CodeResourceExhausted},
		{name: "full pool", setup: func(h *harness) {
			oneNode(h)
			h.report("node-a", sessOf("node-a"), poolReport("", gib, usbPool))
			h.poolCapacity("usb", gib)
		}, entry: create(withPool(dataVol, "usb", "")), code: api.CodeResourceExhausted},
		{name: "name taken", setup: func(h *harness) {
			oneNode(h)
			h.createVolume("v0", dataVol)
		}, entry: create(dataVol), code: api.CodeAlreadyExists},
		{name: "in the default pool of the node placement chooses", setup: oneNode, entry: create(dataVol), check: func(t *testing.T, h *harness, r Result) {
			v := decode[api.Volume](t, r)
			if v.PoolID != "node-a:default" || v.NodeID != "node-a" || v.State != api.VolumeCreating || v.Made || v.Pending.SizeBytes != 2*gib {
				t.Fatalf("created %+v pending %+v", v, v.Pending)
			}
			if p := h.pool("node-a:default"); p.Volumes != 1 || p.UsedBytes != 2*gib {
				t.Errorf("pool use %+v", p)
			}
			if got := h.volumeTasks("node-a"); strings.Join(got, " ") != "data:create" {
				t.Errorf("tasks %v", got)
			}
			v2 := h.volAnswer("data", OutcomeOK, "", false)
			if v2.State != api.VolumeAvailable || !v2.Made || v2.Pending != nil || len(h.volumeTasks("node-a")) != 0 {
				t.Errorf("after the node made it: %+v", v2)
			}
			checkIndex(t, h.f)
		}},
		{name: "in a shared pool on a member", setup: func(h *harness) {
			twoNodes(h)
			h.report("node-b", sessOf("node-b"), poolReport("", gib, nfsPool))
			h.poolCapacity("nfs", 10*gib)
		}, entry: create(withPool(dataVol, "nfs", "")), check: func(t *testing.T, h *harness, r Result) {
			v := decode[api.Volume](t, r)
			if v.NodeID != "node-b" || !v.Shared || v.PoolID != "nfs" {
				t.Fatalf("created %+v", v)
			}
		}},
		{name: "a failed create is dropped by delete at once", setup: oneNode, entry: create(dataVol), check: func(t *testing.T, h *harness, r Result) {
			v := h.volAnswer("data", OutcomeFailed, "mkfs.ext4: no space", false)
			if v.State != api.VolumeFailed || !strings.Contains(v.Error, "no space") {
				t.Fatalf("after a failed create: %+v", v)
			}
			h.advance(time.Second)
			if got := decode[api.Volume](t, h.ok(OpVolumeDelete, VolumeArgs{Volume: "data"})); got.DeletedAt == nil {
				t.Errorf("delete of a Volume never made waited: %+v", got)
			}
			if p := h.pool("node-a:default"); p.Volumes != 0 || p.UsedBytes != 0 {
				t.Errorf("pool use after delete %+v", p)
			}
			// The name is free again; the id is not.
			h.createVolume("v2", dataVol)
			h.ok(OpCommandsExpire, CommandsExpireArgs{Before: h.now.Add(time.Hour)})
			if err := h.fail(api.CodeAlreadyExists, OpVolumeCreate, VolumeCreateArgs{Name: "other", SizeBytes: gib}, withCommand("v1")); !strings.Contains(err.Message, "was deleted") {
				t.Errorf("create with the command id of a deleted Volume: %v", err)
			}
		}},
	})
}

func TestVolumeResizeAndDelete(t *testing.T) {
	resize := func(ref string, size uint64, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpVolumeResize, VolumeResizeArgs{Volume: ref, SizeBytes: size}, opts...)
	}
	made := func(h *harness) { oneNode(h); h.createVolume("v1", dataVol) }
	runCases(t, []opCase{
		{name: "unknown", setup: made, entry: resize("nope", 4*gib), code: api.CodeNotFound},
		{name: "shrink", setup: made, entry: resize("data", gib), code: api.CodeInvalidArgument},
		{name: "same size", setup: made, entry: resize("data", 2*gib), unchanged: true},
		{name: "stale version", setup: made, entry: resize("data", 4*gib, withVersion(1)), code: api.CodeVersionMismatch},
		{name: "pool too small for the growth", setup: func(h *harness) {
			made(h)
			h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "node-a:default", CapacityBytes: 3 * gib})
		}, entry: resize("data", 4*gib), code: api.CodeResourceExhausted},
		{name: "detached: offline on its node", setup: made, entry: resize("data", 4*gib), check: func(t *testing.T, h *harness, r Result) {
			v := decode[api.Volume](t, r)
			if v.Pending == nil || v.Pending.Kind != api.VolCmdResize || v.Pending.NodeID != "node-a" || v.Pending.InstanceID != "" || v.Expansion == nil || v.Expansion.TargetBytes != 4*gib || v.SizeBytes != 2*gib {
				t.Fatalf("resize accepted: %+v pending %+v", v, v.Pending)
			}
			if p := h.pool("node-a:default"); p.UsedBytes != 4*gib {
				t.Errorf("growth not reserved: %+v", p)
			}
			h.fail(api.CodeFailedPrecondition, OpVolumeResize, VolumeResizeArgs{Volume: "data", SizeBytes: 8 * gib})
			h.fail(api.CodeFailedPrecondition, OpVolumeDelete, VolumeArgs{Volume: "data"})
			v2 := h.volAnswer("data", OutcomeOK, "", false)
			if v2.SizeBytes != 4*gib || v2.Expansion != nil || v2.Pending != nil {
				t.Errorf("after the resize: %+v", v2)
			}
		}},
		{name: "a failed resize gives the room back", setup: made, entry: resize("data", 4*gib), check: func(t *testing.T, h *harness, r Result) {
			v := h.volAnswer("data", OutcomeFailed, "truncate: read-only file system", false)
			if v.SizeBytes != 2*gib || v.Expansion != nil || !strings.Contains(v.Error, "read-only") {
				t.Errorf("after a failed resize: %+v", v)
			}
			if p := h.pool("node-a:default"); p.UsedBytes != 2*gib {
				t.Errorf("pool use %+v", p)
			}
		}},
		{name: "delete", setup: made, entry: ent(OpVolumeDelete, VolumeArgs{Volume: "data"}), check: func(t *testing.T, h *harness, r Result) {
			v := decode[api.Volume](t, r)
			if v.State != api.VolumeDeleting || v.Pending == nil || v.Pending.Kind != api.VolCmdDelete || v.Pending.NodeID != "node-a" {
				t.Fatalf("delete accepted: %+v", v)
			}
			if h.volAnswer("data", OutcomeOK, "", false) != nil {
				t.Fatal("record kept after the node removed the file")
			}
			if p := h.pool("node-a:default"); p.Volumes != 0 || p.UsedBytes != 0 {
				t.Errorf("pool use after the delete %+v", p)
			}
			checkIndex(t, h.f)
		}},
	})
}

// mountWS is a create with an existing Volume at /data and a new one of
// 1 GiB at /scratch.
func mountWS(vol string) WorkspaceCreateArgs {
	a := smallWS
	a.Volumes = []api.VolumeAttach{{Volume: vol, Path: "/data"}}
	a.NewVolumes = []api.NewVolume{{SizeBytes: gib, Path: "/scratch"}}
	return a
}

// A Workspace's Volumes go with its execution: held by its node while it
// runs, released when it stops, made by its first start when new,
// detached (and kept) when it is deleted.
func TestWorkspaceVolumes(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.createVolume("v1", dataVol)
	w := h.create("c1", mountWS("data"))
	newName := w.WorkspaceID + "-1"
	if len(w.Volumes) != 2 || w.Volumes[0].Name != "data" || w.Volumes[1].Name != newName || w.Volumes[1].Path != "/scratch" {
		t.Fatalf("mounts %+v", w.Volumes)
	}
	nv := h.vol(newName)
	if nv.State != api.VolumeCreating || nv.Made || nv.PoolID != "node-a:default" || !nv.Held || nv.WorkspaceID != w.WorkspaceID || nv.Pending != nil {
		t.Fatalf("new volume %+v", nv)
	}
	if v := h.vol("data"); !v.Held || v.NodeID != "node-a" || v.WorkspaceID != w.WorkspaceID || v.MountPath != "/data" {
		t.Fatalf("attached volume %+v", v)
	}
	if hd := h.holds("node-a"); hd.Volumes != 2 || hd.Layers != 1 {
		t.Errorf("holds %+v", hd)
	}
	var tv []api.TaskVolume
	h.f.View(func(tx *bolt.Tx) (err error) { tv, err = TaskVolumes(tx, h.ws(w.WorkspaceID)); return })
	if len(tv) != 2 || tv[0].Create || !tv[1].Create || tv[1].Path != "/scratch" || tv[1].PoolID != "node-a:default" || tv[1].SizeBytes != gib {
		t.Errorf("start task volumes %+v", tv)
	}
	if p := h.pool("node-a:default"); p.Volumes != 2 || p.UsedBytes != 3*gib {
		t.Errorf("pool use %+v", p)
	}
	// Attached: not deletable, not attachable elsewhere.
	if err := h.fail(api.CodeFailedPrecondition, OpVolumeDelete, VolumeArgs{Volume: "data"}); !strings.Contains(err.Message, w.WorkspaceID) {
		t.Errorf("delete of an attached volume: %v", err)
	}
	other := smallWS
	other.Volumes = []api.VolumeAttach{{Volume: "data", Path: "/data"}}
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, other, withCommand("c2"))
	// Resizing while the start is in flight (which makes or opens the
	// files) waits for AVAILABLE.
	h.fail(api.CodeFailedPrecondition, OpVolumeResize, VolumeResizeArgs{Volume: "data", SizeBytes: 4 * gib})
	h.fail(api.CodeFailedPrecondition, OpVolumeResize, VolumeResizeArgs{Volume: newName, SizeBytes: 2 * gib})

	h.answer(w.WorkspaceID, OutcomeOK, "")
	if nv := h.vol(newName); nv.State != api.VolumeAvailable || !nv.Made {
		t.Fatalf("new volume after the start %+v", nv)
	}
	// Online resize goes to the running Instance.
	h.advance(time.Second)
	v := decode[api.Volume](t, h.ok(OpVolumeResize, VolumeResizeArgs{Volume: "data", SizeBytes: 4 * gib}))
	if v.Pending.InstanceID != h.ws(w.WorkspaceID).InstanceID || v.Pending.NodeID != "node-a" {
		t.Fatalf("online resize %+v", v.Pending)
	}
	// A start of another Workspace is not blocked by it, but a stop then
	// start of this one is while the resize runs.
	v = *h.volAnswer("data", OutcomeOK, "guest agent: grow-fs: timed out", true)
	if v.SizeBytes != 4*gib || v.Expansion == nil || !v.Expansion.FilesystemPending {
		t.Fatalf("resize with the filesystem pending %+v", v)
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if v := h.vol("data"); v.Held || v.NodeID != "node-a" || v.WorkspaceID != w.WorkspaceID {
		t.Fatalf("after stop %+v", v)
	}
	if hd := h.holds("node-a"); hd.Volumes != 0 {
		t.Errorf("holds after stop %+v", hd)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if v := h.vol("data"); v.Expansion != nil {
		t.Errorf("the start's mount grew the filesystem, yet %+v", v.Expansion)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if v := h.vol("data"); v.WorkspaceID == "" {
		t.Fatal("detached while its Instance still runs")
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	for _, name := range []string{"data", newName} {
		if v := h.vol(name); v.WorkspaceID != "" || v.Held || v.State != api.VolumeAvailable {
			t.Errorf("volume %s after the Workspace was deleted: %+v", name, v)
		}
	}
	checkIndex(t, h.f)
	// Free again: attach it to another Workspace.
	h.create("c3", other)
}

func TestWorkspaceVolumeValidation(t *testing.T) {
	with := func(vols []api.VolumeAttach, fresh []api.NewVolume) WorkspaceCreateArgs {
		a := smallWS
		a.Volumes, a.NewVolumes = vols, fresh
		return a
	}
	many := make([]api.NewVolume, api.MaxWorkspaceVolumes+1)
	for i := range many {
		many[i] = api.NewVolume{SizeBytes: gib, Path: "/d" + string(rune('a'+i))}
	}
	create := func(a WorkspaceCreateArgs) func(h *harness) Entry {
		return ent(OpWorkspaceCreate, a, withCommand("c1"))
	}
	made := func(h *harness) { oneNode(h); h.createVolume("v1", dataVol) }
	runCases(t, []opCase{
		{name: "too many", setup: made, entry: create(with(nil, many)), code: api.CodeInvalidArgument},
		{name: "relative path", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "data"}}, nil)), code: api.CodeInvalidArgument},
		{name: "root", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "/"}}, nil)), code: api.CodeInvalidArgument},
		{name: "under /proc", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "/proc/x"}}, nil)), code: api.CodeInvalidArgument},
		{name: "overlapping", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "/srv"}}, []api.NewVolume{{SizeBytes: gib, Path: "/srv/x"}})), code: api.CodeInvalidArgument},
		{name: "twice", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "/a"}, {Volume: VolumeIDFor("v1"), Path: "/b"}}, nil)), code: api.CodeInvalidArgument},
		{name: "unknown volume", setup: made, entry: create(with([]api.VolumeAttach{{Volume: "nope", Path: "/a"}}, nil)), code: api.CodeNotFound},
		{name: "new volume too small", setup: made, entry: create(with(nil, []api.NewVolume{{SizeBytes: 1 << 20, Path: "/a"}})), code: api.CodeInvalidArgument},
		{name: "volume still creating", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpVolumeCreate, dataVol, withCommand("v1"))
		}, entry: create(with([]api.VolumeAttach{{Volume: "data", Path: "/a"}}, nil)), code: api.CodeFailedPrecondition},
		{name: "no room for the new volume", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpPoolSetCapacity, PoolCapacityArgs{PoolID: "node-a:default", CapacityBytes: gib})
		}, entry: create(with(nil, []api.NewVolume{{SizeBytes: 2 * gib, Path: "/a"}})), code: api.CodeResourceExhausted},
	})
}

// An object in a standalone pool pins the Workspace to the node that has
// the pool; objects of two such nodes cannot be used together.
func TestVolumePlacementPins(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.createVolume("v1", VolumeCreateArgs{Name: "on-b", SizeBytes: gib, NodeID: "node-b"})
	a := smallWS
	a.Volumes = []api.VolumeAttach{{Volume: "on-b", Path: "/data"}}
	pinA := a
	pinA.NodeID = "node-a"
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, pinA, withCommand("c1")); !strings.Contains(err.Message, "its volume on-b is in pool node-b:default of node node-b, which node node-a cannot reach") {
		t.Errorf("pinned elsewhere: %v", err)
	}
	// A node that does not exist is named as such, before any pool.
	pinGhost := a
	pinGhost.NodeID = "node-ghost"
	if err := h.fail(api.CodeNotFound, OpWorkspaceCreate, pinGhost, withCommand("c0")); !strings.Contains(err.Message, "node node-ghost is not registered") {
		t.Errorf("pinned to an unknown node: %v", err)
	}
	w := h.create("c1", a)
	if w.NodeID != "node-b" || w.Layer.PoolID != "node-b:default" {
		t.Fatalf("placed on %s layer %+v", w.NodeID, w.Layer)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	// A Volume of node-a's pool with it: no node reaches both.
	h.createVolume("v2", VolumeCreateArgs{Name: "on-a", SizeBytes: gib, NodeID: "node-a"})
	b := smallWS
	b.Volumes = []api.VolumeAttach{{Volume: "on-b", Path: "/b"}, {Volume: "on-a", Path: "/a"}}
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, b, withCommand("c2")); !strings.Contains(err.Message, "no node reaches both") {
		t.Errorf("objects of two nodes: %v", err)
	}
}

// Isolate releases the use right of the Volumes the node held and fails
// its Volume commands; a Volume of a standalone pool then waits for a
// member to delete its file; drain counts held Volumes.
func TestIsolateReleasesVolumes(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.createVolume("v1", dataVol)
	w := h.running("c1", mountWS("data"))
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-a"})
	if st := h.node("node-a").Status; st != api.NodeDraining {
		t.Fatalf("status %s with a running Workspace and held Volumes", st)
	}
	h.fail(api.CodeFailedPrecondition, OpVolumeCreate, VolumeCreateArgs{Name: "late", SizeBytes: gib, NodeID: "node-a"}, withCommand("v2"))
	h.closeSession("node-a", sessOf("node-a"))
	h.advance(time.Second)
	res := decode[api.IsolateResult](t, h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"}))
	if res.VolumesReleased != 2 || res.RetainedLayersReleased != 1 || res.WorkspacesFailed != 1 {
		t.Fatalf("isolate result %+v", res)
	}
	if v := h.vol("data"); v.Held || v.WorkspaceID != w.WorkspaceID {
		t.Errorf("after isolate %+v", v)
	}
	checkIndex(t, h.f)
	// The Workspace is deleted: its Volumes are free, their files stay
	// in node-a's pool until a member can remove them.
	h.advance(time.Second)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.advance(time.Second)
	if v := decode[api.Volume](t, h.ok(OpVolumeDelete, VolumeArgs{Volume: "data"})); v.State != api.VolumeDeleting || v.Pending != nil || v.DeleteWaitsForPool != "node-a:default" {
		t.Fatalf("delete after isolate: %+v", v)
	}
	// node-a comes back with a new incarnation: the waiting deletes go to it.
	h.open("node-a", "s-back", 2)
	h.report("node-a", "s-back", poolReport("", 0))
	if got := h.volumeTasks("node-a"); strings.Join(got, " ") != "data:delete" {
		t.Errorf("tasks after node-a came back: %v", got)
	}
	checkIndex(t, h.f)
}

func TestIsolateFailsVolumeCommands(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.advance(time.Second)
	h.ok(OpVolumeCreate, dataVol, withCommand("v1"))
	h.closeSession("node-a", sessOf("node-a"))
	res := decode[api.IsolateResult](t, h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"}))
	if res.CommandsFailed != 1 {
		t.Errorf("isolate result %+v", res)
	}
	v := h.vol("data")
	if v.State != api.VolumeFailed || v.Pending != nil || !strings.Contains(v.Error, "isolated") {
		t.Fatalf("create pending on an isolated node: %+v", v)
	}
	// The file may be there: its delete waits for a member of the pool.
	h.advance(time.Second)
	if v := decode[api.Volume](t, h.ok(OpVolumeDelete, VolumeArgs{Volume: "data"})); v.DeleteWaitsForPool != "node-a:default" {
		t.Errorf("delete %+v", v)
	}
}

func TestDeclareLostEndsVolumes(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.report("node-a", sessOf("node-a"), poolReport("", gib, usbPool))
	h.poolCapacity("usb", 10*gib)
	h.createVolume("v1", VolumeCreateArgs{Name: "data", SizeBytes: gib, PoolID: "usb"})
	a := smallWS
	a.Volumes = []api.VolumeAttach{{Volume: "data", Path: "/data"}}
	w := h.running("c1", a)
	h.report("node-a", sessOf("node-a"), poolReport("", gib)) // usb gone from its config
	if err := h.fail(api.CodeFailedPrecondition, OpPoolDeclareLost, PoolDeclareLostArgs{PoolID: "usb", ConfirmDataLost: true}); !strings.Contains(err.Message, "volume data") {
		t.Errorf("declare-lost with the Volume held: %v", err)
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	res := decode[api.PoolLostResult](t, h.ok(OpPoolDeclareLost, PoolDeclareLostArgs{PoolID: "usb", ConfirmDataLost: true}))
	if res.Volumes != 1 || len(res.Workspaces) != 1 || res.Workspaces[0] != w.WorkspaceID {
		t.Fatalf("result %+v", res)
	}
	if v := h.vol("data"); v.State != api.VolumeLost {
		t.Fatalf("volume %+v", v)
	}
	h.advance(time.Second)
	if err := h.fail(api.CodeFailedPrecondition, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID}); !strings.Contains(err.Message, "volume data was lost") {
		t.Errorf("start with a lost volume: %v", err)
	}
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if v := decode[api.Volume](t, h.ok(OpVolumeDelete, VolumeArgs{Volume: "data"})); v.DeletedAt == nil {
		t.Errorf("delete of a lost volume waited: %+v", v)
	}
	checkIndex(t, h.f)
}

// The leader records each ctrl member's feature level; an op above a
// voter's level is refused for it; a member without a record is level 1.
func TestMemberLevels(t *testing.T) {
	h := newHarness(t)
	twoNodes(h) // node-b has the node role only
	h.fail(api.CodeInvalidArgument, OpMemberLevel, MemberLevelArgs{NodeID: ctrlID, Level: 0})
	h.fail(api.CodeNotFound, OpMemberLevel, MemberLevelArgs{NodeID: "nobody", Level: 2})
	h.fail(api.CodeFailedPrecondition, OpMemberLevel, MemberLevelArgs{NodeID: "node-b", Level: 2})
	h.ok(OpMemberLevel, MemberLevelArgs{NodeID: ctrlID, Level: FeatureLevel, Release: "v0.2.0"}, withIgnoreUnknown())
	var levels []MemberLevel
	h.f.View(func(tx *bolt.Tx) (err error) { levels, err = MemberLevels(tx, []string{ctrlID, "ctrl-2"}); return })
	if len(levels) != 2 || levels[0].Level != FeatureLevel || levels[0].Release != "v0.2.0" || levels[1].NodeID != "ctrl-2" || levels[1].Level != 1 {
		t.Fatalf("levels %+v", levels)
	}
	if err := CheckOpLevel(OpWorkspaceCreate, levels); err != nil {
		t.Errorf("a level-1 op: %v", err)
	}
	err := CheckOpLevel(OpVolumeCreate, levels)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "voter ctrl-2 runs a build from before feature levels at level 1") {
		t.Errorf("a level-2 op with a level-1 voter: %v", err)
	}
	if err := CheckOpLevel(OpVolumeCreate, levels[:1]); err != nil {
		t.Errorf("a level-2 op with every voter at level 2: %v", err)
	}
}
