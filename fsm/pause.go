package fsm

import (
	"github.com/kibotos/kibotos/api"
)

// Pause and resume. A pause is a command to the node running the
// Workspace: it saves the guest into a snapshot in the layer's pool and
// ends the VMM (PAUSING, then PAUSED with the snapshot recorded, nothing
// held). A start of a PAUSED Workspace resumes it: placement takes only
// nodes whose VMM can restore the snapshot, and the start command carries
// it. A resume that fails keeps the snapshot (PAUSED again) unless the node
// found it unusable and removed it (FAILED: the next start boots afresh).
// A stop of a PAUSED Workspace discards the snapshot; its files go with
// the next start or the delete, whose node removes them.

// maxSnapshotBytes bounds the size a node may report of a snapshot.
const maxSnapshotBytes = 1 << 40

func applyWorkspacePause(ac *applyCtx) (any, error) {
	_, w, err := workspaceWrite(ac)
	if err != nil {
		return nil, err
	}
	return pauseWorkspace(ac, cloneWorkspace(w), w)
}

// pauseWorkspace pauses w, a copy of the stored record old that its
// caller may have changed already (a timeout cleared its end).
func pauseWorkspace(ac *applyCtx, old, w *api.Workspace) (*api.Workspace, error) {
	if err := notExporting(w, "pause"); err != nil {
		return nil, err
	}
	switch {
	case w.State == api.WorkspacePausing || w.State == api.WorkspacePaused:
		return w, nil
	case w.State != api.WorkspaceAvailable || w.Pending != nil:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: pause needs AVAILABLE with no command in progress", w.WorkspaceID, stateWithPending(w))
	case w.Layer == nil || w.Layer.Lost:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has no writable layer to keep its snapshot beside", w.WorkspaceID)
	}
	// The snapshot may take up to the guest's memory, of the pool and of
	// the namespace's snapshot quota.
	if err := checkQuota(ac.tx, w.Namespace, api.NamespaceResources{SnapshotBytes: w.MemoryBytes}); err != nil {
		return nil, err
	}
	if _, err := poolRoom(ac.tx, api.LayerPoolID(w.Layer), "the snapshot of workspace "+w.WorkspaceID, w.MemoryBytes); err != nil {
		return nil, err
	}
	w.State, w.LastError = api.WorkspacePausing, nil
	setPending(ac.e, w, api.WSCmdPause, nil)
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func stateWithPending(w *api.Workspace) string {
	if w.Pending != nil {
		return w.State + " with its " + w.Pending.Kind + " pending"
	}
	return w.State
}

// pauseResult applies a node's answer to a pause.
func pauseResult(e *Entry, w *api.Workspace, p *api.WorkspaceCommand, a *WorkspaceResultArgs) {
	done := func() {
		w.NodeID, w.InstanceID = "", ""
		if w.Layer != nil {
			w.Layer.Held = false
		}
	}
	switch {
	case a.Outcome == OutcomeOK && a.Snapshot != nil && a.Snapshot.Compat.Check() == nil && a.Snapshot.SizeBytes <= maxSnapshotBytes:
		done()
		w.State = api.WorkspacePaused
		w.Snapshot = &api.Snapshot{PoolID: api.LayerPoolID(w.Layer), Shared: w.Layer.Shared, NodeID: a.NodeID, InstanceID: p.InstanceID,
			SizeBytes: a.Snapshot.SizeBytes, Compat: a.Snapshot.Compat, TakenAt: *at(e)}
	case a.Outcome == OutcomeOK:
		done()
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: "node " + a.NodeID + " answered the pause without a valid snapshot; start the Workspace again", At: *at(e)}
	case a.InstanceGone:
		// The VMM ended during the pause (killed): nothing of it is kept,
		// the next start boots afresh from the layer.
		done()
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: "pause: " + a.Error, At: *at(e)}
		w.StopUnconfirmed = true
	default:
		// Not saved: the guest runs on.
		w.State = api.WorkspaceAvailable
		w.LastError = &api.WorkspaceFailure{Reason: api.WSCmdPause, Message: a.Error, At: *at(e)}
	}
}

// resumeFailed applies a failed resume: the snapshot stays unless the
// node removed it.
func resumeFailed(e *Entry, w *api.Workspace, a *WorkspaceResultArgs) bool {
	if w.Snapshot == nil || w.Snapshot.Discarded || a.SnapshotDiscarded {
		w.Snapshot = nil
		return false
	}
	w.State = api.WorkspacePaused
	w.LastError = &api.WorkspaceFailure{Reason: api.FailureStart, Message: "resume: " + a.Error, At: *at(e)}
	return true
}

// resumeRoom is placement's check of a node for a resume: its VMM can
// restore the snapshot.
func resumeRoom(s *api.Snapshot) func(n *api.Node) string {
	return func(n *api.Node) string {
		var r *api.ResumeInfo
		if n.Report != nil {
			r = n.Report.Resume
		}
		if why := s.Compat.Incompatible(r); why != "" {
			return "it cannot resume the snapshot: " + why
		}
		return ""
	}
}

// taskSnapshot is what a command of w tells its node of w's snapshot.
func taskSnapshot(w *api.Workspace) *api.TaskSnapshot {
	s := w.Snapshot
	if s == nil {
		return nil
	}
	t := &api.TaskSnapshot{PoolID: s.PoolID, Compat: s.Compat, Discard: s.Discarded || w.Pending == nil || w.Pending.Kind != api.WSCmdStart}
	if !t.Discard && s.From != "" {
		// A fork's first start: its files are made from the source's.
		t.From, t.FromInstance = s.From, s.InstanceID
	}
	return t
}

// TaskSnapshot is taskSnapshot for the dispatcher.
func TaskSnapshot(w *api.Workspace) *api.TaskSnapshot { return taskSnapshot(w) }
