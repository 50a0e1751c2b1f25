package api

import (
	"strings"
	"time"
)

// Workspace states. CREATING and STARTING mean ctrl has placed an execution
// on a node and waits for it; DELETING until the node released everything.
const (
	WorkspaceCreating  = "CREATING"
	WorkspaceStarting  = "STARTING"
	WorkspaceAvailable = "AVAILABLE"
	WorkspaceStopping  = "STOPPING"
	WorkspaceStopped   = "STOPPED"
	WorkspaceFailed    = "FAILED"
	WorkspaceDeleting  = "DELETING"
)

// Failure reasons of a FAILED Workspace.
const (
	// FailureUnavailable: its node was isolated; start it again elsewhere.
	FailureUnavailable = "UNAVAILABLE"
	// FailureNoLongerRunning: the VMM ended without the node stopping it.
	FailureNoLongerRunning = "NO_LONGER_RUNNING"
	// FailureStart: the node could not start the Instance.
	FailureStart = "START_FAILED"
	// FailureStop: the guest did not stop cleanly; stop --force ends it.
	FailureStop = "STOP_FAILED"
	// FailureResourceExhausted: the nodes it was placed on refused to
	// start it (memory tight, draining) and no other node has room; it
	// holds nothing and starts again once one has. The CLI exits with
	// resource_exhausted.
	FailureResourceExhausted = "RESOURCE_EXHAUSTED"
)

// Workspace is one Workspace as ctrl stores it.
// DeniedReport is a count of the current Instance's denied packets, as
// of the node's report.
type DeniedReport struct {
	Packets    uint64    `json:"packets"`
	ReportedAt time.Time `json:"reported_at"`
}

type Workspace struct {
	WorkspaceID string `json:"workspace_id"`
	// Namespace is the namespace it belongs to; absent: default.
	Namespace   string            `json:"namespace,omitempty"`
	Version     uint64            `json:"version"`
	State       string            `json:"state"`
	Template    string            `json:"template"`
	CPU         Milli             `json:"cpu"`
	MemoryBytes uint64            `json:"memory_bytes"`
	Labels      map[string]string `json:"labels,omitempty"`
	// EnvNames are the names of its environment variables (set at
	// create), sorted; their values may be secrets and are given only to
	// the node that runs it (WorkspaceTask.Env), never shown.
	EnvNames []string `json:"env_names,omitempty"`
	// Network is the policy in force (applied by the node when it runs).
	// Nil in records written before Workspaces had one: egress none.
	Network *NetworkPolicy `json:"network,omitempty"`
	// NetworkChange is the node's answer to the latest change of the
	// policy while the Workspace ran; a failed one left Network as it was.
	NetworkChange *NetworkChangeResult `json:"network_change,omitempty"`
	CreatedAt     time.Time            `json:"created_at"`
	UpdatedAt     time.Time            `json:"updated_at"`
	// NodeID and InstanceID are the current execution; empty when the
	// Workspace has none (stopped, deleted or not placed yet).
	NodeID     string `json:"node_id,omitempty"`
	InstanceID string `json:"instance_id,omitempty"`
	// Platform is the Platform its latest Instance started on (recorded
	// from the feature level of the Platform catalog on); a stopped
	// Workspace's next start prefers the default of its kernel series.
	Platform string `json:"platform,omitempty"`
	// Exporting is the Transfer writing its layer and Volumes out; it
	// neither starts nor is deleted meanwhile.
	Exporting string `json:"exporting,omitempty"`
	// Import is the archive its first start unpacks (transfer import);
	// cleared once a start succeeded.
	Import *WorkspaceImport `json:"import,omitempty"`
	// Instances counts the executions so far; each start gets a new one.
	Instances uint64 `json:"instances"`
	// Layer is the use right of the retained writable layer: the node and
	// pool that hold it. Nil before the first start and after deletion.
	Layer *LayerRight `json:"layer,omitempty"`
	// Volumes are attached to the Workspace and mounted by its guest; the
	// use right of each goes with the layer's.
	Volumes []VolumeMount     `json:"volumes,omitempty"`
	Failure *WorkspaceFailure `json:"failure,omitempty"`
	// Pending is the command the node has not answered yet.
	Pending *WorkspaceCommand `json:"pending,omitempty"`
	// Denied is what the node last reported of the guest's denied
	// packets; derived on read from the node's report, never stored.
	Denied *DeniedReport `json:"denied,omitempty"`
	// GuestNotResponding: the node's last report says its guest agent
	// does not answer, or has not yet taken this run's configuration
	// after a takeover (the node retries); derived on read, never stored.
	GuestNotResponding bool `json:"guest_not_responding,omitempty"`
	// StopUnconfirmed marks a stop --force (or a release by ctrl) whose data
	// was not confirmed to have reached disk.
	StopUnconfirmed bool `json:"stop_unconfirmed,omitempty"`
	// Snapshot is the saved guest of a PAUSED Workspace (kept while a
	// resume is in flight); nil otherwise.
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	// LastError is why the latest command that left the Workspace as it
	// was failed (a pause that could not save the guest: it runs on).
	LastError *WorkspaceFailure `json:"last_error,omitempty"`
	// Cleanup is the node's conclusion on the Workspace's latest ended
	// Instance, stored by ctrl before the node deleted its record.
	Cleanup *CleanupConclusion `json:"cleanup,omitempty"`
	// DeleteWaitsForPool: DELETING, and no node that can remove its files
	// is a member of this pool yet (the pool's only host was isolated or
	// retired); the delete goes to the first member that reports it.
	DeleteWaitsForPool string `json:"delete_waits_for_pool,omitempty"`
	// ForkedFrom is the Workspace this one was forked from (create --from).
	ForkedFrom string `json:"forked_from,omitempty"`
	// TimeoutSeconds is how long each start and resume runs before
	// ctrl does OnTimeout at EndsAt; EndsAt nil: no end (lifetime.go).
	TimeoutSeconds int64      `json:"timeout_seconds,omitempty"`
	OnTimeout      string     `json:"on_timeout,omitempty"`
	EndsAt         *time.Time `json:"ends_at,omitempty"`
	// AutoResume: a data-plane credential asked for while it is PAUSED
	// resumes it first (exec, terminal, cp, port-forward wait for it).
	AutoResume bool `json:"auto_resume,omitempty"`
	// IdleTimeoutSeconds: ctrl pauses it once its node reports it idle
	// (no data-plane connection, guest CPU low) that long (idle.go).
	IdleTimeoutSeconds int64 `json:"idle_timeout_seconds,omitempty"`
	// Idle is what its node last reported of the current Instance's
	// idleness; nil while it is in use. Derived on read, never stored.
	Idle      *IdleReport `json:"idle,omitempty"`
	DeletedAt *time.Time  `json:"deleted_at,omitempty"`
}

