package fsm

import (
	"time"

	"github.com/kibotos/kibotos/api"
)

// Operations, one apply function each.
const (
	OpBootstrap            = "cluster.bootstrap"
	OpEnrollmentGrant      = "enrollment.grant"
	OpEnrollmentRevoke     = "enrollment.revoke"
	OpEnrollmentConsume    = "enrollment.consume"
	OpSessionOpen          = "node.session_open"
	OpSessionClose         = "node.session_close"
	OpNodeReport           = "node.report"
	OpNodeDrain            = "node.drain"
	OpNodeCancelDrain      = "node.cancel_drain"
	OpNodeIsolate          = "node.isolate"
	OpNodeRetire           = "node.retire"
	OpOvercommitSetDefault = "overcommit.set_default"
	OpOvercommitSet        = "overcommit.set"
	OpOvercommitAck        = "node.overcommit_ack"
	OpCommandsExpire       = "commands.expire"
	OpWorkspaceCreate      = "workspace.create"
	OpWorkspaceStart       = "workspace.start"
	OpWorkspaceStop        = "workspace.stop"
	OpWorkspaceDelete      = "workspace.delete"
	OpWorkspaceResult      = "workspace.node_result"
	OpWorkspaceSetNetwork  = "workspace.set_network"
	OpEgressCreate         = "egress.create"
	OpEgressUpdate         = "egress.update"
	OpEgressDelete         = "egress.delete"
	OpResolverCreate       = "resolver.create"
	OpResolverDelete       = "resolver.delete"
	OpPoolSetCapacity      = "storage_pool.set_capacity"
	OpPoolDeclareLost      = "storage_pool.declare_lost"
	OpVolumeCreate         = "volume.create"
	OpVolumeResize         = "volume.resize"
	OpVolumeDelete         = "volume.delete"
	OpVolumeResult         = "volume.node_result"
	OpWorkspacePause       = "workspace.pause"
	OpTemplatePublish      = "template.publish"
	OpTemplateDelete       = "template.delete"
	OpPlatformPublish      = "platform.publish"
	OpPlatformApprove      = "platform.approve"
	OpPlatformWithdraw     = "platform.withdraw"
	OpTransferExport       = "transfer.export"
	OpTransferResult       = "transfer.result"
	OpTransferDelete       = "transfer.delete"
	OpTransferProgress     = "transfer.progress"
	OpOperatorIssue        = "operator.issue"
	OpOperatorRevoke       = "operator.revoke"
	OpWorkspaceSetTimeout  = "workspace.set_timeout"
	OpWorkspaceTimedOut    = "workspace.timed_out"
	OpWorkspaceIdlePause   = "workspace.idle_pause"
	// OpMemberLevel is proposed with IgnoreUnknown (see levels.go).
	OpMemberLevel = "cluster.member_level"
)

// BootstrapArgs creates the cluster with its first member.
type BootstrapArgs struct {
	ClusterID string   `json:"cluster_id"`
	NodeID    string   `json:"node_id"`
	Roles     []string `json:"roles"`
	Address   string   `json:"address"`
}

// GrantArgs issues an enrollment grant; only the secret's hash is stored.
type GrantArgs struct {
	NodeID     string        `json:"node_id"`
	Roles      []string      `json:"roles"`
	SecretHash string        `json:"secret_hash"`
	TTL        time.Duration `json:"ttl"`
}

// NodeArgs names one node.
type NodeArgs struct {
	NodeID string `json:"node_id"`
}

// ConsumeArgs uses a grant to admit a node.
type ConsumeArgs struct {
	NodeID     string `json:"node_id"`
	SecretHash string `json:"secret_hash"`
	Address    string `json:"address"`
}

// SessionOpenArgs opens a control session; the session id is drawn by the
// leader before the entry is appended.
type SessionOpenArgs struct {
	NodeID      string `json:"node_id"`
	SessionID   string `json:"session_id"`
	Incarnation uint64 `json:"incarnation"`
	Release     string `json:"release"`
	Revision    string `json:"revision"`
	Address     string `json:"address,omitempty"`
}

