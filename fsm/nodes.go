package fsm

import (
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// mustNode returns the node or not_found.
func mustNode(tx *bolt.Tx, id string) (*api.Node, error) {
	n, err := getRecord[api.Node](tx, bucketNodes, []byte(id))
	if err != nil {
		return nil, err
	}
	if n == nil {
		return nil, api.Errorf(api.CodeNotFound, "node %s is not registered: check the id with kibo node list", id)
	}
	return n, nil
}

// putNode stores a node after bumping its registration version: every
// accepted change to a registration is a new version.
func putNode(ac *applyCtx, n *api.Node) error {
	return putNodeRecord(ac, n, nil)
}

// putNodeRecord is putNode; a report given raw (adminNode) is stored as
// it is in place of n.Report.
func putNodeRecord(ac *applyCtx, n *api.Node, rawReport json.RawMessage) error {
	markNodeChanged(ac, n.NodeID)
	n.RegistrationVersion++
	stored := *n
	stored.Status, stored.Overcommit, stored.Schedulable = "", nil, nil
	if rawReport != nil {
		return putJSON(ac.tx, bucketNodes, []byte(n.NodeID), &adminNode{Node: stored, Report: rawReport})
	}
	return putJSON(ac.tx, bucketNodes, []byte(n.NodeID), &stored)
}

func notRetired(n *api.Node, what string) error {
	if n.Retired {
		return api.Errorf(api.CodeFailedPrecondition, "node %s is retired: %s is not possible; a new host uses a new node id", n.NodeID, what)
	}
	return nil
}

func applyBootstrap(ac *applyCtx) (any, error) {
	var a BootstrapArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if ac.tx.Bucket(bucketMeta).Get(keyClusterID) != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "cluster is already bootstrapped")
	}
	if err := ValidNodeID(a.NodeID); err != nil {
		return nil, err
	}
	if err := ValidRoles(a.Roles); err != nil {
		return nil, err
	}
	// Overwriting a registration made before bootstrap would reset its
	// registration_version (an expected version could then match again).
	if n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(a.NodeID)); err != nil {
		return nil, err
	} else if n != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "node %s is already registered: bootstrap with a new node id", a.NodeID)
	}
	if err := ac.tx.Bucket(bucketMeta).Put(keyClusterID, []byte(a.ClusterID)); err != nil {
		return nil, err
	}
	if err := putUint(ac.tx, bucketMeta, keySchemaVersion, SchemaVersion); err != nil {
		return nil, err
	}
	if err := putJSON(ac.tx, bucketMeta, keyOvercommit, api.OvercommitDefault{CPU: 1000, Memory: 1000, Version: 1}); err != nil {
		return nil, err
	}
	n := &api.Node{NodeID: a.NodeID, Roles: a.Roles, Address: a.Address, Admission: api.Admitted, AdmittedAt: *at(ac.e)}
	return map[string]string{"cluster_id": a.ClusterID}, putNode(ac, n)
}

func applySessionOpen(ac *applyCtx) (any, error) {
	var a SessionOpenArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(a.NodeID))
	if err != nil {
		return nil, err
	}
	refuse := func(reason, format string, args ...any) (any, error) {
		return SessionOpenResult{Refusal: reason, Message: fmt.Sprintf(format, args...)}, nil
	}
	switch {
	case n == nil:
		return refuse(RefusalNotAdmitted, "node %s is not registered in this cluster; join it with an enrollment grant", a.NodeID)
	case n.Isolated && a.Incarnation <= n.IsolatedIncarnation:
		return refuse(RefusalIsolated, "node %s incarnation %d is isolated; destroy every Instance and restart with a new incarnation", a.NodeID, a.Incarnation)
	case n.Retired:
		return refuse(RefusalNotAdmitted, "node %s is retired; a new host uses a new node id", a.NodeID)
	case n.Admission != api.Admitted:
		return refuse(RefusalNotAdmitted, "node %s is revoked; join again with a new enrollment grant", a.NodeID)
	case a.Incarnation < n.LastIncarnation:
		return refuse(RefusalStale, "node %s connected with incarnation %d but %d was already seen; a newer process of this node is running", a.NodeID, a.Incarnation, n.LastIncarnation)
	}
	if n.Isolated {
		// A new incarnation clears isolation: the node destroyed its Instances and restarted.
		n.Isolated, n.IsolatedIncarnation, n.IsolatedAt = false, 0, nil
	}
	n.LastIncarnation = a.Incarnation
	n.Release, n.Revision = a.Release, a.Revision
	if a.Address != "" {
		n.Address = a.Address
	}
	n.Session = &api.Session{Incarnation: a.Incarnation, SessionID: a.SessionID, Release: a.Release, Revision: a.Revision, Alive: true, StartedAt: *at(ac.e)}
	// New values must be acknowledged again by this session.
	n.OvercommitAck = nil
	return SessionOpenResult{Accepted: true}, putNode(ac, n)
}