// LayerRight is who may use a retained writable layer.
type LayerRight struct {
	NodeID string `json:"node_id"`
	PoolID string `json:"pool_id"`
	// Shared: the pool is reachable by every node reporting it, so the
	// Workspace may start on any of them; else only on NodeID.
	Shared bool `json:"shared,omitempty"`
	// Held is true while a node holds the use right (the layer is attached
	// to an execution or being released); false once released.
	Held bool `json:"held"`
	// SizeBytes is what the layer may grow to (its template's image
	// size), charged to the pool while the layer exists.
	SizeBytes uint64 `json:"size_bytes,omitempty"`
	// Lost: its pool was declared lost; the files are gone, the Workspace
	// can only be deleted.
	Lost bool `json:"lost,omitempty"`
}

// WorkspaceFailure says why a Workspace is FAILED.
type WorkspaceFailure struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Stage is where the node's work on the Instance failed, when it says
	// (PREPARING_RETAINED_LAYER, ATTACHING_VOLUME): the message begins
	// with it.
	Stage string    `json:"stage,omitempty"`
	At    time.Time `json:"at"`
}

// Failure stages a node names at the start of an Instance's error.
const (
	StagePreparingRetainedLayer = "PREPARING_RETAINED_LAYER"
	StageAttachingVolume        = "ATTACHING_VOLUME"
)

// FailureStage is the stage an Instance error begins with, "" for none.
func FailureStage(msg string) string {
	for _, s := range []string{StagePreparingRetainedLayer, StageAttachingVolume} {
		if strings.HasPrefix(msg, s+": ") {
			return s
		}
	}
	return ""
}

// Workspace command kinds a node executes.
const (
	WSCmdStart     = "start"      // create the layer if needed, start an Instance
	WSCmdStop      = "stop"       // stop the Instance gracefully, keep the layer
	WSCmdStopForce = "stop_force" // end the Instance without a clean guest stop
	WSCmdDelete    = "delete"     // end the Instance, remove the layer
	// WSCmdNetwork applies the command's policy to the running Instance;
	// the Workspace keeps its old one until the node answers ok.
	WSCmdNetwork = "network"
)

