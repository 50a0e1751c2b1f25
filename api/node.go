package api

import (
	"strings"
	"time"
)

// Node statuses derived by ctrl from the registration record.
const (
	NodeReady    = "READY"
	NodeNotReady = "NOT_READY"
	NodeDraining = "DRAINING"
	NodeDrained  = "DRAINED"
	NodeIsolated = "ISOLATED"
	NodeRetired  = "RETIRED"
	NodeRevoked  = "REVOKED"
)

// Admission values of a node registration.
const (
	Admitted = "admitted"
	Revoked  = "revoked"
)

// Roles a member can have. Operator is never alone: it marks a ctrl or
// node member whose host also holds an operator credential (tls/admin.*).
const (
	RoleCtrl     = "ctrl"
	RoleNode     = "node"
	RoleOperator = "operator"
)

// Node is the registration record of one member as ctrl stores it, plus the
// fields ctrl derives when it is read (status, schedulable, overcommit).
type Node struct {
	NodeID              string     `json:"node_id"`
	Roles               []string   `json:"roles"`
	Address             string     `json:"address"`
	Admission           string     `json:"admission"`
	AdmittedAt          time.Time  `json:"admitted_at"`
	Status              string     `json:"status"`
	DrainRequested      bool       `json:"drain_requested"`
	DrainRequestedAt    *time.Time `json:"drain_requested_at,omitempty"`
	Isolated            bool       `json:"isolated"`
	IsolatedIncarnation uint64     `json:"isolated_incarnation,omitempty"`
	IsolatedAt          *time.Time `json:"isolated_at,omitempty"`
	Retired             bool       `json:"retired"`
	RetiredAt           *time.Time `json:"retired_at,omitempty"`
	RegistrationVersion uint64     `json:"registration_version"`
	// LastIncarnation is the highest incarnation ctrl has seen; an older one
	// reconnecting is refused.
	LastIncarnation    uint64              `json:"last_incarnation"`
	Release            string              `json:"release"`
	Revision           string              `json:"revision"`
	Session            *Session            `json:"session"`
	Report             *Report             `json:"report"`
	HostUsage          *HostUsage          `json:"host_usage,omitempty"`
	OvercommitOverride *OvercommitOverride `json:"overcommit_override,omitempty"`
	OvercommitAck      *Multipliers        `json:"overcommit_acknowledged,omitempty"`
	// Derived on read.
	Overcommit  *Overcommit `json:"overcommit,omitempty"`
	Schedulable *Resources  `json:"schedulable,omitempty"`
	// MemoryTight is HostUsage.MemoryTight in a node list, which leaves
	// HostUsage out (only a node's get shows it); nil where HostUsage
	// would be nil.
	MemoryTight *bool `json:"memory_tight,omitempty"`
}

// HasRole reports whether the node has the role.
func (n *Node) HasRole(role string) bool {
	for _, r := range n.Roles {
		if r == role {
			return true
		}
	}
	return false
}

// Session is the latest control session of a node.
type Session struct {
	Incarnation uint64     `json:"incarnation"`
	SessionID   string     `json:"session_id"`
	Release     string     `json:"release"`
	Revision    string     `json:"revision"`
	Alive       bool       `json:"alive"`
	StartedAt   time.Time  `json:"started_at"`
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	EndReason   string     `json:"end_reason,omitempty"`
	Clock       *Clock     `json:"clock,omitempty"`
}

// MaxClockSkew is the allowed node clock skew: beyond it (skew minus
// uncertainty) the node takes no new Workspaces.
const MaxClockSkew = 30 * time.Second

// Clock is ctrl's latest measurement of the node clock (node minus ctrl).
type Clock struct {
	OffsetNS      int64     `json:"offset_ns"`
	UncertaintyNS int64     `json:"uncertainty_ns"`
	MeasuredAt    time.Time `json:"measured_at"`
	Over          bool      `json:"over"`
	// KernelSync is what the node's kernel says of its time synchronization
	// (adjtimex): synchronized, unsynchronized or unknown.
	KernelSync string `json:"kernel_sync"`
}

// ClockOver applies the 30 s rule: offset beyond the bound even after
// giving the measurement the benefit of its uncertainty.
func ClockOver(offsetNS, uncertaintyNS int64) bool {
	if offsetNS < 0 {
		offsetNS = -offsetNS
	}
	return offsetNS-uncertaintyNS > int64(MaxClockSkew)
}

