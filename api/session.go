package api

// SessionMsg is one message of a control session: JSON lines over a
// member-authenticated TLS connection (ALPN kibotos-session/1) from a node to
// the ctrl leader. Times are Unix nanoseconds of the sender's clock.
type SessionMsg struct {
	Type        string       `json:"type"`
	NodeID      string       `json:"node_id,omitempty"`
	Incarnation uint64       `json:"incarnation,omitempty"`
	Release     string       `json:"release,omitempty"`
	Revision    string       `json:"revision,omitempty"`
	SessionID   string       `json:"session_id,omitempty"`
	Refusal     string       `json:"refusal,omitempty"`
	Message     string       `json:"message,omitempty"`
	Leader      string       `json:"leader,omitempty"`
	T1          int64        `json:"t1,omitempty"` // ctrl send time of ping/sync
	T2          int64        `json:"t2,omitempty"` // node receive time
	T3          int64        `json:"t3,omitempty"` // node send time
	KernelSync  string       `json:"kernel_sync,omitempty"`
	Report      *Report      `json:"report,omitempty"`
	HostUsage   *HostUsage   `json:"host_usage,omitempty"`
	Overcommit  *Multipliers `json:"overcommit,omitempty"`
	// CredentialKey is the ed25519 public key ctrl signs data-plane
	// credentials with (welcome); a node of a build before
	// CredentialKeys verifies with it alone.
	CredentialKey []byte `json:"credential_key,omitempty"`
	// CredentialKeys (welcome) are every key a data plane must accept,
	// CredentialKey first: during a CA rotation the key derived from the
	// other CA too (at most MaxCredentialKeys).
	CredentialKeys [][]byte `json:"credential_keys,omitempty"`
	// ResultReports (welcome): the leader takes a task_result that
	// carries the full report the node owes after each task (Report,
	// HostUsage), and stores the report after the result. A node whose
	// leader does not say so sends the report as a message of its own.
	ResultReports bool `json:"result_reports,omitempty"`
	// Forget (MsgForget) lists ended-Instance records ctrl has concluded.
	Forget []string `json:"forget,omitempty"`
	// Unrecognized (MsgForget) lists ended-Instance records ctrl does not
	// recognize (no Allocation): they stay, and the node need not report
	// them again.
	Unrecognized []string `json:"unrecognized,omitempty"`
	// Draining (MsgNodeState): the node rejects new Workspaces itself.
	Draining   *bool                `json:"draining,omitempty"`
	Task       *WorkspaceTask       `json:"task,omitempty"`
	TaskResult *WorkspaceTaskResult `json:"task_result,omitempty"`
	// VolumeTask (MsgVolumeTask) and VolumeResult (MsgVolumeResult).
	VolumeTask   *VolumeTask       `json:"volume_task,omitempty"`
	VolumeResult *VolumeTaskResult `json:"volume_result,omitempty"`
}

// WorkspaceTask is a Workspace command for the node, with what it needs to
// execute it without asking back.
type WorkspaceTask struct {
	Command     WorkspaceCommand `json:"command"`
	WorkspaceID string           `json:"workspace_id"`
	Template    string           `json:"template"`
	CPU         Milli            `json:"cpu"`
	MemoryBytes uint64           `json:"memory_bytes"`
	LayerPool   string           `json:"layer_pool,omitempty"`
	// Network is the policy the node applies: the Workspace's for a
	// start, the requested one for a network command.
	Network *NetworkPolicy `json:"network,omitempty"`
	// Egress is the Egress object Network names (nil for none and
	// public), at the revision Network records.
	Egress *TaskEgress `json:"egress,omitempty"`
	// Resolver is the Resolver object Network names (nil: the
	// deployment resolver).
	Resolver *TaskResolver `json:"resolver,omitempty"`
	// Volumes (start) are the Workspace's Volumes, in mount order.
	Volumes []TaskVolume `json:"volumes,omitempty"`
	// Snapshot (start): restore the Workspace's snapshot instead of
	// booting; (stop, delete) remove its files.
	Snapshot *TaskSnapshot `json:"snapshot,omitempty"`
	// Published (start) is Template's catalog entry, if it was published:
	// a node that lacks the template fetches it from the artifact store.
	Published *TemplateImage `json:"published,omitempty"`
	// Platforms (start) are the approved defaults the node may start on,
	// in the order to try; empty while the catalog approves none (the
	// node starts on its own Platform).
	Platforms []PlatformImage `json:"platforms,omitempty"`
	// Import (start) is the archive to unpack into a layer and Volumes
	// that do not exist yet (transfer import).
	Import *WorkspaceImport `json:"import,omitempty"`
	// Env (start) is the Workspace's environment, NAME=value sorted by
	// name, for its guest (guestproto.ConfigureRequest.Env). Secret:
	// never logged.
	Env []string `json:"env,omitempty"`
}

