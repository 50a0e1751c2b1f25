package fsm

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl/placement"
)

// A Workspace's executions are commands ctrl sends to a node: the FSM
// records the command as Pending, the leader delivers it over the node's
// control session, and the node's answer comes back as OpWorkspaceResult.
// Placement runs inside the apply (placement is a pure function of the
// records), so two creates racing for the last room on a node cannot both
// win it.

// WorkspaceCreateArgs creates a Workspace and places its first execution.
// The Workspace id is derived from the entry's command id, so a retry of
// the same command names the same Workspace.
type WorkspaceCreateArgs struct {
	Template    string            `json:"template"`
	CPU         api.Milli         `json:"cpu"`
	MemoryBytes uint64            `json:"memory_bytes"`
	Labels      map[string]string `json:"labels,omitempty"`
	NodeID      string            `json:"node_id,omitempty"`
	// Network is the policy asked for; nil: egress none.
	Network *api.NetworkPolicy `json:"network,omitempty"`
	// Volumes to attach, and NewVolumes to make along with it.
	Volumes    []api.VolumeAttach `json:"volumes,omitempty"`
	NewVolumes []api.NewVolume    `json:"new_volumes,omitempty"`
	// Import (transfer import; ctrl sends it only at LevelArtifacts) is
	// the archive the first start unpacks into the layer and NewVolumes.
	Import *api.WorkspaceImport `json:"import,omitempty"`
	// From (LevelForks: the leader sends it only when every voter reaches
	// it) forks this PAUSED Workspace (forks.go): Template, CPU and
	// MemoryBytes are the source's and may be left out.
	From string `json:"from,omitempty"`
}

// WorkspaceArgs names a Workspace, with the options of start and stop.
type WorkspaceArgs struct {
	WorkspaceID string `json:"workspace_id"`
	NodeID      string `json:"node_id,omitempty"` // start: pin to this node
	Force       bool   `json:"force,omitempty"`   // stop --force
}

// Outcomes of a node's answer to a Workspace command (the protocol's).
const (
	OutcomeOK      = api.OutcomeOK
	OutcomeRefused = api.OutcomeRefused
	OutcomeFailed  = api.OutcomeFailed
)

// WorkspaceResultArgs is a node's answer to the pending command, sent
// through its live control session.
type WorkspaceResultArgs struct {
	NodeID      string `json:"node_id"`
	SessionID   string `json:"session_id"`
	WorkspaceID string `json:"workspace_id"`
	CommandID   string `json:"command_id"`
	Outcome     string `json:"outcome"`
	Error       string `json:"error,omitempty"`
	// Pause and resume answers (see api.WorkspaceTaskResult).
	Snapshot     *api.SnapshotReport `json:"snapshot,omitempty"`
	InstanceGone bool                `json:"instance_gone,omitempty"`
	// NotOnNode (stop --force, set by a leader whose voters all reach
	// LevelTroubleshooting): the node did not have the Instance.
	NotOnNode         bool `json:"not_on_node,omitempty"`
	SnapshotDiscarded bool `json:"snapshot_discarded,omitempty"`
	// RefusalExhausts (a refused start, set by a leader whose voters all
	// reach LevelRefusalExhausted): a Workspace no other node can take
	// has no room anywhere, and ends FAILED with reason
	// RESOURCE_EXHAUSTED (the CLI's resource_exhausted), also when the
	// only node that reaches its standalone pool refused it. Without it
	// such a refusal ends START_FAILED, as older builds apply it.
	RefusalExhausts bool `json:"refusal_exhausts,omitempty"`
	// Platform (start ok, set by a leader whose voters all reach
	// LevelArtifacts) is the Platform the Instance runs on.
	Platform string `json:"platform,omitempty"`
	// Report (set by a leader whose voters all reach
	// LevelResultReports) is the full report the node sent with this
	// result, which it owes after every task: it is stored right after
	// the result, in the same entry, as a report entry of its own would
	// be. Below the level it is an entry of its own.
	Report *ReportArgs `json:"report,omitempty"`
}

// ResultReport is the outcome of a result that carried its node's
// report: the result's own outcome, then the report's, or why the report
// was not stored (it wrote nothing; the result stands).
type ResultReport struct {
	Result      any           `json:"result"`
	Report      *ReportResult `json:"report,omitempty"`
	ReportError *api.Error    `json:"report_error,omitempty"`
}

// DefaultPool is the pool a node creates retained layers in.
const DefaultPool = "default"