// SessionOpenResult says whether the session was accepted; a refusal is a
// successful apply that changed nothing, so the leader can tell the node why.
type SessionOpenResult struct {
	Accepted bool   `json:"accepted"`
	Refusal  string `json:"refusal,omitempty"`
	Message  string `json:"message,omitempty"`
}

// Refusals of a session (the protocol's).
const (
	RefusalIsolated    = api.RefusalIsolated
	RefusalNotAdmitted = api.RefusalNotAdmitted
	RefusalStale       = api.RefusalStale
)

// SessionCloseArgs ends a session if it is still the node's current one.
type SessionCloseArgs struct {
	NodeID    string `json:"node_id"`
	SessionID string `json:"session_id"`
	Reason    string `json:"reason"`
}

// ClockArgs is one clock measurement made by the leader.
type ClockArgs struct {
	OffsetNS      int64  `json:"offset_ns"`
	UncertaintyNS int64  `json:"uncertainty_ns"`
	KernelSync    string `json:"kernel_sync"`
}

// ReportArgs is a full node report, optionally with host usage and a clock
// measurement taken at the same sync.
type ReportArgs struct {
	NodeID    string         `json:"node_id"`
	SessionID string         `json:"session_id"`
	Report    api.Report     `json:"report"`
	HostUsage *api.HostUsage `json:"host_usage,omitempty"`
	Clock     *ClockArgs     `json:"clock,omitempty"`
	// Rounds is set by a leader whose voters all reach LevelEndedRounds:
	// the report's ended records count only in a round (Round) and its
	// Instances are noted for the check of deleted records (ended.go).
	// An entry without it concludes every record it carries at once, as
	// before that level.
	Rounds bool `json:"ended_rounds,omitempty"`
	// Round: the leader found the node's round due; the FSM checks it
	// again by the entry's time.
	Round bool `json:"ended_round,omitempty"`
	// OOMStops is set by a leader whose voters all reach
	// LevelTroubleshooting: an Instance reported FAILED with OOMKilled
	// stops its Workspace (ctrl ends the Instance, STOPPED) rather than
	// failing it. Without it every ended Instance fails its Workspace.
	OOMStops bool `json:"oom_stops,omitempty"`
}

// ReportResult is the outcome of a report: its version and the ended-
// Instance records the node may now delete.
type ReportResult struct {
	ReportVersion uint64   `json:"report_version"`
	Forget        []string `json:"forget,omitempty"`
	// Unrecognized (rounds only) are records of Instances ctrl has no
	// Allocation for: they stay on the node, which need not send them again.
	Unrecognized []string `json:"unrecognized,omitempty"`
}

// OvercommitDefaultArgs changes the given items of the cluster default.
type OvercommitDefaultArgs struct {
	CPU    *api.Milli `json:"cpu,omitempty"`
	Memory *api.Milli `json:"memory,omitempty"`
}

// MultiplierChange sets a node item to a value or back to the default.
type MultiplierChange struct {
	Default bool      `json:"default,omitempty"`
	Value   api.Milli `json:"value,omitempty"`
}

// OvercommitSetArgs changes the given items of a node's override.
type OvercommitSetArgs struct {
	NodeID string            `json:"node_id"`
	CPU    *MultiplierChange `json:"cpu,omitempty"`
	Memory *MultiplierChange `json:"memory,omitempty"`
}

// OvercommitAckArgs records that the node applied these multipliers.
type OvercommitAckArgs struct {
	NodeID    string          `json:"node_id"`
	SessionID string          `json:"session_id"`
	Values    api.Multipliers `json:"values"`
}

// CommandsExpireArgs drops command records applied before Before, the
// oldest first, at most Limit of them (0: all; LevelExpireLimit).
type CommandsExpireArgs struct {
	Before time.Time `json:"before"`
	Limit  int       `json:"limit,omitempty"`
}

// CommandsExpireResult is what an expiry dropped; More: it stopped at its
// Limit with older records left.
type CommandsExpireResult struct {
	Expired int  `json:"expired"`
	More    bool `json:"more,omitempty"`
}
