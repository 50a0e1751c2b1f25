package fsm

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Idle pause (LevelLifetimes, api/idle.go). A node reports, per running
// Instance, how long it has been idle (api.InstanceState.IdleSeconds, a
// duration it measured: its clock's offset does not matter). The leader's
// lifetime service (ctrl/idle.go) reads the idle Instances from the
// nodes' stored reports (IdleDue) and proposes OpWorkspaceIdlePause for
// each whose Workspace's idle timeout has passed; the op checks again,
// against the report stored when it applies and with its own entry's
// time, so a report that came in between (the Instance is in use again)
// or a new Instance wins, and no Workspace is paused early.

// idleReportFresh bounds the age of a report an idle pause trusts: a node
// refreshes its report at least every 30 s while an Instance is idle
// (agent/report.go), so an older one means the node no longer reports,
// and a connection may have begun since.
const idleReportFresh = 90 * time.Second

// idleCounter is the action an idle pause counts under in the
// namespace's timeouts (metrics).
const idleCounter = "idle_pause"

// WorkspaceIdlePauseArgs asks the FSM to pause a Workspace whose current
// Instance its node reports idle at least its idle timeout.
type WorkspaceIdlePauseArgs struct {
	WorkspaceID string `json:"workspace_id"`
	InstanceID  string `json:"instance_id"`
}

// IdlePaused is the result of OpWorkspaceIdlePause.
type IdlePaused struct {
	Workspace *api.Workspace `json:"workspace"`
	// IdleSeconds is how long the Instance had been idle as of the entry.
	IdleSeconds int64 `json:"idle_seconds"`
}

// checkIdleTimeout refuses an idle timeout the API would not take.
func checkIdleTimeout(seconds int64) error {
	if seconds > int64(api.MaxTimeout/time.Second) {
		return api.CheckTimeout(api.MaxTimeout + time.Second)
	}
	return api.CheckTimeout(time.Duration(seconds) * time.Second)
}

// nodeInstances is the part of a node's record idleness is read from.
type nodeInstances struct {
	Report *struct {
		ReportedAt     time.Time           `json:"reported_at"`
		InstanceStates []api.InstanceState `json:"instance_states"`
	} `json:"report"`
}

// reportedIdle is what node's stored report says of instance's
// idleness; nil when it reports it in use (or not at all).
func reportedIdle(tx *bolt.Tx, node, instance string) (*api.IdleReport, error) {
	var n nodeInstances
	if ok, err := getJSON(tx, bucketNodes, []byte(node), &n); err != nil || !ok || n.Report == nil {
		return nil, err
	}
	for _, st := range n.Report.InstanceStates {
		if st.InstanceID == instance {
			return idleOf(st, n.Report.ReportedAt), nil
		}
	}
	return nil, nil
}

// idleOf is an Instance state's idleness, nil when it is in use.
func idleOf(st api.InstanceState, reportedAt time.Time) *api.IdleReport {
	if st.IdleSeconds <= 0 || st.State != "RUNNING" {
		return nil
	}
	return &api.IdleReport{Seconds: st.IdleSeconds, ReportedAt: reportedAt}
}

func applyWorkspaceIdlePause(ac *applyCtx) (any, error) {
	var a WorkspaceIdlePauseArgs
	w, err := argsWorkspace(ac, &a, &a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	now := *at(ac.e)
	switch {
	case w.IdleTimeoutSeconds <= 0:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has no idle timeout: it is never paused for idleness", w.WorkspaceID)
	case w.InstanceID == "" || w.InstanceID != a.InstanceID:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s no longer runs instance %s: its idleness is read again from its node's next report", w.WorkspaceID, a.InstanceID)
	case w.State != api.WorkspaceAvailable || w.Pending != nil:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: an idle pause needs AVAILABLE with no command in progress", w.WorkspaceID, stateWithPending(w))
	}
	idle, err := reportedIdle(ac.tx, w.NodeID, w.InstanceID)
	if err != nil {
		return nil, err
	}
	switch {
	case idle == nil:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s: node %s reports instance %s in use: it is not paused", w.WorkspaceID, w.NodeID, w.InstanceID)
	case now.Sub(idle.ReportedAt) > idleReportFresh:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s: node %s last reported instance %s at %s, over %s before this entry: an idle pause waits for a fresh report", w.WorkspaceID, w.NodeID, w.InstanceID, idle.ReportedAt.Format(time.RFC3339), idleReportFresh)
	case idle.IdleFor(now) < w.IdleTimeoutDuration():
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has been idle %s, less than its idle timeout %s: an idle pause never comes early", w.WorkspaceID, idle.IdleFor(now), w.IdleTimeoutDuration())
	}
	if w, err = pauseWorkspace(ac, cloneWorkspace(w), w); err != nil {
		return nil, err
	}
	if err := countTimeout(ac.tx, w.Namespace, idleCounter); err != nil {
		return nil, err
	}
	return IdlePaused{Workspace: w, IdleSeconds: int64(idle.IdleFor(now) / time.Second)}, nil
}

// IdleCandidate is a Workspace whose current Instance its node reports
// idle at least the Workspace's idle timeout, as of the reader's clock.
type IdleCandidate struct {
	WorkspaceID string
	InstanceID  string
	NodeID      string
	// IdleSince is when, by the report and the reader's clock, the
	// Instance became idle.
	IdleSince   time.Time
	IdleTimeout time.Duration
}

// IdleDue returns up to limit Workspaces to pause for idleness as of now.
// It reads the nodes' stored reports and only the Workspaces of the
// Instances reported idle, so its cost follows the nodes and the idle
// Instances, not every Workspace. Ones the FSM would refuse (not
// AVAILABLE, a command in flight, a stale report) are left out.
func IdleDue(tx *bolt.Tx, now time.Time, limit int) ([]IdleCandidate, error) {
	var out []IdleCandidate
	owners := tx.Bucket(bucketInstanceOwners)
	c := tx.Bucket(bucketNodes).Cursor()
	for k, v := c.First(); k != nil && len(out) < limit; k, v = c.Next() {
		var n nodeInstances
		if jsonRecord(bucketNodes, k, v, &n) != nil || n.Report == nil || now.Sub(n.Report.ReportedAt) > idleReportFresh {
			continue
		}
		for _, st := range n.Report.InstanceStates {
			idle := idleOf(st, n.Report.ReportedAt)
			if idle == nil || len(out) >= limit {
				continue
			}
			wsID := owners.Get([]byte(st.InstanceID))
			if wsID == nil {
				continue
			}
			w, err := getWorkspace(tx, string(wsID))
			if err != nil {
				return nil, err
			}
			if w == nil || w.IdleTimeoutSeconds <= 0 || w.InstanceID != st.InstanceID || w.NodeID != string(k) ||
				w.State != api.WorkspaceAvailable || w.Pending != nil || idle.IdleFor(now) < w.IdleTimeoutDuration() {
				continue
			}
			out = append(out, IdleCandidate{WorkspaceID: w.WorkspaceID, InstanceID: st.InstanceID, NodeID: w.NodeID,
				IdleSince: now.Add(-idle.IdleFor(now)), IdleTimeout: w.IdleTimeoutDuration()})
		}
	}
	return out, nil
}