// WorkspaceCommand is a command ctrl sent (or will send) to a node.
type WorkspaceCommand struct {
	Kind       string    `json:"kind"`
	CommandID  string    `json:"command_id"`
	NodeID     string    `json:"node_id"`
	InstanceID string    `json:"instance_id,omitempty"`
	IssuedAt   time.Time `json:"issued_at"`
	// Refused lists nodes that refused this placement (drained, memory
	// tight); ctrl places elsewhere at once.
	Refused []string `json:"refused,omitempty"`
	// Network is the requested policy of a network command.
	Network *NetworkPolicy `json:"network,omitempty"`
}

// WorkspaceList is one page of Workspaces.
type WorkspaceList struct {
	Workspaces    []Workspace `json:"workspaces"`
	NextPageToken string      `json:"next_page_token,omitempty"`
}

// WorkspaceCreateRequest is `workspace create`.
type WorkspaceCreateRequest struct {
	WriteMeta
	Template    string            `json:"template"`
	CPU         Milli             `json:"cpu"`
	MemoryBytes uint64            `json:"memory_bytes"`
	Labels      map[string]string `json:"labels,omitempty"`
	NodeID      string            `json:"node_id,omitempty"`
	// Env is the environment of every process of the Workspace,
	// NAME=value (CheckWorkspaceEnv); a fork has its source's.
	Env []string `json:"env,omitempty"`
	// Network is the policy; nil: egress none.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Volumes are existing Volumes to attach; NewVolumes are made along
	// with the Workspace in its node's default pool.
	Volumes    []VolumeAttach `json:"volumes,omitempty"`
	NewVolumes []NewVolume    `json:"new_volumes,omitempty"`
	// From forks this PAUSED Workspace: Template, CPU and MemoryBytes are
	// its and may be left out.
	From string `json:"from,omitempty"`
	// Timeout (a Go duration, e.g. "30m") ends every start and resume
	// that long after it with OnTimeout (delete by default).
	Timeout   string `json:"timeout,omitempty"`
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume: exec, terminal, cp and port-forward resume it when it
	// is PAUSED.
	AutoResume bool `json:"auto_resume,omitempty"`
	// IdleTimeout (a Go duration, e.g. "10m") pauses it once it was idle
	// that long.
	IdleTimeout string `json:"idle_timeout,omitempty"`
}

// WorkspaceWriteRequest is start, stop, delete and move.
type WorkspaceWriteRequest struct {
	WriteMeta
	NodeID string `json:"node_id,omitempty"`
	Force  bool   `json:"force,omitempty"`
	// Wait makes the call return when the node has answered (or the
	// request's deadline passed); otherwise it returns once ctrl accepted it.
	Wait bool `json:"wait,omitempty"`
}

// CleanupConclusion is what a node observed when it released an Instance.
type CleanupConclusion struct {
	InstanceID string    `json:"instance_id"`
	NodeID     string    `json:"node_id"`
	ObservedAt time.Time `json:"observed_at"`
	How        string    `json:"how"`
	// Unknown: the node's record was gone before ctrl stored its
	// conclusion; what the node released is not known.
	Unknown bool `json:"unknown,omitempty"`
}

// CleanupItem states.
const (
	CleanupReleased = "RELEASED"
	CleanupHeld     = "HELD"
	CleanupPending  = "PENDING"
	CleanupUnknown  = "UNKNOWN"
)

// CleanupStatus is `workspace cleanup-status`: what the latest execution
// still holds, by item, with where the answer came from.
type CleanupStatus struct {
	WorkspaceID string        `json:"workspace_id"`
	InstanceID  string        `json:"instance_id,omitempty"`
	NodeID      string        `json:"node_id,omitempty"`
	Items       []CleanupItem `json:"items"`
}

// CleanupItem is one row of cleanup-status.
type CleanupItem struct {
	Item       string     `json:"item"` // RUNTIME, VOLUME_ATTACHMENT, RESIDUAL
	State      string     `json:"state"`
	Source     string     `json:"source"` // control-plane, node
	ObservedAt *time.Time `json:"observed_at,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
}

// DataPlaneCredential is a short-lived credential for one Workspace's
// current Instance, signed by ctrl, accepted by the data-plane process of
// the node that runs it.
type DataPlaneCredential struct {
	WorkspaceID string    `json:"workspace_id"`
	NodeID      string    `json:"node_id"`
	InstanceID  string    `json:"instance_id"`
	Address     string    `json:"address"` // the node's data-plane address, HOST:PORT
	Credential  string    `json:"credential"`
	ExpiresAt   time.Time `json:"expires_at"`
}
