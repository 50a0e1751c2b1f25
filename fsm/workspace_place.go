package fsm

import (
	"sort"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
)

func validateCreate(a *WorkspaceCreateArgs) error {
	if err := api.ValidTemplateName(a.Template); err != nil {
		return err
	}
	if a.CPU <= 0 || a.CPU > MaxWorkspaceCPU || a.CPU%1000 != 0 {
		return api.Errorf(api.CodeInvalidArgument, "--cpu %s is not valid: give a whole number of cores from 1 to %s", a.CPU, MaxWorkspaceCPU)
	}
	if a.MemoryBytes < MinWorkspaceMemory {
		return api.Errorf(api.CodeInvalidArgument, "--memory %d bytes is too small: give at least 64MiB", a.MemoryBytes)
	}
	if a.MemoryBytes%(1<<20) != 0 {
		return api.Errorf(api.CodeInvalidArgument, "--memory %d bytes is not a whole number of MiB", a.MemoryBytes)
	}
	if err := validateVolumeMounts(a); err != nil {
		return err
	}
	if len(a.Labels) > 64 {
		return api.Errorf(api.CodeInvalidArgument, "%d labels given: at most 64", len(a.Labels))
	}
	// Sorted, not map order: every replica must give the same error.
	keys := make([]string, 0, len(a.Labels))
	for k := range a.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := a.Labels[k]
		if !labelKeyPattern.MatchString(k) {
			return api.Errorf(api.CodeInvalidArgument, "label key %q is not valid: use letters, digits, '.', '_', '/' or '-', at most 63, starting and ending with a letter or digit", k)
		}
		if len(v) > 253 {
			return api.Errorf(api.CodeInvalidArgument, "label %s has a value of %d bytes: at most 253", k, len(v))
		}
	}
	return nil
}

// candidateView is a node as placement sees it, nil for a node without the
// node role: allocations are raised to what ctrl itself has placed there
// but the node has not reported yet, read from the node's holds (holds;
// placeCache reuses their decode).
func candidateView(d api.OvercommitDefault, n *api.Node, holds func() (Holds, error)) (*api.Node, error) {
	if !n.HasRole(api.RoleNode) {
		return nil, nil
	}
	h, err := holds()
	if err != nil {
		return nil, err
	}
	vn := viewWithHolds(d, n, h)
	if vn.Report != nil {
		r := *vn.Report
		r.Allocated.CPU = max(r.Allocated.CPU, h.Allocated.CPU)
		r.Allocated.MemoryBytes = max(r.Allocated.MemoryBytes, h.Allocated.MemoryBytes)
		vn.Report = &r
	}
	return vn, nil
}

