package fsm

import (
	"github.com/kibotos/kibotos/api"
)

func applyWorkspaceCreate(ac *applyCtx) (any, error) {
	var a WorkspaceCreateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if ac.e.CommandID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace create needs a command id (the Workspace id is derived from it)")
	}
	ns, err := ac.scope.namespaceFor(a.Namespace)
	if err != nil {
		return nil, err
	}
	if err := namespaceExists(ac.tx, ns); err != nil {
		return nil, err
	}
	a.Namespace = ns
	var src *api.Workspace
	if a.From != "" {
		// A fork is in its source's namespace: a key forks only its own,
		// and learns nothing of another's (checked before its state).
		if w, err := getWorkspace(ac.tx, a.From); err == nil && w != nil && w.Namespace != ns {
			if ac.scope != nil || ns != "" {
				return nil, api.Errorf(api.CodeNotFound, "workspace %s does not exist in namespace %s", a.From, api.ShownNamespace(ns))
			}
			// An operator who names no namespace forks into the source's.
			ns, a.Namespace = w.Namespace, w.Namespace
		}
		if src, err = forkOf(ac.tx, &a); err != nil {
			return nil, err
		}
		a.Template, a.CPU, a.MemoryBytes = src.Template, src.CPU, src.MemoryBytes
	}
	if err := validateCreate(&a); err != nil {
		return nil, err
	}
	if err := checkLifetime(a.TimeoutSeconds, a.OnTimeout); err != nil {
		return nil, err
	}
	if err := checkIdleTimeout(a.IdleTimeoutSeconds); err != nil {
		return nil, err
	}
	if a.TimeoutSeconds, a.OnTimeout, err = createLifetime(ac.tx, ns, a.TimeoutSeconds, a.OnTimeout); err != nil {
		return nil, err
	}
	ask := runCharge(&api.Workspace{CPU: a.CPU, MemoryBytes: a.MemoryBytes})
	for _, nv := range a.NewVolumes {
		ask.VolumeBytes += nv.SizeBytes
	}
	if err := checkQuota(ac.tx, ns, ask); err != nil {
		return nil, err
	}
	id := WorkspaceIDFor(ac.e.CommandID)
	network, err := normalizeNetwork(ac.tx, id, ns, a.Network.Effective(), false)
	if err != nil {
		return nil, err
	}
	if old, err := getWorkspace(ac.tx, id); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "workspace %s already exists: use a new --command-id", id)
	}
	if at := ac.tx.Bucket(bucketWorkspaceTombstones).Get(wsKey(id)); at != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "workspace %s existed and was deleted at %s: use a new --command-id", id, at)
	}
	if a.Import != nil {
		if err := a.Import.Check(); err != nil {
			return nil, err
		}
	}
	env, err := createEnv(ac.tx, id, &a, src)
	if err != nil {
		return nil, err
	}
	w := &api.Workspace{WorkspaceID: id, Namespace: ns, Template: a.Template, CPU: a.CPU, MemoryBytes: a.MemoryBytes, Labels: a.Labels, Network: &network, CreatedAt: *at(ac.e), Import: a.Import}
	var vols []*api.Volume
	if src != nil {
		if w, err = newFork(ac, id, &a, src); err != nil {
			return nil, err
		}
	} else {
		mounts, vs, err := workspaceVolumes(ac, id, &a)
		if err != nil {
			return nil, err
		}
		w.Volumes, vols = mounts, vs
	}
	setLifetime(ac, w, a.TimeoutSeconds, a.OnTimeout)
	w.AutoResume, w.IdleTimeoutSeconds = a.AutoResume, a.IdleTimeoutSeconds
	w.EnvNames = api.EnvNames(env)
	node, err := place(ac, w, vols, a.NodeID, nil, false)
	if err != nil {
		return nil, err
	}
	if err := beginExecution(ac, w, vols, node, api.WorkspaceCreating); err != nil {
		return nil, err
	}
	if err := putWorkspace(ac, nil, w); err != nil {
		return nil, err
	}
	if err := putEnv(ac.tx, id, env); err != nil {
		return nil, err
	}
	return w, nil
}

// workspaceWrite is the common frame of an operator write on one
// Workspace: decode, find it, check the expected version.
func workspaceWrite(ac *applyCtx) (*WorkspaceArgs, *api.Workspace, error) {
	var a WorkspaceArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, nil, err
	}
	w, err := mustWorkspace(ac.tx, a.WorkspaceID)
	if err != nil {
		return nil, nil, err
	}
	if err := ac.scope.permits(w.Namespace, "workspace "+a.WorkspaceID); err != nil {
		return nil, nil, err
	}
	if err := checkVersion(ac.e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, nil, err
	}
	return &a, w, nil
}

