package fsm

// Every bucket of the state, declared in one place: each table first, the
// indexes derived from it right after it (kept in step by the table's
// put function, e.g. putWorkspace's workspaceDerived).
var (
	bucketMeta     = []byte("meta")     // schema version, cluster id, overcommit default, clock
	bucketNodes    = []byte("nodes")    // node_id → api.Node (stored fields only)
	bucketGrants   = []byte("grants")   // node_id → grant (one pending grant per node id)
	bucketCommands = []byte("commands") // command_id → commandRecord (idempotency)
	// applied_at (Unix ns, 8 bytes big-endian) ‖ sha256(command key) →
	// command key: every command record oldest first, so that expiry
	// reads only what it drops (commands.go). Derived from bucketCommands:
	// rebuilt from it at every Restore.
	bucketCommandTimes = []byte("command_times")
	// applied_at (Unix ns, 8 bytes big-endian) ‖ sha256(command key) →
	// commandRecord: the command log, where entries with
	// Entry.CommandLog keep their records (commandlog.go)
	bucketCommandLog = []byte("command_log")
	// workspace_id → api.Workspace
	bucketWorkspaces = []byte("workspaces")
	// node_id NUL workspace_id → nil: the Workspaces a node runs or holds a layer of
	bucketWorkspaceNodes = []byte("workspace_nodes")
	// node_id NUL workspace_id → nil: the Workspaces whose pending command
	// waits for the node, what its control session sends (pending.go).
	// Derived from bucketWorkspaces: rebuilt from it at a Restore unless
	// marked current (keyWorkspaceCommandsAt).
	bucketWorkspaceCommands = []byte("workspace_commands")
	// node_id → Holds: what the Workspaces' records hold on the node
	bucketNodeHolds = []byte("node_holds")
	// source_id NUL fork_id → nil: each fork whose first start still
	// reads its source Workspace's files (forks.go)
	bucketForks = []byte("forks")

	// workspace_id → its environment, NAME=value sorted by name, for a
	// Workspace that has one (workspaceenv.go; written from
	// LevelWorkspaceEnv on)
	bucketWorkspaceEnv = []byte("workspace_env")

	// workspace_id → deletion time: an id is never used twice, even when
	// its command id comes back after the command record expired
	bucketWorkspaceTombstones = []byte("workspace_tombstones")

	// instance_id → workspace_id of every Instance whose cleanup ctrl has
	// not concluded yet (the node still keeps its ended record); from
	// LevelEndedRounds on, kept after the conclusion until the node's
	// complete list no longer has the record (ended.go)
	bucketInstanceOwners = []byte("instance_owners")

	// name → egressRecord: an Egress object as of its latest revision,
	// without the password
	bucketEgress = []byte("egress")
	// name NUL revision (20 digits) → egressRevision, with its
	// credentials: the latest and every one a Workspace still references
	bucketEgressRevisions = []byte("egress_revisions")
	// name NUL revision (20 digits) NUL workspace_id → nil: the Egress
	// revisions each Workspace's policy (in force or requested) uses
	bucketEgressRefs = []byte("egress_refs")
	// name → resolverRecord
	bucketResolvers = []byte("resolvers")
	// name NUL workspace_id → nil: the Resolver each policy names
	bucketResolverRefs = []byte("resolver_refs")

	// pool_id → poolRecord: a storage pool some node declared
	bucketPools = []byte("pools")
	// pool_id → PoolUse: what ctrl's objects take of it
	bucketPoolUse = []byte("pool_use")
	// pool_id NUL node_id → poolDecl: the node's latest report declares it
	bucketPoolMembers = []byte("pool_members")
	// pool_id NUL workspace_id|volume_id → nil: deletes waiting for a
	// member of the pool to remove the Workspace's or Volume's files
	bucketPoolWaits = []byte("pool_waits")

	// volume_id → api.Volume
	bucketVolumes = []byte("volumes")
	// name → volume_id
	bucketVolumeNames = []byte("volume_names")
	// node_id NUL volume_id → nil: the Volumes whose pending command
	// waits for the node
	bucketVolumeCommands = []byte("volume_commands")
	// volume_id → deletion time: an id is never used twice
	bucketVolumeTombstones = []byte("volume_tombstones")

	// end (Unix ns, 8 bytes big-endian) ‖ workspace_id → nil: every
	// Workspace with an end, soonest first (lifetimes.go). Derived from
	// bucketWorkspaces: rebuilt from it at a Restore unless marked
	// current (keyWorkspaceEndsAt).
	bucketWorkspaceEnds = []byte("workspace_ends")

	// node_id → MemberLevel: the feature level of a ctrl member's build
	bucketMemberLevels = []byte("member_levels")

	// node_id → entry time (RFC 3339) of the node's latest round of
	// ended-Instance records (ended.go; written from LevelEndedRounds on)
	bucketEndedRounds = []byte("ended_rounds")
	// node_id NUL instance_id → endedWatch: an Instance the node reported
	// holding, whose record ctrl expects there until it is deleted
	bucketEndedWatch = []byte("ended_watch")

	// placed, refused, refused/<reason label> → 8-byte big-endian count
	// of placements (placements.go; written from LevelPlacementCounts on)
	bucketPlacements = []byte("placements")

	// name → catalogRecord: a template published to the artifact store
	bucketTemplates = []byte("templates")
	// platform id → platformRecord: a Platform published to the
	// artifact store (platforms.go)
	bucketPlatforms = []byte("platforms")
	// transfer id → transferRecord: an export (transfers.go)
	bucketTransfers = []byte("transfers")
	// name → api.Operator: a person's operator credential (operators.go;
	// written from LevelOperators on)
	bucketOperators = []byte("operators")

	// name → namespaceRecord: every namespace but default (namespaces.go;
	// written from LevelNamespaces on)
	bucketNamespaces = []byte("namespaces")
	// namespace NUL kind NUL id → nil: the Workspaces and Volumes of each
	// namespace but default, kept in step by putWorkspace and putVolume
	bucketNamespaceObjects = []byte("namespace_objects")
	// namespace → api.NamespaceResources: what the objects of each
	// namespace but default take of its quota (quotas.go), kept in step
	// by putWorkspace and putVolume
	bucketNamespaceUsage = []byte("namespace_usage")
	// namespace name (default too) → api.NamespaceCounters (quotas.go)
	bucketNamespaceCounters = []byte("namespace_counters")
	// namespace ("" for default) NUL name → apiKeyRecord (apikeys.go)
	bucketAPIKeys = []byte("api_keys")
	// key id → the key's key in bucketAPIKeys
	bucketAPIKeyIDs = []byte("api_key_ids")

	allBuckets = [][]byte{bucketMeta, bucketNodes, bucketGrants, bucketCommands, bucketCommandTimes, bucketCommandLog, bucketWorkspaces, bucketWorkspaceNodes, bucketWorkspaceCommands, bucketNodeHolds, bucketWorkspaceTombstones, bucketInstanceOwners,
		bucketEgress, bucketEgressRevisions, bucketEgressRefs, bucketResolvers, bucketResolverRefs, bucketPools, bucketPoolUse, bucketPoolMembers, bucketPoolWaits,
		bucketVolumes, bucketVolumeNames, bucketVolumeCommands, bucketVolumeTombstones, bucketMemberLevels, bucketEndedRounds, bucketEndedWatch,
		bucketPlacements, bucketTemplates, bucketPlatforms, bucketTransfers, bucketForks, bucketOperators,
		bucketNamespaces, bucketNamespaceObjects, bucketNamespaceUsage, bucketNamespaceCounters, bucketAPIKeys, bucketAPIKeyIDs,
		bucketWorkspaceEnds, bucketWorkspaceEnv}
)

// Keys of the meta bucket.
var (
	keySchemaVersion = []byte("schema_version")
	keyClusterID     = []byte("cluster_id")
	keyOvercommit    = []byte("overcommit_default")
	// the latest IssuedAt applied (see clampIssuedAt)
	keyClock = []byte("clock")
	// the clock as of which bucketCommandTimes matched bucketCommands
	// (commands.go)
	keyCommandTimesAt = []byte("command_times_at")
	// the clock as of which bucketWorkspaceCommands matched
	// bucketWorkspaces (pending.go)
	keyWorkspaceCommandsAt = []byte("workspace_commands_at")
	// the clock as of which bucketWorkspaceEnds matched bucketWorkspaces
	// (lifetimes.go)
	keyWorkspaceEndsAt = []byte("workspace_ends_at")
)

// SchemaVersion is the version of the state layout this binary reads and
// writes. A state with a higher version is refused at start; lower versions
// are migrated by explicit one-way steps (none exist yet: version 1 is the first).
const SchemaVersion = 1

// CommandRetention is how long a command's result is kept for retries with
// the same --command-id. The leader expires older records every few minutes.
const CommandRetentionHours = 24
