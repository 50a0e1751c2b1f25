package fsm

import (
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Feature levels: how a cluster of mixed builds (a rolling upgrade) never
// hands a voter an op it cannot apply. Every op has the level of the
// build that introduced it; a build applies every op up to its
// FeatureLevel. The leader proposes an op only when every voter's
// recorded level reaches it (cluster checks before the log), and records
// each voter's level with OpMemberLevel, which it proposes with
// IgnoreUnknown: a build from before levels skips it, and a voter without
// a record counts as level 1.
//
// A level may also change what an existing op does. Its entries then say
// so with a field the leader sets only when every voter reaches the
// level, and entries without it apply exactly as before: they are in the
// logs and snapshots of older builds, and an older voter applies them so.
//
//	2  Volumes: OpVolumeCreate, OpVolumeResize, OpVolumeDelete, OpVolumeResult
//	3  pause and resume: OpWorkspacePause
//	4  rounds of ended-Instance records (LevelEndedRounds): a report
//	   entry with ReportArgs.Rounds concludes a node's records at most once
//	   a minute, keeps those ctrl does not recognize on the node, and
//	   concludes a record deleted before its conclusion as unknown (ended.go)
//	5  rows of the process-model seed's troubleshooting table
//	   (LevelTroubleshooting): a report entry with ReportArgs.OOMStops
//	   stops a Workspace whose VMM host OOM killed (STOPPED, startable)
//	   instead of failing it; a stop --force result with
//	   WorkspaceResultArgs.NotOnNode releases a FAILED Workspace whose node
//	   no longer has the Instance and leaves it FAILED (startable);
//	   placement counts (LevelPlacementCounts): an entry with
//	   Entry.CountPlacements counts its placements in the state
//	   (placements.go)
//	5  the template catalog (LevelArtifacts, templates.go):
//	   OpTemplatePublish, OpTemplateDelete; a report's TemplateDigests,
//	   which the leader leaves out below it; the Platform catalog
//	   (platforms.go): OpPlatformPublish, OpPlatformApprove,
//	   OpPlatformWithdraw, and WorkspaceResultArgs.Platform, which the
//	   leader sets only from this level on; Transfers (transfers.go):
//	   OpTransferExport, OpTransferResult, OpTransferDelete,
//	   OpTransferProgress, and
//	   WorkspaceCreateArgs.Import, refused below it
//	6  the binary entry format (LevelEntryFormat, entrycodec.go): the
//	   leader writes entries with EncodeEntry instead of JSON
//	6  forks of a paused Workspace (LevelForks, forks.go):
//	   WorkspaceCreateArgs.From, which the leader refuses below it (an
//	   older voter would ignore it and create a Workspace that boots)
//	7  warm guests (LevelWarm): a report's Warm, checked (api.CheckWarm)
//	   and stored; the leader leaves it out below the level
//	8  bounded command expiry (LevelExpireLimit): CommandsExpireArgs.Limit,
//	   which the leader sets only from this level on (an older voter would
//	   drop every old record at once, and until the last bounded entry a
//	   retry could replay on one voter and run again on another)
//	9  the command log (LevelCommandLog, commandlog.go): an entry with
//	   Entry.CommandLog appends its command record to bucketCommandLog
//	   and finds records there through an index derived from it (an
//	   older voter stops at an entry with a flag it does not know)
//	10 reports with task results (LevelResultReports):
//	   WorkspaceResultArgs.Report, the report a node sends with a task's
//	   result, stored after the result in the same entry; the leader
//	   stores it as an entry of its own below the level (an older voter
//	   would ignore the field and never store the report)
//	11 refusals that exhaust (LevelRefusalExhausted): a refused start
//	   with WorkspaceResultArgs.RefusalExhausts that no other node can
//	   take, or that only the refusing node's standalone pool could
//	   start, ends the Workspace FAILED with reason RESOURCE_EXHAUSTED,
//	   the CLI's resource_exhausted (exit 15); without it START_FAILED
//	   (exit 13), as before
//	12 operators (LevelOperators, operators.go): the role operator in
//	   OpEnrollmentGrant's roles (ValidRoles; an older voter refuses it,
//	   so the leader refuses such a grant below the level) and
//	   OpOperatorIssue, OpOperatorRevoke
//	13 CA rotation (LevelCARotation, ca.go): OpCARotateBegin,
//	   OpCARotateSign, OpCARotateFinish
//	14 namespaces and API keys (LevelNamespaces, namespaces.go,
//	   apikeys.go, scope.go): OpNamespaceCreate, OpNamespaceDelete,
//	   OpAPIKeyCreate, OpAPIKeyRevoke, OpNamespaceQuota, OpAPIKeyUsed;
//	   the Namespace of create, volume and volume write args, which the
//	   leader refuses below it; entries whose actor is an API key
//	   (KeyActor)
//	15 Workspace lifetimes (LevelLifetimes, lifetimes.go):
//	   WorkspaceCreateArgs.TimeoutSeconds and OnTimeout, which the leader
//	   refuses below it (an older voter would drop them and the Workspace
//	   would never end), WorkspaceCreateArgs.AutoResume, refused below it
//	   too, OpWorkspaceSetTimeout, OpWorkspaceTimedOut, OpNamespaceDefaults,
//	   WorkspaceCreateArgs.IdleTimeoutSeconds (refused below it),
//	   OpWorkspaceIdlePause
//	16 a Workspace's environment (LevelWorkspaceEnv, workspaceenv.go):
//	   WorkspaceCreateArgs.Env, which the leader refuses below it (an
//	   older voter would drop it and its Workspace would run without
//	   it), kept in bucketWorkspaceEnv
//	17 a Workspace's network change by an API key (LevelKeyNetwork,
//	   network.go): OpWorkspaceSetNetwork with a KeyActor, which the
//	   leader refuses below it (an older voter would refuse the entry)

// FeatureLevel is the level of this build.
const FeatureLevel = 17

// LevelRefusalExhausted is the level of WorkspaceResultArgs.RefusalExhausts.
const LevelRefusalExhausted = 11

// LevelResultReports is the level of WorkspaceResultArgs.Report.
const LevelResultReports = 10

// LevelExpireLimit is the level of CommandsExpireArgs.Limit.
const LevelExpireLimit = 8

// LevelWarm is the level of Report.Warm.
const LevelWarm = 7

// LevelTroubleshooting is the level of ReportArgs.OOMStops and
// WorkspaceResultArgs.NotOnNode.
const LevelTroubleshooting = 5

// LevelPlacementCounts is the level of Entry.CountPlacements (released
// with LevelTroubleshooting).
const LevelPlacementCounts = 5

// LevelEndedRounds is the level of ReportArgs.Rounds.
const LevelEndedRounds = 4

// opLevels are the ops above level 1, by the level that introduced them.
var opLevels = map[string]int{
	OpVolumeCreate: 2, OpVolumeResize: 2, OpVolumeDelete: 2, OpVolumeResult: 2,
	OpWorkspacePause:  3,
	OpTemplatePublish: LevelArtifacts, OpTemplateDelete: LevelArtifacts,
	OpPlatformPublish: LevelArtifacts, OpPlatformApprove: LevelArtifacts, OpPlatformWithdraw: LevelArtifacts,
	OpTransferExport: LevelArtifacts, OpTransferResult: LevelArtifacts, OpTransferDelete: LevelArtifacts, OpTransferProgress: LevelArtifacts,
	OpOperatorIssue: LevelOperators, OpOperatorRevoke: LevelOperators,
	OpCARotateBegin: LevelCARotation, OpCARotateSign: LevelCARotation, OpCARotateFinish: LevelCARotation,
	OpNamespaceCreate: LevelNamespaces, OpNamespaceDelete: LevelNamespaces, OpAPIKeyCreate: LevelNamespaces, OpAPIKeyRevoke: LevelNamespaces, OpNamespaceQuota: LevelNamespaces, OpAPIKeyUsed: LevelNamespaces,
	OpWorkspaceSetTimeout: LevelLifetimes, OpWorkspaceTimedOut: LevelLifetimes, OpNamespaceDefaults: LevelLifetimes,
	OpWorkspaceIdlePause: LevelLifetimes,
}

// OpLevel is the level an op needs of every voter.
func OpLevel(op string) int {
	if l, ok := opLevels[op]; ok {
		return l
	}
	return 1
}

// MemberLevelArgs records the level and release of a ctrl member's build,
// as the leader found it.
type MemberLevelArgs struct {
	NodeID  string `json:"node_id"`
	Level   int    `json:"level"`
	Release string `json:"release"`
}

// MemberLevel is a member's recorded level.
type MemberLevel struct {
	NodeID     string    `json:"node_id"`
	Level      int       `json:"level"`
	Release    string    `json:"release"`
	RecordedAt time.Time `json:"recorded_at"`
}

func applyMemberLevel(ac *applyCtx) (any, error) {
	var a MemberLevelArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := ValidNodeID(a.NodeID); err != nil {
		return nil, err
	}
	if a.Level < 1 || a.Level > 1<<20 || len(a.Release) > 64 {
		return nil, api.Errorf(api.CodeInvalidArgument, "member %s: level %d or release %q out of range", a.NodeID, a.Level, a.Release)
	}
	if n, err := mustNode(ac.tx, a.NodeID); err != nil {
		return nil, err
	} else if !n.HasRole(api.RoleCtrl) {
		return nil, api.Errorf(api.CodeFailedPrecondition, "node %s is not a ctrl member: only voters' levels count", a.NodeID)
	}
	rec := MemberLevel{NodeID: a.NodeID, Level: a.Level, Release: a.Release, RecordedAt: *at(ac.e)}
	return rec, putJSON(ac.tx, bucketMemberLevels, []byte(a.NodeID), rec)
}

// MemberLevels returns the recorded levels of the given members; one
// without a record is level 1 (a build from before feature levels).
func MemberLevels(tx *bolt.Tx, ids []string) ([]MemberLevel, error) {
	out := make([]MemberLevel, 0, len(ids))
	for _, id := range ids {
		m := MemberLevel{NodeID: id, Level: 1}
		if _, err := getJSON(tx, bucketMemberLevels, []byte(id), &m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeID < out[j].NodeID })
	return out, nil
}

// CheckOpLevel refuses op while a member among levels is below the level
// op needs: that voter could not apply it.
func CheckOpLevel(op string, levels []MemberLevel) error {
	return CheckLevel(op, OpLevel(op), levels)
}

// CheckLevel refuses what (an op, or a new rule of one) while a member
// among levels is below need.
func CheckLevel(what string, need int, levels []MemberLevel) error {
	for _, m := range levels {
		if m.Level < need {
			rel := m.Release
			if rel == "" {
				rel = "a build from before feature levels"
			}
			return api.Errorf(api.CodeFailedPrecondition,
				"%s needs every ctrl voter at feature level %d, and voter %s runs %s at level %d: finish the rolling upgrade of the ctrl members, then retry", what, need, m.NodeID, rel, m.Level)
		}
	}
	return nil
}
