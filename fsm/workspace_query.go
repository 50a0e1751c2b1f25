package fsm

import (
	"bytes"
	"fmt"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// GetWorkspace returns one Workspace, or not_found.
func GetWorkspace(tx *bolt.Tx, id string) (*api.Workspace, error) {
	return mustWorkspace(tx, id)
}

// ViewWorkspace is GetWorkspace for a reader: with what its node last
// reported of the current Instance (denied packets, idleness).
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
			w.Idle = idleOf(st, n.Report.ReportedAt)
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
	// Namespace, when set, selects the Workspaces of that namespace
	// (by name: default for those without one).
	Namespace *string
}

func (f *WorkspaceFilter) match(w *api.Workspace) bool {
	if f.Namespace != nil && api.StoredNamespace(*f.Namespace) != w.Namespace {
		return false
	}
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
		if n, err := getRecord[api.Node](tx, bucketNodes, []byte(f.NodeID)); err != nil {
			return nil, err
		} else if n == nil {
			return nil, api.Errorf(api.CodeNotFound, "node %s is not registered: check the id with kibo node list", f.NodeID)
		}
	}
	if f.Namespace != nil && api.StoredNamespace(*f.Namespace) != "" {
		return listNamespaceWorkspaces(tx, f, pageSize, pageToken, out)
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

// listNamespaceWorkspaces is ListWorkspaces of one namespace other than
// default: its index lists its Workspaces by id, so a tenant's list reads
// its own records, not every Workspace of the cluster.
func listNamespaceWorkspaces(tx *bolt.Tx, f WorkspaceFilter, pageSize int, pageToken string, out *api.WorkspaceList) (*api.WorkspaceList, error) {
	prefix := nsObjectKey(api.StoredNamespace(*f.Namespace), nsKindWorkspace, "")
	c := tx.Bucket(bucketNamespaceObjects).Cursor()
	k, _ := c.Seek(append(bytes.Clone(prefix), pageToken...))
	if pageToken != "" && k != nil && string(k[len(prefix):]) == pageToken {
		k, _ = c.Next()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		w, err := getWorkspace(tx, string(k[len(prefix):]))
		if err != nil {
			return nil, err
		}
		if w == nil || !f.match(w) {
			continue
		}
		if pageSize > 0 && len(out.Workspaces) == pageSize {
			out.NextPageToken = out.Workspaces[len(out.Workspaces)-1].WorkspaceID
			break
		}
		out.Workspaces = append(out.Workspaces, *w)
	}
	return out, nil
}