// Resources is an amount of CPU (cores, three decimals) and memory.
type Resources struct {
	CPU         Milli  `json:"cpu"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// Report is the latest full report of a node.
type Report struct {
	ReportVersion  uint64    `json:"report_version"`
	ReportedAt     time.Time `json:"reported_at"`
	Capacity       Resources `json:"capacity"`
	Allocated      Resources `json:"allocated"`
	Instances      int       `json:"instances"`
	Volumes        int       `json:"volumes"`
	RetainedLayers int       `json:"retained_layers"`
	Pools          []Pool    `json:"pools"`
	// InstanceStates is the node's view of each Instance it holds; ctrl
	// fails a Workspace whose Instance the node reports FAILED.
	InstanceStates []InstanceState `json:"instance_states,omitempty"`
	// DefaultPool is the pool the node creates retained layers in; empty
	// means "default", the node's private pool.
	DefaultPool string `json:"default_pool,omitempty"`
	// Ended lists Instances that ended on the node and whose records it
	// keeps until ctrl stored the cleanup conclusion (at most 100).
	Ended []EndedInstance `json:"ended,omitempty"`
	// EndedComplete: Ended is every record the node keeps, but those ctrl
	// said it does not recognize, and the list was taken after every
	// answer the node sent before this report; ctrl then takes the record
	// of a released Instance missing from it as deleted.
	EndedComplete bool `json:"ended_complete,omitempty"`
	// Templates are the names of the templates built on the node; ctrl
	// places a Workspace only where its template is.
	Templates []string `json:"templates,omitempty"`
	// TemplateBytes is each template's image size: what a new retained
	// layer over it may grow to, charged to the pool it goes to.
	TemplateBytes map[string]uint64 `json:"template_bytes,omitempty"`
	// TemplateDigests are the image digests of the templates the node
	// holds a verified copy of (published or fetched through the artifact
	// store): the catalog's NODES.
	TemplateDigests []string `json:"template_digests,omitempty"`
	// DataPlaneAddress is where the node's data-plane process listens.
	DataPlaneAddress string `json:"data_plane_address,omitempty"`
	// Resume is what the node's VMM can restore (paused Workspaces).
	Resume *ResumeInfo `json:"resume,omitempty"`
	// Warm are the node's warm guests, by template ([templates.NAME]
	// warm = N in its configuration).
	Warm []WarmGuests `json:"warm,omitempty"`
}

// WarmGuests are one template's warm guests on a node: pre-booted,
// paused guests the first start of a Workspace of that template and size
// restores instead of booting.
type WarmGuests struct {
	Template    string `json:"template"`
	Wanted      int    `json:"wanted"`
	Ready       int    `json:"ready"`
	CPU         Milli  `json:"cpu"`
	MemoryBytes uint64 `json:"memory_bytes"`
	// Starts counts the starts that adopted one since the node started.
	Starts uint64 `json:"starts"`
	// Error says why none can be made now (no template here yet, the
	// last boot failed).
	Error string `json:"error,omitempty"`
}

// Bounds of a node's warm guests.
const (
	MaxWarmTemplates = 64
	MaxWarmGuests    = 64
)

// CheckWarm bounds what a report says of warm guests.
func CheckWarm(node string, warm []WarmGuests) error {
	if len(warm) > MaxWarmTemplates {
		return Errorf(CodeInvalidArgument, "report of node %s lists warm guests of %d templates: at most %d", node, len(warm), MaxWarmTemplates)
	}
	for _, w := range warm {
		if err := ValidTemplateName(w.Template); err != nil {
			return Errorf(CodeInvalidArgument, "report of node %s: warm guests of template %.80q: %v", node, w.Template, err)
		}
		if w.Wanted < 0 || w.Wanted > MaxWarmGuests || w.Ready < 0 || w.Ready > MaxWarmGuests || len(w.Error) > 1024 {
			return Errorf(CodeInvalidArgument, "report of node %s: warm guests of template %s: %d wanted, %d ready, an error of %d bytes: out of bounds", node, w.Template, w.Wanted, w.Ready, len(w.Error))
		}
	}
	return nil
}

// EndedInstance is the node's record of an Instance it released.
type EndedInstance struct {
	InstanceID string    `json:"instance_id"`
	EndedAt    time.Time `json:"ended_at"`
	How        string    `json:"how"`
}

// InstanceState is one Instance as its node reports it.
type InstanceState struct {
	InstanceID string `json:"instance_id"`
	State      string `json:"state"` // STARTING, RUNNING, STOPPING, STOPPED, FAILED
	Error      string `json:"error,omitempty"`
	// DeniedPackets are the guest's packets its rule table dropped since
	// the Instance started. It travels with reports that are sent anyway
	// (a state change, ctrl's periodic sync): a count alone sends none.
	DeniedPackets uint64 `json:"denied_packets,omitempty"`
	// OOMKilled (FAILED): host OOM killed the VMM (its unit's result
	// oom-kill), as opposed to any other unexpected exit.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// GuestNotResponding (RUNNING): the node has no session with the guest
	// agent, or has not yet handed it this run's configuration (after a
	// takeover); it retries with backoff.
	GuestNotResponding bool `json:"guest_not_responding,omitempty"`
	// IdleSeconds (RUNNING): how long, by the node's own count, the
	// Instance had no data-plane connection and its guest's CPU stayed
	// low when the report was built; 0 while it is in use. A duration,
	// not a time, so the node's clock never moves an idle pause.
	IdleSeconds int64 `json:"idle_seconds,omitempty"`
}

// DefaultPoolOf is the pool node creates retained layers and Volumes in.
func DefaultPoolOf(node string, r *Report) string {
	if r == nil {
		return PrivatePoolID(node)
	}
	return NormalizePoolID(node, r.DefaultPool)
}

// IsDefaultPoolOf says whether id is DefaultPoolOf(node, r), without
// building that (placement asks it of every node for every Workspace).
func IsDefaultPoolOf(id, node string, r *Report) bool {
	if r != nil && r.DefaultPool != "" && r.DefaultPool != LegacyPrivatePool {
		return id == r.DefaultPool
	}
	return len(id) == len(node)+len(privatePoolSuffix) && strings.HasPrefix(id, node) && strings.HasSuffix(id, privatePoolSuffix)
}

// Pool is a storage pool as a node reports it.
type Pool struct {
	PoolID    string `json:"pool_id"`
	Path      string `json:"path"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Shared pools are reachable by every node that reports them under the
	// same id; a private pool is its node's alone.
	Shared        bool   `json:"shared,omitempty"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	FreeBytes     uint64 `json:"free_bytes"`
}

// HostUsage is the node's latest host usage sample; nil items could not be
// read and are shown as "-". Field for field the same as agent/hostusage.Usage.
type HostUsage struct {
	SampledAt            time.Time  `json:"sampled_at"`
	VMCPUCores           *float64   `json:"vm_cpu_cores,omitempty"`
	VMMemoryBytes        *uint64    `json:"vm_memory_bytes,omitempty"`
	MemoryTotalBytes     *uint64    `json:"memory_total_bytes,omitempty"`
	MemoryAvailableBytes *uint64    `json:"memory_available_bytes,omitempty"`
	MemoryTight          bool       `json:"memory_tight"`
	MemoryTightSince     *time.Time `json:"memory_tight_since,omitempty"`
	CPUIdle              *float64   `json:"cpu_idle,omitempty"`
	CPUPressureSome      *float64   `json:"cpu_pressure_some,omitempty"`
	CPUPressureFull      *float64   `json:"cpu_pressure_full,omitempty"`
	MemoryPressureSome   *float64   `json:"memory_pressure_some,omitempty"`
	MemoryPressureFull   *float64   `json:"memory_pressure_full,omitempty"`
}

// Multipliers is a pair of overcommit multipliers.
type Multipliers struct {
	CPU    Milli `json:"cpu"`
	Memory Milli `json:"memory"`
}

// MaxMultiplier is the largest overcommit multiplier (16).
const MaxMultiplier Milli = 16000

// OvercommitDefault is the cluster-wide default with its expected version.
type OvercommitDefault struct {
	CPU     Milli  `json:"cpu"`
	Memory  Milli  `json:"memory"`
	Version uint64 `json:"version"`
}

// OvercommitOverride is a node's own multipliers; nil items follow the default.
type OvercommitOverride struct {
	CPU    *Milli `json:"cpu,omitempty"`
	Memory *Milli `json:"memory,omitempty"`
}

// Overcommit is the effective multipliers of a node and where they come from.
type Overcommit struct {
	CPU          Milli  `json:"cpu"`
	CPUSource    string `json:"cpu_source"`
	Memory       Milli  `json:"memory"`
	MemorySource string `json:"memory_source"`
	// Acknowledged is false until the node has confirmed these values; ctrl
	// places nothing on the node until then.
	Acknowledged bool `json:"acknowledged"`
}

// Grant is an enrollment grant as listed (the secret is never stored).
type Grant struct {
	NodeID    string     `json:"node_id"`
	Roles     []string   `json:"roles"`
	IssuedAt  time.Time  `json:"issued_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	State     string     `json:"state"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	UsedBy    string     `json:"used_by,omitempty"`
}

// Grant states.
const (
	GrantPending = "pending"
	GrantUsed    = "used"
	GrantRevoked = "revoked"
	GrantExpired = "expired"
)

// IsolateResult is what isolate released.
type IsolateResult struct {
	NodeID                 string `json:"node_id"`
	VolumesReleased        int    `json:"volumes_released"`
	RetainedLayersReleased int    `json:"retained_layers_released"`
	WorkspacesFailed       int    `json:"workspaces_failed"`
	CommandsFailed         int    `json:"commands_failed"`
}

// NodeList is one page of nodes.
type NodeList struct {
	Nodes         []Node `json:"nodes"`
	NextPageToken string `json:"next_page_token,omitempty"`
}