// place chooses the node of w's next execution. The node must reach the
// pool of every object the Workspace has (its retained layer and
// Volumes); an object in a standalone pool pins it to the node that made
// the object, unless the pool moved; new objects (the first start's layer
// and Volumes made along with it) go to the node's default pool, which
// must have room. refused are the nodes that refused this placement
// (drained, memory tight by their own account); with refusalExhausts
// (WorkspaceResultArgs.RefusalExhausts) a Workspace that only one of them
// can start has no room, as when ctrl knows that node is full.
func place(ac *applyCtx, w *api.Workspace, vols []*api.Volume, pin string, refused []string, refusalExhausts bool) (string, error) {
	req := placement.Request{CPU: w.CPU, MemoryBytes: w.MemoryBytes, Node: pin, Exclude: refused, Template: w.Template}
	// A published template may start on a node that fetches it first.
	// Only builds from LevelArtifacts on have catalog entries, so older
	// voters place as before.
	pub, err := getRecord[catalogRecord](ac.tx, bucketTemplates, []byte(w.Template))
	if err != nil {
		return "", err
	}
	req.Published = pub != nil
	if w.Layer != nil && w.Layer.Lost {
		return "", lostLayerError(w)
	}
	fresh := newVolumes(w, vols)
	subject, layer := placeSubject(w)
	var objs []placedObject
	if w.Layer != nil {
		objs = append(objs, placedObject{what: layer, pool: api.LayerPoolID(w.Layer), shared: w.Layer.Shared, maker: w.Layer.NodeID})
	}
	for _, v := range vols {
		switch {
		case v.State == api.VolumeLost:
			return "", api.Errorf(api.CodeFailedPrecondition, "workspace %s: its volume %s was lost with storage pool %s (declare-lost); it cannot start with it, delete the Workspace with kibo workspace delete %s",
				w.WorkspaceID, v.Name, v.PoolID, w.WorkspaceID)
		case v.Pending != nil:
			return "", api.Errorf(api.CodeFailedPrecondition, "%s: %s", subject, volumeBusy(v).Message)
		case containsVolume(fresh, v):
			continue
		}
		objs = append(objs, placedObject{what: "its volume " + v.Name, pool: v.PoolID, shared: v.Shared, maker: v.NodeID})
	}
	var pinnedBy *placedObject
	for i := range objs {
		o := &objs[i]
		if !containsString(req.Pools, o.pool) {
			req.Pools = append(req.Pools, o.pool)
		}
		if o.shared {
			continue
		}
		// In a standalone pool only the node that made it can use it,
		// unless the pool has moved: then the members it has now.
		moved, err := poolMoved(ac.tx, o.pool, o.maker)
		if err != nil {
			return "", err
		}
		if moved {
			continue
		}
		switch {
		case pin != "" && pin != o.maker:
			// A typo in --node is "not registered", not "cannot reach".
			// (Only the error differs: this refusal was never counted
			// as a placement, on any build.)
			if _, err := mustNode(ac.tx, pin); err != nil {
				return "", err
			}
			return "", api.Errorf(api.CodeFailedPrecondition,
				"%s: %s is in pool %s of node %s, which node %s cannot reach; start it on %s", subject, o.what, o.pool, o.maker, pin, o.maker)
		case pinnedBy != nil && pinnedBy.maker != o.maker:
			return "", api.Errorf(api.CodeFailedPrecondition,
				"%s: %s is in standalone pool %s of node %s and %s in standalone pool %s of node %s: no node reaches both",
				subject, pinnedBy.what, pinnedBy.pool, pinnedBy.maker, o.what, o.pool, o.maker)
		}
		pinnedBy = o
		req.Node = o.maker
	}
	if s := w.Snapshot; s != nil && !s.Discarded {
		// Only a node whose VMM can restore the snapshot resumes it.
		req.Room = resumeRoom(s)
	}
	if w.Layer == nil {
		// New objects go to the node's default pool, which must have room.
		req.OwnDefaultPool = true
		req.Room = func(n *api.Node) string {
			pool := api.DefaultPoolOf(n.NodeID, n.Report)
			return defaultPoolRoom(ac.tx, n, newBytes(fresh, pool, templateBytes(n, w.Template, pub)))
		}
	}
	if pin != "" {
		// candidates leaves out nodes without the node role; say so rather
		// than "not registered".
		if n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(pin)); err != nil {
			return "", err
		} else if n != nil && !n.HasRole(api.RoleNode) {
			return "", api.Errorf(api.CodeFailedPrecondition, "node %s has no node role and runs no Workspaces; --node never places elsewhere", pin)
		}
	}
	nodes, cands, err := ac.cache.candidates(ac.tx)
	if err != nil {
		return "", err
	}
	d := placement.DecideAmong(cands, req)
	ac.tally.add(d)
	node, err := d.Node, d.Err
	if err != nil && api.CodeOf(err) == api.CodeResourceExhausted && !req.Published && anyReported(nodes) && !anyHasTemplate(nodes, w.Template) {
		return "", api.Errorf(api.CodeFailedPrecondition,
			"template %s is not built on any node: build it there with kibotos template build %s (kibo node get NODE lists a node's templates)", w.Template, w.Template)
	}
	if err != nil && pin == "" && pinnedBy != nil && api.CodeOf(err) == api.CodeFailedPrecondition {
		// An object pinned it, not --node: say so and what would help.
		why := strings.TrimSuffix(strings.TrimPrefix(err.Error(), "node "+req.Node+" cannot take this Workspace: "), "; --node never places elsewhere")
		if refusalExhausts && placement.Refused(why) {
			return "", api.Errorf(api.CodeResourceExhausted,
				"%s: %s is in standalone pool %s of node %s, the only node that can start it, which refused it; retry once %s takes new Workspaces again, or move the pool's disk to another host that declares %s",
				subject, pinnedBy.what, pinnedBy.pool, req.Node, req.Node, pinnedBy.pool)
		}
		if placement.ForRoom(why) {
			// The node is there but full: waiting for it to come back
			// would not help, freeing room on it does.
			return "", api.Errorf(api.CodeResourceExhausted,
				"%s: %s is in standalone pool %s of node %s, the only node that can start it, which has no room for it now: %s; free room on %s (stop, pause or delete a Workspace there) and retry, or move the pool's disk to another host that declares %s",
				subject, pinnedBy.what, pinnedBy.pool, req.Node, why, req.Node, pinnedBy.pool)
		}
		return "", api.Errorf(api.CodeFailedPrecondition,
			"%s: %s is in standalone pool %s of node %s, the only node that can start it, which cannot now: %s; start it once %s is back, or move the pool's disk to another host that declares %s",
			subject, pinnedBy.what, pinnedBy.pool, req.Node, why, req.Node, pinnedBy.pool)
	}
	return node, err
}

