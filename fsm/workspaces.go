package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"regexp"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
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
	// Namespace (LevelNamespaces) the Workspace and its new Volumes go
	// to, and where the Volumes it attaches are found; "" is default.
	Namespace   string            `json:"namespace,omitempty"`
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
	// TimeoutSeconds and OnTimeout (LevelLifetimes: the leader refuses
	// them below it) end every start and resume that long after its
	// entry (lifetimes.go).
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"`
	OnTimeout      string `json:"on_timeout,omitempty"`
	// AutoResume (LevelLifetimes, refused below it like the timeout):
	// a data-plane credential asked for while PAUSED resumes it.
	AutoResume bool `json:"auto_resume,omitempty"`
	// IdleTimeoutSeconds (LevelLifetimes, refused below it like the
	// timeout): ctrl pauses it once it was reported idle that long
	// (idle.go).
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`
	// Env (LevelWorkspaceEnv, refused below it: an older voter would
	// drop it) is the environment of every process of the Workspace,
	// NAME=value (workspaceenv.go); a fork has its source's.
	Env []string `json:"env,omitempty"`
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
	// MaxWorkspaceMemory bounds a create's memory where the request
	// enters (not in the FSM, whose log holds creates checked without
	// it): 1 TiB, above any host this runs on.
	MaxWorkspaceMemory = 1 << 40
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
func putWorkspace(ac *applyCtx, old, w *api.Workspace) error {
	if err := moveDerived(ac, old, w); err != nil {
		return err
	}
	if err := moveNamespaceIndex(ac.tx, nsKindWorkspace, w.Namespace, w.WorkspaceID, old == nil, false); err != nil {
		return err
	}
	w.Version++
	w.UpdatedAt = *at(ac.e)
	return putJSON(ac.tx, bucketWorkspaces, wsKey(w.WorkspaceID), w)
}

// workspaceDerived are the records kept in step with a Workspace's: each
// moves what old held to what w holds (old nil: a new Workspace; w nil: a
// deleted one).
var workspaceDerived = []func(ac *applyCtx, old, w *api.Workspace) error{
	moveNodeIndex,
	func(ac *applyCtx, old, w *api.Workspace) error { return movePending(ac.tx, old, w) },
	moveHolds,
	func(ac *applyCtx, old, w *api.Workspace) error { return movePoolUse(ac.tx, old, w) },
	func(ac *applyCtx, old, w *api.Workspace) error { return movePoolWait(ac.tx, old, w) },
	func(ac *applyCtx, old, w *api.Workspace) error { return moveRefs(ac.tx, old, w) },
	func(ac *applyCtx, old, w *api.Workspace) error { return moveForks(ac.tx, old, w) },
	syncVolumes,
	moveWorkspaceUsage,
	moveEnds,
}

// moveDerived moves every record derived from old to w.
func moveDerived(ac *applyCtx, old, w *api.Workspace) error {
	for _, move := range workspaceDerived {
		if err := move(ac, old, w); err != nil {
			return err
		}
	}
	return nil
}

// moveNodeIndex moves the Workspace's entries of the nodes it occupies.
func moveNodeIndex(ac *applyCtx, old, w *api.Workspace) error {
	idx := ac.tx.Bucket(bucketWorkspaceNodes)
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

func deleteWorkspace(ac *applyCtx, w *api.Workspace) error {
	if err := moveDerived(ac, w, nil); err != nil {
		return err
	}
	if err := moveNamespaceIndex(ac.tx, nsKindWorkspace, w.Namespace, w.WorkspaceID, false, true); err != nil {
		return err
	}
	if err := ac.tx.Bucket(bucketWorkspaceTombstones).Put(wsKey(w.WorkspaceID), []byte(at(ac.e).Format(time.RFC3339))); err != nil {
		return err
	}
	if err := deleteEnv(ac.tx, w.WorkspaceID); err != nil {
		return err
	}
	return ac.tx.Bucket(bucketWorkspaces).Delete(wsKey(w.WorkspaceID))
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
func moveHolds(ac *applyCtx, old, w *api.Workspace) error {
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
		h, err := nodeHolds(ac.tx, n)
		if err != nil {
			return err
		}
		h.Instances += after.Instances - before.Instances
		h.Layers += after.Layers - before.Layers
		h.Volumes += after.Volumes - before.Volumes
		h.Allocated.CPU += after.Allocated.CPU - before.Allocated.CPU
		h.Allocated.MemoryBytes += after.Allocated.MemoryBytes - before.Allocated.MemoryBytes
		if h == (Holds{}) {
			if err := ac.tx.Bucket(bucketNodeHolds).Delete([]byte(n)); err != nil {
				return err
			}
		} else if err := putJSON(ac.tx, bucketNodeHolds, []byte(n), h); err != nil {
			return err
		}
		markNodeChanged(ac, n)
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
