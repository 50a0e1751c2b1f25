package fsm

import (
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with plain structs
	}
	return b
}

// deriveStatus is the node status ctrl shows; it depends only on the record.
func deriveStatus(n *api.Node, h Holds) string {
	switch {
	case n.Retired:
		return api.NodeRetired
	case n.Admission != api.Admitted:
		return api.NodeRevoked
	case n.Isolated:
		return api.NodeIsolated
	case n.DrainRequested && holdsNothing(n, h):
		return api.NodeDrained
	case n.DrainRequested:
		return api.NodeDraining
	case n.Session != nil && n.Session.Alive:
		return api.NodeReady
	default:
		return api.NodeNotReady
	}
}

// holdsNothing: no Instance running, no Volume or retained layer use right,
// neither by the node's report nor by ctrl's own records.
func holdsNothing(n *api.Node, h Holds) bool {
	if h.Instances > 0 || h.Layers > 0 || h.Volumes > 0 {
		return false
	}
	r := n.Report
	return r == nil || (r.Instances == 0 && r.Volumes == 0 && r.RetainedLayers == 0)
}

// view fills the derived fields of a node.
func view(tx *bolt.Tx, n *api.Node) (*api.Node, error) {
	d, err := getOvercommitDefault(tx)
	if err != nil {
		return nil, err
	}
	h, err := nodeHolds(tx, n.NodeID)
	if err != nil {
		return nil, err
	}
	return viewWithHolds(d, n, h), nil
}

// viewWithHolds derives with an already-read default (lists read it once).
func viewWithHolds(d api.OvercommitDefault, n *api.Node, h Holds) *api.Node {
	out := *n
	out.Status = deriveStatus(n, h)
	// Host usage is what the node sampled while its control session is
	// alive: without one it is history, shown as unknown (the record
	// keeps it; placement never uses a node without a session).
	if n.Session == nil || !n.Session.Alive {
		out.HostUsage = nil
	}
	o := overcommitOf(d, n)
	out.Overcommit = &o
	if n.Report != nil {
		out.Schedulable = &api.Resources{
			CPU:         api.Milli(o.CPU.Scale(uint64(n.Report.Capacity.CPU))),
			MemoryBytes: o.Memory.Scale(n.Report.Capacity.MemoryBytes),
		}
	}
	return &out
}

// overcommitOf is the node's overcommit: its override over the default,
// and whether the node acknowledged it.
func overcommitOf(d api.OvercommitDefault, n *api.Node) api.Overcommit {
	o := api.Overcommit{CPU: d.CPU, CPUSource: "default", Memory: d.Memory, MemorySource: "default"}
	if n.OvercommitOverride != nil {
		if c := n.OvercommitOverride.CPU; c != nil {
			o.CPU, o.CPUSource = *c, "node"
		}
		if m := n.OvercommitOverride.Memory; m != nil {
			o.Memory, o.MemorySource = *m, "node"
		}
	}
	o.Acknowledged = n.OvercommitAck != nil && n.OvercommitAck.CPU == o.CPU && n.OvercommitAck.Memory == o.Memory
	return o
}

// GetNode returns one node with derived fields, or not_found.
func GetNode(tx *bolt.Tx, id string) (*api.Node, error) {
	n, err := mustNode(tx, id)
	if err != nil {
		return nil, err
	}
	return view(tx, n)
}

// SessionCheck is what a node's control session checks of the node at
// every ping (cluster/session.go), read without the node's report.
type SessionCheck struct {
	// Admitted: admitted and not retired.
	Admitted bool
	// SessionID is the node's live or latest session, "" for none.
	SessionID string
	// Overcommit is derived as GetNode derives it.
	Overcommit api.Overcommit
}

// GetSessionCheck is GetNode's answers to SessionCheck without decoding
// the node's report and host usage, most of a node record: the leader
// asks it for every node every ping interval.
func GetSessionCheck(tx *bolt.Tx, id string) (SessionCheck, error) {
	var n struct {
		api.Node
		// Shadow the embedded fields: skipped, not decoded.
		Report    *struct{} `json:"report"`
		HostUsage *struct{} `json:"host_usage"`
	}
	if err := nodeFields(tx, id, &n); err != nil {
		return SessionCheck{}, err
	}
	d, err := getOvercommitDefault(tx)
	if err != nil {
		return SessionCheck{}, err
	}
	c := SessionCheck{Admitted: n.Admission == api.Admitted && !n.Retired, Overcommit: overcommitOf(d, &n.Node)}
	if n.Session != nil {
		c.SessionID = n.Session.SessionID
	}
	return c, nil
}

