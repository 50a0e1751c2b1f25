package api

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Storage pools at ctrl. A pool is declared by the nodes that configure it
// and exists at ctrl with what only ctrl can decide: its capacity (the
// room its objects may take) and which objects it holds. Every node also
// has a private pool under its storage root, "<node_id>:default".

// privatePoolSuffix ends the id of a node's private pool.
const privatePoolSuffix = ":default"

// LegacyPrivatePool is how nodes of earlier builds name their private
// pool in reports and layer records; ctrl reads it as PrivatePoolID.
const LegacyPrivatePool = "default"

// MaxPoolsPerNode bounds a report's pool list.
const MaxPoolsPerNode = 64

// MaxPoolCapacity bounds set-capacity (1 EiB): sums of objects never
// overflow.
const MaxPoolCapacity = uint64(1) << 60

var (
	poolIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	nodePart      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
)

// PrivatePoolID is the id of node's private pool.
func PrivatePoolID(node string) string { return node + privatePoolSuffix }

// PrivatePoolOwner is the node whose private pool id is, "" for a
// configured pool id.
func PrivatePoolOwner(id string) string {
	if n, ok := strings.CutSuffix(id, privatePoolSuffix); ok && nodePart.MatchString(n) {
		return n
	}
	return ""
}

// ValidPoolID checks a pool id: 1-63 lowercase letters, digits, '.', '_'
// or '-', or the private pool id of a node ("node-a:default", which another
// host declares when the disk of that pool was moved to it).
func ValidPoolID(id string) error {
	if poolIDPattern.MatchString(id) || PrivatePoolOwner(id) != "" {
		return nil
	}
	return Errorf(CodeInvalidArgument, "storage pool id %q is not valid: use 1-63 lowercase letters, digits, '.', '_' or '-' (or NODE:default for a node's private pool)", id)
}

// NormalizePoolID maps the legacy private pool name of node to its id.
func NormalizePoolID(node, id string) string {
	if id == LegacyPrivatePool || id == "" {
		return PrivatePoolID(node)
	}
	return id
}

// LayerPoolID is the pool a layer record is in, legacy names resolved.
func LayerPoolID(l *LayerRight) string { return NormalizePoolID(l.NodeID, l.PoolID) }

// StoragePool is a pool as ctrl shows it.
type StoragePool struct {
	PoolID  string `json:"pool_id"`
	Version uint64 `json:"version"`
	// Shared is the first declaration's: every member reaches the same
	// files (a shared filesystem).
	Shared bool `json:"shared"`
	// CapacityBytes is ctrl's attribute; nil: not set, no new objects.
	CapacityBytes *uint64 `json:"capacity_bytes"`
	UsedBytes     uint64  `json:"used_bytes"`
	// AvailableBytes is capacity minus used (never below 0); nil without
	// a capacity.
	AvailableBytes *uint64 `json:"available_bytes"`
	Layers         int     `json:"retained_layers"`
	Volumes        int     `json:"volumes"`
	// Nodes are the members: admitted nodes, not retired or revoked, whose
	// latest report declares the pool as the pool is (shared or not).
	Nodes []PoolMember `json:"nodes"`
	// Conflicting are nodes declaring the pool with the other sharing; they
	// are not members until their configuration agrees.
	Conflicting []string  `json:"conflicting_nodes,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// PoolMember is one member node as its latest report shows the pool.
type PoolMember struct {
	NodeID     string    `json:"node_id"`
	Available  bool      `json:"available"`
	Reason     string    `json:"reason,omitempty"`
	Path       string    `json:"path"`
	FreeBytes  uint64    `json:"free_bytes"`
	ReportedAt time.Time `json:"reported_at"`
}

// AvailableMember reports whether any member reports the pool available.
func (p *StoragePool) AvailableMember() bool {
	for _, m := range p.Nodes {
		if m.Available {
			return true
		}
	}
	return false
}

// StoragePoolList is one page of pools, by id.
type StoragePoolList struct {
	Pools         []StoragePool `json:"pools"`
	NextPageToken string        `json:"next_page_token,omitempty"`
}

// PoolCapacityRequest sets a pool's capacity.
type PoolCapacityRequest struct {
	WriteMeta
	CapacityBytes uint64 `json:"capacity_bytes"`
}

// PoolDeclareLostRequest ends every object of a pool without members.
type PoolDeclareLostRequest struct {
	WriteMeta
	ConfirmDataLost bool `json:"confirm_data_lost"`
}

// PoolLostResult is what declare-lost ended.
type PoolLostResult struct {
	PoolID         string   `json:"pool_id"`
	RetainedLayers int      `json:"retained_layers_lost"`
	Volumes        int      `json:"volumes_lost"`
	Workspaces     []string `json:"workspaces"`
}

// PoolRoomError says why an object of size bytes cannot go to pool p.
func PoolRoomError(p *StoragePool, what string, size uint64) error {
	if p.CapacityBytes == nil {
		return Errorf(CodeResourceExhausted, "storage pool %s has no capacity set and accepts no new objects: set it with kibo storage-pool set-capacity %s SIZE", p.PoolID, p.PoolID)
	}
	return Errorf(CodeResourceExhausted, "storage pool %s cannot take %s of %s: %s of %s available; free room or raise it with kibo storage-pool set-capacity %s SIZE",
		p.PoolID, what, FormatBytes(size), FormatBytes(*p.AvailableBytes), FormatBytes(*p.CapacityBytes), p.PoolID)
}

// FormatBytes shows bytes in the largest binary unit with one decimal
// ("1.5GiB"); the CLI and error messages print sizes with it.
func FormatBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, i := float64(n), 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}