func applyWorkspaceStart(ac *applyCtx) (any, error) {
	a, w, err := workspaceWrite(ac)
	if err != nil {
		return nil, err
	}
	if err := notExporting(w, "start"); err != nil {
		return nil, err
	}
	if err := notForking(ac.tx, w, "start"); err != nil {
		return nil, err
	}
	switch {
	case w.State == api.WorkspaceAvailable && (a.NodeID == "" || a.NodeID == w.NodeID):
		return w, nil // already running where asked
	case w.State == api.WorkspacePaused: // resumed
	case w.State == api.WorkspaceStopped:
	case w.State == api.WorkspaceFailed && w.InstanceID == "":
	case w.State == api.WorkspaceFailed:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is FAILED and its Instance %s still holds resources on node %s: run kibo workspace stop --force %s, then start it", w.WorkspaceID, w.InstanceID, w.NodeID, w.WorkspaceID)
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: start needs STOPPED or FAILED; stop it first", w.WorkspaceID, w.State)
	}
	if w.InstanceID == "" {
		if err := checkQuota(ac.tx, w.Namespace, runCharge(w)); err != nil {
			return nil, err
		}
	}
	old := cloneWorkspace(w)
	w.LastError = nil
	// A start uses the latest revision of the Egress its policy names.
	if err := latestEgressRevision(ac.tx, w); err != nil {
		return nil, err
	}
	vols, err := loadVolumes(ac.tx, w)
	if err != nil {
		return nil, err
	}
	node, err := place(ac, w, vols, a.NodeID, nil, false)
	if err != nil {
		return nil, err
	}
	if err := beginExecution(ac, w, vols, node, api.WorkspaceStarting); err != nil {
		return nil, err
	}
	armEnd(ac, w) // a start or resume runs for its timeout from now
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func applyWorkspaceStop(ac *applyCtx) (any, error) {
	a, w, err := workspaceWrite(ac)
	if err != nil {
		return nil, err
	}
	return stopWorkspace(ac, cloneWorkspace(w), w, a.Force)
}

// stopWorkspace stops w, a copy of the stored record old that its
// caller may have changed already (a timeout cleared its end).
func stopWorkspace(ac *applyCtx, old, w *api.Workspace, force bool) (*api.Workspace, error) {
	if !force {
		// stop --force still ends it: the export then fails.
		if err := notExporting(w, "stop"); err != nil {
			return nil, err
		}
	}
	if err := notForking(ac.tx, w, "stop"); err != nil {
		return nil, err
	}
	switch {
	case w.State == api.WorkspaceStopped:
		return w, nil
	case w.State == api.WorkspaceDeleting:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being deleted", w.WorkspaceID)
	case w.State == api.WorkspacePausing:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being paused: stop it once it is PAUSED (which discards the snapshot) or AVAILABLE again", w.WorkspaceID)
	case w.InstanceID == "":
		// Nothing runs (FAILED after its node was isolated, PAUSED):
		// stopping is only bookkeeping; a snapshot's files go with the
		// next start or the delete.
		w.State, w.Pending, w.Failure, w.LastError = api.WorkspaceStopped, nil, nil, nil
		if w.Snapshot != nil {
			w.Snapshot.Discarded = true
		}
	case force:
		w.State = api.WorkspaceStopping
		setPending(ac.e, w, api.WSCmdStopForce, nil)
	case w.State == api.WorkspaceAvailable:
		w.State = api.WorkspaceStopping
		setPending(ac.e, w, api.WSCmdStop, nil)
	case w.State == api.WorkspaceStopping:
		return w, nil
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s: a normal stop needs AVAILABLE; wait for it, or end it now with kibo workspace stop --force %s", w.WorkspaceID, w.State, w.WorkspaceID)
	}
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

func applyWorkspaceDelete(ac *applyCtx) (any, error) {
	_, w, err := workspaceWrite(ac)
	if err != nil {
		return nil, err
	}
	return deleteWorkspaceNow(ac, cloneWorkspace(w), w)
}

// deleteWorkspaceNow deletes w, a copy of the stored record old that its
// caller may have changed already (a timeout cleared its end): at once
// when nothing runs and no files are left, else through its node.
// Volumes are never deleted with it.
func deleteWorkspaceNow(ac *applyCtx, old, w *api.Workspace) (*api.Workspace, error) {
	if err := notExporting(w, "delete"); err != nil {
		return nil, err
	}
	if err := notForking(ac.tx, w, "delete"); err != nil {
		return nil, err
	}
	if w.State == api.WorkspaceDeleting {
		return w, nil
	}
	if w.InstanceID == "" {
		// Nothing runs: its layer's files go with a node that reaches
		// their pool, or with nothing (never made, or lost with its pool).
		files, err := deleteFiles(ac, w, "")
		if err != nil {
			return nil, err
		}
		if !files {
			if err := deleteWorkspace(ac, old); err != nil {
				return nil, err
			}
			w.DeletedAt = at(ac.e)
			return w, nil
		}
	} else {
		w.State = api.WorkspaceDeleting
		setPending(ac.e, w, api.WSCmdDelete, nil)
	}
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

// notExporting refuses what of a Workspace an export reads from: its node
// copies the layer and Volumes as they are.
func notExporting(w *api.Workspace, what string) error {
	if w.Exporting == "" {
		return nil
	}
	return api.Errorf(api.CodeFailedPrecondition, "workspace %s is being exported (transfer %s): %s it once the Transfer is READY or FAILED (kibo transfer get %s)", w.WorkspaceID, w.Exporting, what, w.Exporting)
}

func layerNode(w *api.Workspace) string {
	if w.NodeID != "" {
		return w.NodeID
	}
	if w.Layer != nil {
		return w.Layer.NodeID
	}
	return ""
}