func applySessionClose(ac *applyCtx) (any, error) {
	var a SessionCloseArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	n, err := mustNode(ac.tx, a.NodeID)
	if err != nil {
		return nil, err
	}
	if n.Session == nil || n.Session.SessionID != a.SessionID || !n.Session.Alive {
		return map[string]bool{"closed": false}, nil
	}
	endSession(n, ac.e, a.Reason)
	return map[string]bool{"closed": true}, putNode(ac, n)
}

func endSession(n *api.Node, e *Entry, reason string) {
	if n.Session != nil && n.Session.Alive {
		n.Session.Alive = false
		n.Session.EndedAt = at(e)
		n.Session.EndReason = reason
	}
}

// currentSession checks that a node-originated write comes from the live session.
func currentSession(tx *bolt.Tx, nodeID, sessionID string) (*api.Node, error) {
	n, err := mustNode(tx, nodeID)
	if err != nil {
		return nil, err
	}
	return n, liveSession(n.Session, nodeID, sessionID)
}

// checkSession is currentSession for a write that leaves the node's
// record as it is (a task's result, a Volume's): it decodes the session
// alone, not the node's whole report.
func checkSession(tx *bolt.Tx, nodeID, sessionID string) error {
	var n struct {
		Session *api.Session `json:"session"`
	}
	if err := nodeFields(tx, nodeID, &n); err != nil {
		return err
	}
	return liveSession(n.Session, nodeID, sessionID)
}

// nodeFields decodes the fields of node id's record that v names, and
// skips the rest (the report, most of a record): for reads on hot paths
// that need a few fields. A node that is not registered is not_found.
func nodeFields(tx *bolt.Tx, id string, v any) error {
	ok, err := getJSON(tx, bucketNodes, []byte(id), v)
	if err == nil && !ok {
		_, err = mustNode(tx, id) // not_found, worded once
	}
	return err
}

func liveSession(s *api.Session, nodeID, sessionID string) error {
	if s == nil || !s.Alive || s.SessionID != sessionID {
		return api.Errorf(api.CodeFailedPrecondition, "session %s of node %s is not the live control session; reconnect", sessionID, nodeID)
	}
	return nil
}

// reportingNode is a node's record as a new report replaces its report:
// of the old report only what the new one is numbered and checked
// against is decoded, not its lists (Instances, templates), which grow
// with the node and which every task's report replaces on every voter.
type reportingNode struct {
	api.Node
	// Shadows the embedded Report.
	Report *struct {
		ReportVersion uint64     `json:"report_version"`
		Pools         []api.Pool `json:"pools"`
	} `json:"report"`
}

func applyNodeReport(ac *applyCtx) (any, error) {
	var a ReportArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	rr, err := nodeReport(ac, &a)
	if err != nil {
		return nil, err
	}
	return rr, nil
}

// nodeReport stores a node's full report, from a report entry or with a
// task result (WorkspaceResultArgs.Report). Like a handler, it writes
// nothing when it returns an *api.Error.
func nodeReport(ac *applyCtx, a *ReportArgs) (ReportResult, error) {
	var rn reportingNode
	if err := nodeFields(ac.tx, a.NodeID, &rn); err != nil {
		return ReportResult{}, err
	}
	n := &rn.Node
	if err := liveSession(n.Session, a.NodeID, a.SessionID); err != nil {
		return ReportResult{}, err
	}
	r := a.Report
	if err := checkReportPools(n.NodeID, &r); err != nil {
		return ReportResult{}, err
	}
	if err := checkReportDigests(n.NodeID, &r); err != nil {
		return ReportResult{}, err
	}
	var oldPools []api.Pool
	r.ReportVersion = 1
	if old := rn.Report; old != nil {
		oldPools, r.ReportVersion = old.Pools, old.ReportVersion+1
	}
	if err := declarePools(ac, n.NodeID, oldPools, &r); err != nil {
		return ReportResult{}, err
	}
	r.ReportedAt = *at(ac.e)
	n.Report = &r
	if a.HostUsage != nil {
		n.HostUsage = a.HostUsage
	}
	if a.Clock != nil {
		n.Session.Clock = &api.Clock{
			OffsetNS: a.Clock.OffsetNS, UncertaintyNS: a.Clock.UncertaintyNS, MeasuredAt: *at(ac.e),
			Over: api.ClockOver(a.Clock.OffsetNS, a.Clock.UncertaintyNS), KernelSync: a.Clock.KernelSync,
		}
	}
	if err := failEndedInstances(ac, n.NodeID, r.InstanceStates, a.OOMStops); err != nil {
		return ReportResult{}, err
	}
	var forget, unrecognized []string
	var err error
	if a.Rounds {
		forget, unrecognized, err = endedRound(ac, n.NodeID, a)
	} else {
		forget, err = concludeEnded(ac, n.NodeID, r.Ended)
	}
	if err != nil {
		return ReportResult{}, err
	}
	if err := resumeDeletes(ac, n); err != nil {
		return ReportResult{}, err
	}
	// The ended records are the node's to keep until concluded, not part
	// of its registration.
	n.Report.Ended, n.Report.EndedComplete = nil, false
	return ReportResult{ReportVersion: r.ReportVersion, Forget: forget, Unrecognized: unrecognized}, putNode(ac, n)
}