// placeSubject names w and its writable layer in placement errors. A
// Workspace being created (version 0) has an id its user has not seen
// yet, and a fork's layer is made in the pool of the layer it forks.
func placeSubject(w *api.Workspace) (subject, layer string) {
	switch {
	case w.Version > 0:
		return "workspace " + w.WorkspaceID, "its writable layer"
	case w.ForkedFrom != "":
		return "a fork of workspace " + w.ForkedFrom, "the layer it forks"
	default:
		return "the new workspace", "its writable layer"
	}
}

// placedObject is an object of a Workspace that already has a pool.
type placedObject struct {
	what, pool string
	shared     bool
	maker      string
}

func containsVolume(vols []*api.Volume, v *api.Volume) bool {
	for _, x := range vols {
		if x.VolumeID == v.VolumeID {
			return true
		}
	}
	return false
}

func anyReported(nodes []api.Node) bool {
	for i := range nodes {
		if nodes[i].Report != nil {
			return true
		}
	}
	return false
}

func anyHasTemplate(nodes []api.Node, name string) bool {
	for i := range nodes {
		if placement.HasTemplate(&nodes[i], name) {
			return true
		}
	}
	return false
}

// beginExecution records a new Instance of w on node and the start
// command. A new layer and the new Volumes go to the node's default pool;
// the use right of objects in a shared pool moves with the execution.
func beginExecution(ac *applyCtx, w *api.Workspace, vols []*api.Volume, node, state string) error {
	var fresh []*api.Volume
	if w.Layer == nil {
		n, err := viewNode(ac, node)
		if err != nil {
			return err
		}
		pool := api.DefaultPoolOf(node, n.Report)
		pub, err := getRecord[catalogRecord](ac.tx, bucketTemplates, []byte(w.Template))
		if err != nil {
			return err
		}
		size := templateBytes(n, w.Template, pub)
		fresh = newVolumes(w, vols)
		what := "the writable layer of workspace " + w.WorkspaceID
		if len(fresh) > 0 {
			what += " and its new Volumes"
		}
		rec, err := poolRoom(ac.tx, pool, what, newBytes(fresh, pool, size))
		if err != nil {
			return err
		}
		w.Layer = &api.LayerRight{PoolID: pool, Shared: rec.Shared, SizeBytes: size}
		// Every check is done: the writes begin.
		if err := homeNewVolumes(ac, fresh, node, pool, rec.Shared); err != nil {
			return err
		}
	}
	// The use right goes with the execution (a layer in a shared or moved
	// pool may start on another member); putWorkspace hands it to the
	// Volumes.
	w.Layer.NodeID = node
	w.Instances++
	w.NodeID = node
	w.InstanceID = instanceIDFor(w.WorkspaceID, w.Instances)
	if err := ac.tx.Bucket(bucketInstanceOwners).Put([]byte(w.InstanceID), []byte(w.WorkspaceID)); err != nil {
		return err
	}
	w.State = state
	w.Failure = nil
	w.StopUnconfirmed = false
	w.Layer.Held = true
	setPending(ac.e, w, api.WSCmdStart, nil)
	return nil
}

// setPending records the command the node must execute next. Its id names
// the Workspace version it was issued at, so a late answer to an older
// command is recognised and ignored.
func setPending(e *Entry, w *api.Workspace, kind string, refused []string) {
	node := w.NodeID
	if node == "" && w.Layer != nil {
		node = w.Layer.NodeID
	}
	w.Pending = &api.WorkspaceCommand{
		Kind: kind, CommandID: w.WorkspaceID + "/" + strconv.FormatUint(w.Version+1, 10),
		NodeID: node, InstanceID: w.InstanceID, IssuedAt: *at(e), Refused: refused,
	}
}