// TaskSnapshot is a Workspace's snapshot as a command needs it.
type TaskSnapshot struct {
	PoolID string         `json:"pool_id"`
	Compat SnapshotCompat `json:"compat"`
	// Discard: remove the files (a start then boots the guest afresh).
	Discard bool `json:"discard,omitempty"`
	// From (a fork's first start) is the paused source Workspace whose
	// snapshot and layer the node forks (agent/runtime.PrepareFork), and
	// FromInstance the source's Instance the snapshot was saved from.
	From         string `json:"from,omitempty"`
	FromInstance string `json:"from_instance,omitempty"`
}

// WorkspaceTaskResult is the node's answer to a WorkspaceTask.
type WorkspaceTaskResult struct {
	WorkspaceID string `json:"workspace_id"`
	CommandID   string `json:"command_id"`
	Outcome     string `json:"outcome"` // ok, refused, failed
	Error       string `json:"error,omitempty"`
	// Snapshot (pause ok) is the snapshot the node saved.
	Snapshot *SnapshotReport `json:"snapshot,omitempty"`
	// InstanceGone (pause failed): the VMM ended and the node removed the
	// Instance; otherwise the guest runs on.
	InstanceGone bool `json:"instance_gone,omitempty"`
	// NotOnNode (stop --force ok): the node did not have the Instance (it
	// was not taken over): nothing was stopped; a FAILED Workspace stays
	// FAILED, released.
	NotOnNode bool `json:"not_on_node,omitempty"`
	// SnapshotDiscarded (resume failed): the snapshot could not be
	// restored (torn, incompatible) and the node removed it.
	SnapshotDiscarded bool `json:"snapshot_discarded,omitempty"`
	// Platform (start ok) is the id of the Platform the Instance runs on.
	Platform string `json:"platform,omitempty"`
}

// MaxCredentialKeys bounds SessionMsg.CredentialKeys: the cluster CA's
// key and, during a rotation, the key of the CA it moves to.
const MaxCredentialKeys = 2

// Session message types.
const (
	MsgHello         = "hello"          // node → ctrl: who I am
	MsgWelcome       = "welcome"        // ctrl → node: session accepted
	MsgRefused       = "refused"        // ctrl → node: session refused (Refusal says why)
	MsgRedirect      = "redirect"       // ctrl → node: not the leader, try Leader
	MsgPing          = "ping"           // ctrl → node: liveness
	MsgPong          = "pong"           // node → ctrl
	MsgSync          = "sync"           // ctrl → node: send a full report (and timestamps for the clock)
	MsgReport        = "report"         // node → ctrl: full report
	MsgOvercommit    = "overcommit"     // ctrl → node: new effective multipliers
	MsgOvercommitAck = "overcommit_ack" // node → ctrl: applied
	MsgNodeState     = "node_state"     // ctrl → node: its drain request changed
	MsgForget        = "forget"         // ctrl → node: delete these ended-Instance records (and keep those unrecognized)
	MsgTask          = "task"           // ctrl → node: execute a Workspace command
	MsgTaskResult    = "task_result"    // node → ctrl: its outcome
	MsgVolumeTask    = "volume_task"    // ctrl → node: execute a Volume command
	MsgVolumeResult  = "volume_result"  // node → ctrl: its outcome
)

// Outcomes of a node's answer to a command it was sent (the Outcome of
// WorkspaceTaskResult, VolumeTaskResult and NetworkChangeResult).
const (
	OutcomeOK      = "ok"
	OutcomeRefused = "refused" // the node does not take new Workspaces (drained, memory tight)
	OutcomeFailed  = "failed"
)

// Refusals of a control session (SessionMsg.Refusal).
const (
	RefusalIsolated    = "isolated"
	RefusalNotAdmitted = "not_admitted"
	RefusalStale       = "stale_incarnation"
)