// NodeDrainRequested is GetNode's DrainRequested without decoding the rest
// of the record: a control session reads it at every command pass, and at
// hundreds of creates a second the whole decode was most of that pass.
func NodeDrainRequested(tx *bolt.Tx, id string) (bool, error) {
	var n struct {
		DrainRequested bool `json:"drain_requested"`
	}
	err := nodeFields(tx, id, &n)
	return n.DrainRequested, err
}

// ListNodes returns up to pageSize nodes ordered by node id, starting after
// the node id in pageToken; NextPageToken is set when more remain. A list
// leaves host usage out (the product shows it in a node's get only) and
// carries just whether memory is tight, its MEM_TIGHT column; of a record's
// host usage it decodes only that.
func ListNodes(tx *bolt.Tx, pageSize int, pageToken string) (*api.NodeList, error) {
	out := &api.NodeList{Nodes: []api.Node{}}
	c := tx.Bucket(bucketNodes).Cursor()
	var k, v []byte
	if pageToken == "" {
		k, v = c.First()
	} else {
		k, v = c.Seek([]byte(pageToken))
		if k != nil && string(k) == pageToken {
			k, v = c.Next()
		}
	}
	d, err := getOvercommitDefault(tx)
	if err != nil {
		return nil, err
	}
	for ; k != nil; k, v = c.Next() {
		if pageSize > 0 && len(out.Nodes) == pageSize {
			out.NextPageToken = string(out.Nodes[len(out.Nodes)-1].NodeID)
			break
		}
		var rec struct {
			api.Node
			// Shadows the embedded field.
			HostUsage *struct {
				MemoryTight bool `json:"memory_tight"`
			} `json:"host_usage"`
		}
		if err := json.Unmarshal(v, &rec); err != nil {
			return nil, err
		}
		n := rec.Node
		if rec.HostUsage != nil {
			n.HostUsage = &api.HostUsage{MemoryTight: rec.HostUsage.MemoryTight}
		}
		h, err := nodeHolds(tx, n.NodeID)
		if err != nil {
			return nil, err
		}
		vn := viewWithHolds(d, &n, h)
		// After the view: it drops the usage of a node without a session.
		if vn.HostUsage != nil {
			tight := vn.HostUsage.MemoryTight
			vn.MemoryTight, vn.HostUsage = &tight, nil
		}
		out.Nodes = append(out.Nodes, *vn)
	}
	return out, nil
}

// GetOvercommitDefault returns the cluster-wide default.
func GetOvercommitDefault(tx *bolt.Tx) (api.OvercommitDefault, error) {
	return getOvercommitDefault(tx)
}

// ListGrants returns every grant; a pending grant past its expiry shows as
// expired relative to now (a read, so the caller's clock is fine here).
func ListGrants(tx *bolt.Tx, now time.Time) ([]api.Grant, error) {
	out := []api.Grant{}
	err := tx.Bucket(bucketGrants).ForEach(func(k, v []byte) error {
		var g grantRecord
		if err := json.Unmarshal(v, &g); err != nil {
			return err
		}
		if g.State == api.GrantPending && !now.Before(g.ExpiresAt) {
			g.State = api.GrantExpired
		}
		out = append(out, g.Grant)
		return nil
	})
	return out, err
}

// ClusterID returns the cluster id, empty before bootstrap.
func ClusterID(tx *bolt.Tx) string {
	return string(tx.Bucket(bucketMeta).Get(keyClusterID))
}

// LiveSessions lists (node id, session id) of sessions marked alive.
func LiveSessions(tx *bolt.Tx) (map[string]string, error) {
	out := map[string]string{}
	err := tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
		var n api.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		if n.Session != nil && n.Session.Alive {
			out[n.NodeID] = n.Session.SessionID
		}
		return nil
	})
	return out, err
}