var (
	labelKeyPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$`)
	idEncoding      = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
)

// Limits of one Workspace.
const (
	MinWorkspaceMemory = 64 << 20
	MaxWorkspaceCPU    = api.Milli(64000)
)

// WorkspaceIDFor derives the Workspace id a create with this command id makes.
func WorkspaceIDFor(commandID string) string {
	return "ws-" + hashID("workspace\x00"+commandID)
}

func hashID(s string) string {
	h := sha256.Sum256([]byte(s))
	return idEncoding.EncodeToString(h[:])[:26]
}

func wsKey(id string) []byte { return []byte(id) }

// wsNodeKey indexes a Workspace under a node it occupies (its execution or
// its held layer), so per-node questions do not scan every Workspace.
func wsNodeKey(node, ws string) []byte { return []byte(node + "\x00" + ws) }

func getWorkspace(tx *bolt.Tx, id string) (*api.Workspace, error) {
	return getRecord[api.Workspace](tx, bucketWorkspaces, wsKey(id))
}

func mustWorkspace(tx *bolt.Tx, id string) (*api.Workspace, error) {
	w, err := getWorkspace(tx, id)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, api.Errorf(api.CodeNotFound, "workspace %s does not exist: check the id with kibo workspace list --all", id)
	}
	return w, nil
}

// occupied lists the nodes a Workspace occupies, for the node index.
func occupied(w *api.Workspace) []string {
	var out []string
	if w.NodeID != "" {
		out = append(out, w.NodeID)
	}
	if w.Layer != nil && w.Layer.Held && w.Layer.NodeID != w.NodeID {
		out = append(out, w.Layer.NodeID)
	}
	// A command waits for its node (e.g. delete of a stopped Workspace's layer).
	if w.Pending != nil && w.Pending.NodeID != "" && !containsString(out, w.Pending.NodeID) {
		out = append(out, w.Pending.NodeID)
	}
	return out
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// putWorkspace stores w with a new version and keeps every record
// derived from it in step with what it held before (old, nil for a new
// Workspace).
func putWorkspace(tx *bolt.Tx, e *Entry, old, w *api.Workspace) error {
	if err := moveDerived(tx, e, old, w); err != nil {
		return err
	}
	w.Version++
	w.UpdatedAt = *at(e)
	return putJSON(tx, bucketWorkspaces, wsKey(w.WorkspaceID), w)
}

// workspaceDerived are the records kept in step with a Workspace's: each
// moves what old held to what w holds (old nil: a new Workspace; w nil: a
// deleted one).
var workspaceDerived = []func(tx *bolt.Tx, e *Entry, old, w *api.Workspace) error{
	moveNodeIndex,
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return movePending(tx, old, w) },
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return moveHolds(tx, old, w) },
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return movePoolUse(tx, old, w) },
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return movePoolWait(tx, old, w) },
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return moveRefs(tx, old, w) },
	func(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error { return moveForks(tx, old, w) },
	syncVolumes,
}

// moveDerived moves every record derived from old to w.
func moveDerived(tx *bolt.Tx, e *Entry, old, w *api.Workspace) error {
	for _, move := range workspaceDerived {
		if err := move(tx, e, old, w); err != nil {
			return err
		}
	}
	return nil
}

// moveNodeIndex moves the Workspace's entries of the nodes it occupies.
func moveNodeIndex(tx *bolt.Tx, _ *Entry, old, w *api.Workspace) error {
	idx := tx.Bucket(bucketWorkspaceNodes)
	if old != nil {
		for _, n := range occupied(old) {
			if err := idx.Delete(wsNodeKey(n, old.WorkspaceID)); err != nil {
				return err
			}
		}
	}
	if w != nil {
		for _, n := range occupied(w) {
			if err := idx.Put(wsNodeKey(n, w.WorkspaceID), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// cloneWorkspace copies w deeply enough that changing the copy's Layer,
// Pending or Snapshot does not change w: putWorkspace needs the old record as it was to
// remove its node index entries.
func cloneWorkspace(w *api.Workspace) *api.Workspace {
	c := *w
	if w.Layer != nil {
		l := *w.Layer
		c.Layer = &l
	}
	if w.Pending != nil {
		p := *w.Pending
		c.Pending = &p
	}
	if w.Snapshot != nil {
		// Discarded changes in place; moveForks compares before and after.
		s := *w.Snapshot
		c.Snapshot = &s
	}
	c.Volumes = append([]api.VolumeMount(nil), w.Volumes...)
	return &c
}

func deleteWorkspace(tx *bolt.Tx, e *Entry, w *api.Workspace) error {
	if err := moveDerived(tx, e, w, nil); err != nil {
		return err
	}
	if err := tx.Bucket(bucketWorkspaceTombstones).Put(wsKey(w.WorkspaceID), []byte(at(e).Format(time.RFC3339))); err != nil {
		return err
	}
	return tx.Bucket(bucketWorkspaces).Delete(wsKey(w.WorkspaceID))
}

// workspacesOnNode returns the Workspaces a node occupies, by id.
func workspacesOnNode(tx *bolt.Tx, node string) ([]*api.Workspace, error) {
	return workspacesIndexed(tx, bucketWorkspaceNodes, node)
}

// workspacesIndexed returns the Workspaces a node-keyed index (node_id
// NUL workspace_id) lists under node, by id.
func workspacesIndexed(tx *bolt.Tx, index []byte, node string) ([]*api.Workspace, error) {
	var out []*api.Workspace
	prefix := []byte(node + "\x00")
	records := tx.Bucket(bucketWorkspaces)
	c := tx.Bucket(index).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		key := wsKey(string(k[len(prefix):]))
		raw := records.Get(key)
		if raw == nil {
			continue
		}
		var w api.Workspace
		if err := jsonRecord(bucketWorkspaces, key, raw, &w); err != nil {
			return nil, err
		}
		out = append(out, &w)
	}
	return out, nil
}

// Holds is what ctrl's records say a node holds for Workspaces.
type Holds struct {
	Instances int           `json:"instances"`
	Layers    int           `json:"layers"`
	Volumes   int           `json:"volumes,omitempty"`
	Allocated api.Resources `json:"allocated"`
}

// nodeHolds reads the node's counters, kept by moveHolds on every
// Workspace write (O(1): node lists and placement read it per node).
func nodeHolds(tx *bolt.Tx, node string) (Holds, error) {
	var h Holds
	_, err := getJSON(tx, bucketNodeHolds, []byte(node), &h)
	return h, err
}

// holdsOf is what w holds on node.
func holdsOf(w *api.Workspace, node string) Holds {
	var h Holds
	if w == nil {
		return h
	}
	if w.NodeID == node && w.InstanceID != "" {
		h.Instances++
		h.Allocated.CPU += w.CPU
		h.Allocated.MemoryBytes += w.MemoryBytes
	}
	if w.Layer != nil && w.Layer.Held && w.Layer.NodeID == node {
		h.Layers++
		h.Volumes += len(attachedVolumes(w))
	}
	return h
}

// moveHolds replaces old's contribution to the node counters by w's (either
// may be nil) and marks the nodes whose counters changed for placement.
func moveHolds(tx *bolt.Tx, old, w *api.Workspace) error {
	var nodes []string
	for _, x := range []*api.Workspace{old, w} {
		for _, n := range nodesOf(x) {
			if !containsString(nodes, n) {
				nodes = append(nodes, n)
			}
		}
	}
	for _, n := range nodes {
		before, after := holdsOf(old, n), holdsOf(w, n)
		if before == after {
			continue
		}
		h, err := nodeHolds(tx, n)
		if err != nil {
			return err
		}
		h.Instances += after.Instances - before.Instances
		h.Layers += after.Layers - before.Layers
		h.Volumes += after.Volumes - before.Volumes
		h.Allocated.CPU += after.Allocated.CPU - before.Allocated.CPU
		h.Allocated.MemoryBytes += after.Allocated.MemoryBytes - before.Allocated.MemoryBytes
		if h == (Holds{}) {
			if err := tx.Bucket(bucketNodeHolds).Delete([]byte(n)); err != nil {
				return err
			}
		} else if err := putJSON(tx, bucketNodeHolds, []byte(n), h); err != nil {
			return err
		}
		markNodeChanged(tx, n)
	}
	return nil
}

// nodesOf lists the nodes w (may be nil) holds anything on, once each.
func nodesOf(w *api.Workspace) []string {
	if w == nil {
		return nil
	}
	var out []string
	for _, n := range []string{w.NodeID, layerHolder(w)} {
		if n != "" && !containsString(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func layerHolder(w *api.Workspace) string {
	if w.Layer != nil && w.Layer.Held {
		return w.Layer.NodeID
	}
	return ""
}

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

// candidates returns every node as placement sees it, with allocations
// raised to what ctrl itself has placed there but the node has not
// reported yet, and the nodes' placement.Candidates.
func candidates(tx *bolt.Tx) ([]api.Node, []placement.Candidate, error) {
	if c := cacheFor(tx); c != nil {
		return c.candidates(tx)
	}
	d, err := getOvercommitDefault(tx)
	if err != nil {
		return nil, nil, err
	}
	var out []api.Node
	err = tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
		var n api.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return fmt.Errorf("state record nodes/%s is corrupt: %w", k, err)
		}
		vn, err := candidateView(tx, d, &n)
		if err != nil || vn == nil {
			return err
		}
		out = append(out, *vn)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, placement.Candidates(out), nil
}

// candidateView is a node as placement sees it, nil for a node without the
// node role: allocations are raised to what ctrl itself has placed there
// but the node has not reported yet.
func candidateView(tx *bolt.Tx, d api.OvercommitDefault, n *api.Node) (*api.Node, error) {
	return candidateViewWith(d, n, func() (Holds, error) { return nodeHolds(tx, n.NodeID) })
}

// candidateViewWith is candidateView with the node's holds read by holds
// (placeCache reuses their decode).
func candidateViewWith(d api.OvercommitDefault, n *api.Node, holds func() (Holds, error)) (*api.Node, error) {
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
func place(tx *bolt.Tx, e *Entry, w *api.Workspace, vols []*api.Volume, pin string, refused []string, refusalExhausts bool) (string, error) {
	req := placement.Request{CPU: w.CPU, MemoryBytes: w.MemoryBytes, Node: pin, Exclude: refused, Template: w.Template}
	// A published template may start on a node that fetches it first.
	// Only builds from LevelArtifacts on have catalog entries, so older
	// voters place as before.
	pub, err := catalogEntry(tx, w.Template)
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
		moved, err := poolMoved(tx, o.pool, o.maker)
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
			if _, err := mustNode(tx, pin); err != nil {
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
			return defaultPoolRoom(tx, n, newBytes(fresh, pool, templateBytes(n, w.Template, pub)))
		}
	}
	if pin != "" {
		// candidates leaves out nodes without the node role; say so rather
		// than "not registered".
		if n, err := getNode(tx, pin); err != nil {
			return "", err
		} else if n != nil && !n.HasRole(api.RoleNode) {
			return "", api.Errorf(api.CodeFailedPrecondition, "node %s has no node role and runs no Workspaces; --node never places elsewhere", pin)
		}
	}
	nodes, cands, err := candidates(tx)
	if err != nil {
		return "", err
	}
	d := placement.DecideAmong(cands, req)
	e.tally.add(d)
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
func beginExecution(tx *bolt.Tx, e *Entry, w *api.Workspace, vols []*api.Volume, node, state string) error {
	var fresh []*api.Volume
	if w.Layer == nil {
		n, err := viewNode(tx, node)
		if err != nil {
			return err
		}
		pool := api.DefaultPoolOf(node, n.Report)
		pub, err := catalogEntry(tx, w.Template)
		if err != nil {
			return err
		}
		size := templateBytes(n, w.Template, pub)
		fresh = newVolumes(w, vols)
		what := "the writable layer of workspace " + w.WorkspaceID
		if len(fresh) > 0 {
			what += " and its new Volumes"
		}
		rec, err := poolRoom(tx, pool, what, newBytes(fresh, pool, size))
		if err != nil {
			return err
		}
		w.Layer = &api.LayerRight{PoolID: pool, Shared: rec.Shared, SizeBytes: size}
		// Every check is done: the writes begin.
		if err := homeNewVolumes(tx, e, fresh, node, pool, rec.Shared); err != nil {
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
	if err := tx.Bucket(bucketInstanceOwners).Put([]byte(w.InstanceID), []byte(w.WorkspaceID)); err != nil {
		return err
	}
	w.State = state
	w.Failure = nil
	w.StopUnconfirmed = false
	w.Layer.Held = true
	setPending(e, w, api.WSCmdStart, nil)
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

func applyWorkspaceCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a WorkspaceCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if e.CommandID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace create needs a command id (the Workspace id is derived from it)")
	}
	var src *api.Workspace
	if a.From != "" {
		var err error
		if src, err = forkOf(tx, &a); err != nil {
			return nil, err
		}
		a.Template, a.CPU, a.MemoryBytes = src.Template, src.CPU, src.MemoryBytes
	}
	if err := validateCreate(&a); err != nil {
		return nil, err
	}
	id := WorkspaceIDFor(e.CommandID)
	network, err := normalizeNetwork(tx, id, a.Network.Effective(), false)
	if err != nil {
		return nil, err
	}
	if old, err := getWorkspace(tx, id); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "workspace %s already exists: use a new --command-id", id)
	}
	if at := tx.Bucket(bucketWorkspaceTombstones).Get(wsKey(id)); at != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "workspace %s existed and was deleted at %s: use a new --command-id", id, at)
	}
	if a.Import != nil {
		if err := a.Import.Check(); err != nil {
			return nil, err
		}
	}
	w := &api.Workspace{WorkspaceID: id, Template: a.Template, CPU: a.CPU, MemoryBytes: a.MemoryBytes, Labels: a.Labels, Network: &network, CreatedAt: *at(e), Import: a.Import}
	var vols []*api.Volume
	if src != nil {
		if w, err = newFork(tx, e, id, &a, src); err != nil {
			return nil, err
		}
	} else {
		mounts, vs, err := workspaceVolumes(tx, e, id, &a)
		if err != nil {
			return nil, err
		}
		w.Volumes, vols = mounts, vs
	}
	node, err := place(tx, e, w, vols, a.NodeID, nil, false)
	if err != nil {
		return nil, err
	}
	if err := beginExecution(tx, e, w, vols, node, api.WorkspaceCreating); err != nil {
		return nil, err
	}
	if err := putWorkspace(tx, e, nil, w); err != nil {
		return nil, err
	}
	return w, nil
}

// workspaceWrite is the common frame of an operator write on one
// Workspace: decode, find it, check the expected version.
func workspaceWrite(tx *bolt.Tx, e *Entry) (*WorkspaceArgs, *api.Workspace, error) {
	var a WorkspaceArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, nil, err
	}
	w, err := mustWorkspace(tx, a.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	if err := checkVersion(e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, nil, err
	}
	return &a, w, nil
}

func applyWorkspaceStart(tx *bolt.Tx, e *Entry) (any, error) {
	a, w, err := workspaceWrite(tx, e)
	if err != nil {
		return nil, err
	}
	if err := notExporting(w, "start"); err != nil {
		return nil, err
	}
	if err := notForking(tx, w, "start"); err != nil {
		return nil, err
	}
	switch {
	case w.State == api.WorkspaceAvailable && (a.NodeID == "" || a.NodeID == w.NodeID):
		return w, nil // already running where asked
	case w.State == api.WorkspacePaused: // resumed
	case w.State == api.WorkspaceStopped:
	case w.State == api.WorkspaceFailed && w.InstanceID == "":
	case w.State == api.WorkspaceFailed:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is FAILED and its Instance %s still holds resources on node %s: run kibo workspace stop --force %s, then start it", w.WorkspaceID, w.InstanceID, w.NodeID, w.WorkspaceID)
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: start needs STOPPED or FAILED; stop it first", w.WorkspaceID, w.State)
	}
	old := cloneWorkspace(w)
	w.LastError = nil
	// A start uses the latest revision of the Egress its policy names.
	if err := latestEgressRevision(tx, w); err != nil {
		return nil, err
	}
	vols, err := loadVolumes(tx, w)
	if err != nil {
		return nil, err
	}
	node, err := place(tx, e, w, vols, a.NodeID, nil, false)
	if err != nil {
		return nil, err
	}
	if err := beginExecution(tx, e, w, vols, node, api.WorkspaceStarting); err != nil {
		return nil, err
	}
	if err := putWorkspace(tx, e, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func applyWorkspaceStop(tx *bolt.Tx, e *Entry) (any, error) {
	a, w, err := workspaceWrite(tx, e)
	if err != nil {
		return nil, err
	}
	if !a.Force {
		// stop --force still ends it: the export then fails.
		if err := notExporting(w, "stop"); err != nil {
			return nil, err
		}
	}
	if err := notForking(tx, w, "stop"); err != nil {
		return nil, err
	}
	old := cloneWorkspace(w)
	switch {
	case w.State == api.WorkspaceStopped:
		return w, nil
	case w.State == api.WorkspaceDeleting:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being deleted", w.WorkspaceID)
	case w.State == api.WorkspacePausing:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being paused: stop it once it is PAUSED (which discards the snapshot) or AVAILABLE again", w.WorkspaceID)
	case w.InstanceID == "":
		// Nothing runs (FAILED after its node was isolated, PAUSED):
		// stopping is only bookkeeping; a snapshot's files go with the
		// next start or the delete.
		w.State, w.Pending, w.Failure, w.LastError = api.WorkspaceStopped, nil, nil, nil
		if w.Snapshot != nil {
			w.Snapshot.Discarded = true
		}
	case a.Force:
		w.State = api.WorkspaceStopping
		setPending(e, w, api.WSCmdStopForce, nil)
	case w.State == api.WorkspaceAvailable:
		w.State = api.WorkspaceStopping
		setPending(e, w, api.WSCmdStop, nil)
	case w.State == api.WorkspaceStopping:
		return w, nil
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s: a normal stop needs AVAILABLE; wait for it, or end it now with kibo workspace stop --force %s", w.WorkspaceID, w.State, w.WorkspaceID)
	}
	if err := putWorkspace(tx, e, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func applyWorkspaceDelete(tx *bolt.Tx, e *Entry) (any, error) {
	_, w, err := workspaceWrite(tx, e)
	if err != nil {
		return nil, err
	}
	if err := notExporting(w, "delete"); err != nil {
		return nil, err
	}
	if err := notForking(tx, w, "delete"); err != nil {
		return nil, err
	}
	if w.State == api.WorkspaceDeleting {
		return w, nil
	}
	old := cloneWorkspace(w)
	if w.InstanceID == "" {
		// Nothing runs: its layer's files go with a node that reaches
		// their pool, or with nothing (never made, or lost with its pool).
		files, err := deleteFiles(tx, e, w, "")
		if err != nil {
			return nil, err
		}
		if !files {
			if err := deleteWorkspace(tx, e, old); err != nil {
				return nil, err
			}
			w.DeletedAt = at(e)
			return w, nil
		}
	} else {
		w.State = api.WorkspaceDeleting
		setPending(e, w, api.WSCmdDelete, nil)
	}
	if err := putWorkspace(tx, e, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

// notExporting refuses what of a Workspace an export reads from: its node
// copies the layer and Volumes as they are.
func notExporting(w *api.Workspace, what string) error {
	if w.Exporting == "" {
		return nil
	}
	return api.Errorf(api.CodeFailedPrecondition, "workspace %s is being exported (transfer %s): %s it once the Transfer is READY or FAILED (kibo transfer get %s)", w.WorkspaceID, w.Exporting, what, w.Exporting)
}

func layerNode(w *api.Workspace) string {
	if w.NodeID != "" {
		return w.NodeID
	}
	if w.Layer != nil {
		return w.Layer.NodeID
	}
	return ""
}

func applyWorkspaceResult(tx *bolt.Tx, e *Entry) (any, error) {
	var a WorkspaceResultArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if r := a.Report; r != nil && (r.NodeID != a.NodeID || r.SessionID != a.SessionID) {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace %s: a result of node %s (session %s) carries a report of node %s (session %s); a node sends only its own report with its results",
			a.WorkspaceID, a.NodeID, a.SessionID, r.NodeID, r.SessionID)
	}
	v, err := workspaceResult(tx, e, &a)
	if err != nil || a.Report == nil {
		return v, err
	}
	out := ResultReport{Result: v}
	rr, err := nodeReport(tx, e, a.Report)
	if ae, ok := err.(*api.Error); ok {
		out.ReportError = ae
	} else if err != nil {
		return nil, err
	} else {
		out.Report = &rr
	}
	return out, nil
}

// workspaceResult applies a node's answer to a Workspace's pending
// command.
func workspaceResult(tx *bolt.Tx, e *Entry, a *WorkspaceResultArgs) (any, error) {
	if a.Platform != "" {
		if err := api.ValidPlatformID(a.Platform); err != nil {
			return nil, err
		}
	}
	if err := checkSession(tx, a.NodeID, a.SessionID); err != nil {
		return nil, err
	}
	w, err := getWorkspace(tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if w == nil || w.Pending == nil || w.Pending.CommandID != a.CommandID || w.Pending.NodeID != a.NodeID {
		return map[string]bool{"applied": false}, nil // a late answer to a command ctrl no longer waits for
	}
	old := cloneWorkspace(w)
	p := w.Pending
	w.Pending = nil
	fail := func(reason, msg string) {
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: reason, Message: msg, At: *at(e)}
	}
	switch p.Kind {
	case api.WSCmdPause:
		pauseResult(e, w, p, a)
	case api.WSCmdStart:
		switch a.Outcome {
		case OutcomeOK:
			w.State = api.WorkspaceAvailable
			w.Snapshot = nil // restored (or its files removed by a fresh boot)
			if a.Platform != "" {
				w.Platform = a.Platform
			}
			w.Import = nil // unpacked into the layer and Volumes
			if err := volumesMade(tx, e, w); err != nil {
				return nil, err
			}
		case OutcomeRefused:
			// The node turned it away (drained, memory tight): place
			// elsewhere at once, unless the layer pins it there.
			refused := append(append([]string(nil), p.Refused...), a.NodeID)
			sort.Strings(refused)
			w.NodeID, w.InstanceID = "", ""
			if w.State == api.WorkspaceCreating && w.ForkedFrom == "" {
				// No start of a CREATING Workspace has succeeded, so no node
				// created its layer (also after earlier refusals). A fork's
				// layer right is its source's pool from the start.
				w.Layer = nil
			} else if w.Layer != nil {
				w.Layer.Held = false
			}
			vols, err := loadVolumes(tx, w)
			if err != nil {
				return nil, err
			}
			node, perr := place(tx, e, w, vols, "", refused, a.RefusalExhausts)
			if perr != nil {
				if w.Layer != nil {
					w.Layer.Held = false
				}
				if a.RefusalExhausts && api.CodeOf(perr) == api.CodeResourceExhausted {
					fail(api.FailureResourceExhausted, refusedEverywhere(w, refused, a, perr))
				} else {
					fail(api.FailureStart, fmt.Sprintf("node %s refused it (%s) and no other node can take it: %s", a.NodeID, a.Error, perr.Error()))
				}
				if forkSource(w) != "" {
					// Its source need not wait for it any longer.
					w.Snapshot.Discarded = true
				}
				break
			}
			state := w.State
			if err := beginExecution(tx, e, w, vols, node, state); err != nil {
				return nil, err
			}
			w.Pending.Refused = refused
		default:
			// The node removed what it had started; the layer stays.
			w.NodeID, w.InstanceID = "", ""
			if w.Layer != nil {
				w.Layer.Held = false
			}
			switch {
			case forkSource(w) != "":
				forkStartFailed(e, w, a)
			case !resumeFailed(e, w, a):
				fail(api.FailureStart, a.Error)
			}
		}
	case api.WSCmdStop, api.WSCmdStopForce:
		if a.Outcome != OutcomeOK {
			fail(api.FailureStop, a.Error) // still running: stop --force ends it
			break
		}
		if p.Kind == api.WSCmdStopForce && a.NotOnNode && w.Failure != nil {
			// The node no longer had the Instance: ctrl releases what it
			// held; the Workspace stays FAILED with its error and can be
			// started (as the seed's troubleshooting table says).
			w.State, w.NodeID, w.InstanceID, w.StopUnconfirmed = api.WorkspaceFailed, "", "", true
			if w.Layer != nil {
				w.Layer.Held = false
			}
			break
		}
		w.State, w.NodeID, w.InstanceID, w.Failure = api.WorkspaceStopped, "", "", nil
		w.StopUnconfirmed = p.Kind == api.WSCmdStopForce
		if w.Snapshot != nil {
			// A resume in flight stopped: its snapshot is not restored.
			w.Snapshot.Discarded = true
		}
		if w.Layer != nil {
			w.Layer.Held = false
		}
	case api.WSCmdNetwork:
		applyNetworkResult(e, w, p, a)
	case api.WSCmdDelete:
		if a.Outcome != OutcomeOK {
			fail(api.FailureStop, "delete: "+a.Error)
			break
		}
		if err := deleteWorkspace(tx, e, old); err != nil {
			return nil, err
		}
		return map[string]bool{"applied": true}, nil
	}
	if err := putWorkspace(tx, e, old, w); err != nil {
		return nil, err
	}
	return map[string]bool{"applied": true}, nil
}

// refusedEverywhere is why a Workspace whose start the nodes in refused
// turned away (a's node the last) has no node to run on: the nodes, the
// last one's reason, the placement's and what to do.
func refusedEverywhere(w *api.Workspace, refused []string, a *WorkspaceResultArgs, perr error) string {
	who, why := "node "+a.NodeID, a.Error
	if len(refused) > 1 {
		who, why = "nodes "+strings.Join(refused, ", "), a.NodeID+": "+cmp.Or(a.Error, "refused")
	}
	if why != "" {
		why = " (" + why + ")"
	}
	return fmt.Sprintf("%s refused to start it%s and no other node can take it: %s; nothing of it runs: kibo workspace start %s places it again, or delete it",
		who, why, perr.Error(), w.WorkspaceID)
}

// failEndedInstances fails AVAILABLE Workspaces whose Instance the node
// reports FAILED (its VMM ended without the node stopping it). With
// oomStops, one whose VMM host OOM killed is stopped instead: ctrl has the
// node end the Instance, and the Workspace ends STOPPED, startable (the
// overcommit section of the node-operations seed).
func failEndedInstances(tx *bolt.Tx, e *Entry, node string, states []api.InstanceState, oomStops bool) error {
	if len(states) == 0 {
		return nil
	}
	failed := map[string]string{}
	oom := map[string]bool{}
	for _, s := range states {
		if s.State == "FAILED" {
			failed[s.InstanceID] = s.Error
			oom[s.InstanceID] = s.OOMKilled && oomStops
		}
	}
	if len(failed) == 0 {
		return nil
	}
	ws, err := workspacesOnNode(tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		msg, ok := failed[w.InstanceID]
		if !ok || w.NodeID != node || w.State != api.WorkspaceAvailable {
			continue
		}
		old := cloneWorkspace(w)
		if msg == "" {
			msg = "node reports the Instance as no longer running"
		}
		dropNetworkChange(e, w, "instance "+w.InstanceID+" ended before node "+node+" applied the change")
		if oom[w.InstanceID] {
			w.State = api.WorkspaceStopping
			w.LastError = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: msg + "; ctrl stopped the Workspace: start it again", At: *at(e)}
			setPending(e, w, api.WSCmdStopForce, nil)
			if err := putWorkspace(tx, e, old, w); err != nil {
				return err
			}
			continue
		}
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: msg, Stage: api.FailureStage(msg), At: *at(e)}
		if err := putWorkspace(tx, e, old, w); err != nil {
			return err
		}
	}
	return nil
}

// releaseIsolated fails every Workspace of an isolated node with
// UNAVAILABLE and releases what it held there; it returns the counts.
func releaseIsolated(tx *bolt.Tx, e *Entry, node string, res *api.IsolateResult) error {
	ws, err := workspacesOnNode(tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		old := cloneWorkspace(w)
		if w.Pending != nil && w.Pending.NodeID == node {
			res.CommandsFailed++
			dropNetworkChange(e, w, "node "+node+" was isolated before it answered")
			w.Pending = nil
		}
		if w.Layer != nil && w.Layer.Held && w.Layer.NodeID == node {
			res.RetainedLayersReleased++
			res.VolumesReleased += len(attachedVolumes(w))
			w.Layer.Held = false
		}
		if w.State == api.WorkspaceDeleting && w.Pending == nil && w.DeleteWaitsForPool == "" {
			// Its delete waited for this node (running here, or the layer of
			// a stopped Workspace): the files go with another member of
			// their pool, or wait for one.
			w.NodeID, w.InstanceID = "", ""
			if files, err := deleteFiles(tx, e, w, node); err != nil {
				return err
			} else if !files {
				if err := deleteWorkspace(tx, e, old); err != nil {
					return err
				}
				continue
			}
		}
		if w.NodeID == node {
			w.NodeID, w.InstanceID = "", ""
			if w.State != api.WorkspaceStopped {
				res.WorkspacesFailed++
				w.State = api.WorkspaceFailed
				w.Failure = &api.WorkspaceFailure{Reason: api.FailureUnavailable,
					Message: "node " + node + " was isolated; start the Workspace again", At: *at(e)}
				w.StopUnconfirmed = true
			}
		}
		if err := putWorkspace(tx, e, old, w); err != nil {
			return err
		}
	}
	n, err := releaseVolumeCommands(tx, e, node, "was isolated")
	res.CommandsFailed += n
	return err
}

// releaseRetired hands the deletes waiting for a node being retired (it
// never answers) to another member of the layer's pool, or makes them
// wait for one. A DRAINED or isolated node has no other pending commands.
// The caller has marked the node retired already.
func releaseRetired(tx *bolt.Tx, e *Entry, node string) error {
	ws, err := workspacesOnNode(tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		if w.State != api.WorkspaceDeleting || w.Pending == nil || w.Pending.NodeID != node {
			continue
		}
		old := cloneWorkspace(w)
		if files, err := deleteFiles(tx, e, w, node); err != nil {
			return err
		} else if !files {
			if err := deleteWorkspace(tx, e, old); err != nil {
				return err
			}
			continue
		}
		if err := putWorkspace(tx, e, old, w); err != nil {
			return err
		}
	}
	_, err = releaseVolumeCommands(tx, e, node, "was retired")
	return err
}

// GetWorkspace returns one Workspace, or not_found.
func GetWorkspace(tx *bolt.Tx, id string) (*api.Workspace, error) {
	return mustWorkspace(tx, id)
}

// ViewWorkspace is GetWorkspace for a reader: with what its node last
// reported of the current Instance (denied packets).
func ViewWorkspace(tx *bolt.Tx, id string) (*api.Workspace, error) {
	w, err := mustWorkspace(tx, id)
	if err != nil || w.NodeID == "" || w.InstanceID == "" {
		return w, err
	}
	// Of the node's record only its report's Instance states: a client
	// waiting for a Workspace reads it at every change.
	var n struct {
		Report *struct {
			ReportedAt     time.Time           `json:"reported_at"`
			InstanceStates []api.InstanceState `json:"instance_states"`
		} `json:"report"`
	}
	if ok, err := getJSON(tx, bucketNodes, []byte(w.NodeID), &n); err != nil || !ok || n.Report == nil {
		return w, err
	}
	for _, st := range n.Report.InstanceStates {
		if st.InstanceID == w.InstanceID {
			w.Denied = &api.DeniedReport{Packets: st.DeniedPackets, ReportedAt: n.Report.ReportedAt}
			w.GuestNotResponding = st.GuestNotResponding && st.State == "RUNNING"
		}
	}
	return w, nil
}

// WorkspaceFilter selects Workspaces for ListWorkspaces.
type WorkspaceFilter struct {
	States []string          // any of these states; empty: all but the stopped ones unless All
	Labels map[string]string // every label must match
	All    bool              // include STOPPED ones
	// PoolID: only Workspaces whose retained layer is in this pool.
	PoolID string
	// NodeID and InstanceID select by current execution (exclusive with
	// the filters above).
	NodeID     string
	InstanceID string
}

func (f *WorkspaceFilter) match(w *api.Workspace) bool {
	if f.InstanceID != "" {
		return w.InstanceID == f.InstanceID
	}
	if f.NodeID != "" {
		return w.NodeID == f.NodeID
	}
	if len(f.States) > 0 {
		ok := false
		for _, s := range f.States {
			ok = ok || s == w.State
		}
		if !ok {
			return false
		}
	} else if !f.All && w.State == api.WorkspaceStopped {
		return false
	}
	for k, v := range f.Labels {
		if w.Labels[k] != v {
			return false
		}
	}
	if f.PoolID != "" && (w.Layer == nil || api.LayerPoolID(w.Layer) != f.PoolID) {
		return false
	}
	return true
}

// ListWorkspaces returns up to pageSize Workspaces matching f, ordered by
// id, starting after pageToken.
func ListWorkspaces(tx *bolt.Tx, f WorkspaceFilter, pageSize int, pageToken string) (*api.WorkspaceList, error) {
	out := &api.WorkspaceList{Workspaces: []api.Workspace{}}
	if f.NodeID != "" {
		if n, err := getNode(tx, f.NodeID); err != nil {
			return nil, err
		} else if n == nil {
			return nil, api.Errorf(api.CodeNotFound, "node %s is not registered: check the id with kibo node list", f.NodeID)
		}
	}
	c := tx.Bucket(bucketWorkspaces).Cursor()
	var k, v []byte
	if pageToken == "" {
		k, v = c.First()
	} else if k, v = c.Seek([]byte(pageToken)); k != nil && string(k) == pageToken {
		k, v = c.Next()
	}
	for ; k != nil; k, v = c.Next() {
		var w api.Workspace
		if err := json.Unmarshal(v, &w); err != nil {
			return nil, fmt.Errorf("state record workspaces/%s is corrupt: %w", k, err)
		}
		if !f.match(&w) {
			continue
		}
		if pageSize > 0 && len(out.Workspaces) == pageSize {
			out.NextPageToken = out.Workspaces[len(out.Workspaces)-1].WorkspaceID
			break
		}
		out.Workspaces = append(out.Workspaces, w)
	}
	return out, nil
}