func applyNodeDrain(ac *applyCtx) (any, error) {
	return adminNodeChange(ac, "drain", func(n *api.Node) error {
		if !n.DrainRequested {
			n.DrainRequested, n.DrainRequestedAt = true, at(ac.e)
		}
		return nil
	})
}

func applyNodeCancelDrain(ac *applyCtx) (any, error) {
	return adminNodeChange(ac, "cancel-drain", func(n *api.Node) error {
		n.DrainRequested, n.DrainRequestedAt = false, nil
		return nil
	})
}

// adminNodeChange is the common frame of an operator write on one node:
// find it, refuse retired nodes, check the expected version, change, store.
// The answer is the node's view. change gets the node with a report that
// holds only what the node's status and schedulable resources derive
// from (adminNode).
func adminNodeChange(ac *applyCtx, what string, change func(n *api.Node) error) (*adminNode, error) {
	var a NodeArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	return changeAdminNode(ac, a.NodeID, what, change)
}

// changeAdminNode is adminNodeChange for an op whose arguments name the
// node among others.
func changeAdminNode(ac *applyCtx, id, what string, change func(n *api.Node) error) (*adminNode, error) {
	var an adminNode
	if err := nodeFields(ac.tx, id, &an); err != nil {
		return nil, err
	}
	n := &an.Node
	if len(an.Report) > 0 && string(an.Report) != "null" {
		var c reportCounts
		if err := jsonRecord(bucketNodes, []byte(id), an.Report, &c); err != nil {
			return nil, err
		}
		n.Report = &api.Report{Capacity: c.Capacity, Instances: c.Instances, Volumes: c.Volumes, RetainedLayers: c.RetainedLayers}
	} else {
		an.Report = nil
	}
	if err := notRetired(n, what); err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, n.RegistrationVersion, "node "+n.NodeID); err != nil {
		return nil, err
	}
	if err := change(n); err != nil {
		return nil, err
	}
	if err := putNodeRecord(ac, n, an.Report); err != nil {
		return nil, err
	}
	v, err := view(ac.tx, n)
	if err != nil {
		return nil, err
	}
	return &adminNode{Node: *v, Report: an.Report}, nil
}

// adminNode is a node record as an operator write reads and stores it,
// and its answer: the report, most of a running node's record and
// replaced only by the node's own reports, is carried as stored instead
// of being decoded and encoded again at every write.
type adminNode struct {
	api.Node
	Report json.RawMessage `json:"report"` // shadows the embedded Report
}

// reportCounts decodes of a report what a node's view derives from: its
// capacity (schedulable resources) and what it holds (DRAINED).
type reportCounts struct {
	Capacity       api.Resources `json:"capacity"`
	Instances      int           `json:"instances"`
	Volumes        int           `json:"volumes"`
	RetainedLayers int           `json:"retained_layers"`
}

func applyNodeIsolate(ac *applyCtx) (any, error) {
	var res api.IsolateResult
	_, err := adminNodeChange(ac, "isolate", func(n *api.Node) error {
		if n.Session != nil && n.Session.Alive {
			return api.Errorf(api.CodeFailedPrecondition,
				"node %s still has a live control session (%s); isolate only a host that is shut down or cut off from its storage", n.NodeID, n.Session.SessionID)
		}
		n.Isolated = true
		n.IsolatedIncarnation = n.LastIncarnation
		n.IsolatedAt = at(ac.e)
		res.NodeID = n.NodeID
		return releaseIsolated(ac, n.NodeID, &res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func applyNodeRetire(ac *applyCtx) (any, error) {
	return adminNodeChange(ac, "retire", func(n *api.Node) error {
		h, err := nodeHolds(ac.tx, n.NodeID)
		if err != nil {
			return err
		}
		status := deriveStatus(n, h)
		if status != api.NodeDrained && !n.Isolated {
			return api.Errorf(api.CodeFailedPrecondition,
				"node %s is %s: retire accepts only a DRAINED node or one whose incarnation is isolated; drain and empty it first (kibo node drain %s --wait)", n.NodeID, status, n.NodeID)
		}
		n.Retired, n.RetiredAt = true, at(ac.e)
		endSession(n, ac.e, "retired")
		if err := releaseRetired(ac, n.NodeID); err != nil {
			return err
		}
		return revokePendingGrant(ac.tx, n.NodeID)
	})
}