// NodeAdmission is what authentication needs of a node's registration.
type NodeAdmission struct {
	Admission  string    `json:"admission"`
	AdmittedAt time.Time `json:"admitted_at"`
	Retired    bool      `json:"retired"`
	Roles      []string  `json:"roles"`
}

// Admission reads the admission of a node without the rest of its record
// (every authenticated request asks); ok is false for an unknown node.
func Admission(tx *bolt.Tx, nodeID string) (a NodeAdmission, ok bool, err error) {
	ok, err = getJSON(tx, bucketNodes, []byte(nodeID), &a)
	return a, ok, err
}

// Summary is what a metrics scrape needs of the replica: counts by state,
// each node's last clock measurement and the placement counts.
type Summary struct {
	WorkspacesByState map[string]int
	NodesByStatus     map[string]int
	// Clocks are the nodes' clock offsets (node minus ctrl), by node id,
	// for nodes whose session measured one.
	Clocks map[string]int64
	// Pools are the storage pools' capacity (nil: not set) and use, by id.
	Pools []PoolSummary
	// Placements are the placement counts (placements.go).
	Placements PlacementCounts
}

// PoolSummary is one pool's figures for metrics.
type PoolSummary struct {
	PoolID        string
	CapacityBytes *uint64
	UsedBytes     uint64
}

// slimNode is the part of a node record its status and clock come from:
// decoding only that keeps a scrape of 10,000 nodes cheap.
type slimNode struct {
	NodeID         string `json:"node_id"`
	Admission      string `json:"admission"`
	Retired        bool   `json:"retired"`
	Isolated       bool   `json:"isolated"`
	DrainRequested bool   `json:"drain_requested"`
	Session        *struct {
		Alive bool       `json:"alive"`
		Clock *api.Clock `json:"clock"`
	} `json:"session"`
	Report *struct {
		Instances      int `json:"instances"`
		Volumes        int `json:"volumes"`
		RetainedLayers int `json:"retained_layers"`
	} `json:"report"`
}

// Summarize counts Workspaces by state and nodes by status (the same
// status ListNodes derives) without decoding whole records.
func Summarize(tx *bolt.Tx) (Summary, error) {
	s := Summary{WorkspacesByState: map[string]int{}, NodesByStatus: map[string]int{}, Clocks: map[string]int64{}}
	err := tx.Bucket(bucketWorkspaces).ForEach(func(_, v []byte) error {
		var w struct {
			State string `json:"state"`
		}
		if err := json.Unmarshal(v, &w); err != nil {
			return err
		}
		s.WorkspacesByState[w.State]++
		return nil
	})
	if err != nil {
		return s, err
	}
	err = tx.Bucket(bucketNodes).ForEach(func(_, v []byte) error {
		var sn slimNode
		if err := json.Unmarshal(v, &sn); err != nil {
			return err
		}
		n := &api.Node{NodeID: sn.NodeID, Admission: sn.Admission, Retired: sn.Retired, Isolated: sn.Isolated, DrainRequested: sn.DrainRequested}
		if sn.Session != nil {
			n.Session = &api.Session{Alive: sn.Session.Alive, Clock: sn.Session.Clock}
			if c := sn.Session.Clock; c != nil {
				s.Clocks[sn.NodeID] = c.OffsetNS
			}
		}
		if r := sn.Report; r != nil {
			n.Report = &api.Report{Instances: r.Instances, Volumes: r.Volumes, RetainedLayers: r.RetainedLayers}
		}
		var h Holds
		if n.DrainRequested { // the only status that needs ctrl's own records
			var err error
			if h, err = nodeHolds(tx, n.NodeID); err != nil {
				return err
			}
		}
		s.NodesByStatus[deriveStatus(n, h)]++
		return nil
	})
	if err != nil {
		return s, err
	}
	err = tx.Bucket(bucketPools).ForEach(func(k, v []byte) error {
		var rec poolRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return err
		}
		u, err := poolUse(tx, rec.PoolID)
		s.Pools = append(s.Pools, PoolSummary{PoolID: rec.PoolID, CapacityBytes: rec.CapacityBytes, UsedBytes: u.UsedBytes})
		return err
	})
	if err != nil {
		return s, err
	}
	s.Placements, err = placementCounts(tx)
	return s, err
}
