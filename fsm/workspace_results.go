package fsm

import (
	"cmp"
	"fmt"
	"sort"
	"strings"

	"github.com/kibotos/kibotos/api"
)

func applyWorkspaceResult(ac *applyCtx) (any, error) {
	var a WorkspaceResultArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if r := a.Report; r != nil && (r.NodeID != a.NodeID || r.SessionID != a.SessionID) {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace %s: a result of node %s (session %s) carries a report of node %s (session %s); a node sends only its own report with its results",
			a.WorkspaceID, a.NodeID, a.SessionID, r.NodeID, r.SessionID)
	}
	v, err := workspaceResult(ac, &a)
	if err != nil || a.Report == nil {
		return v, err
	}
	out := ResultReport{Result: v}
	rr, err := nodeReport(ac, a.Report)
	if ae, ok := err.(*api.Error); ok {
		out.ReportError = ae
	} else if err != nil {
		return nil, err
	} else {
		out.Report = &rr
	}
	return out, nil
}

// workspaceResult applies a node's answer to a Workspace's pending
// command.
func workspaceResult(ac *applyCtx, a *WorkspaceResultArgs) (any, error) {
	if a.Platform != "" {
		if err := api.ValidPlatformID(a.Platform); err != nil {
			return nil, err
		}
	}
	if err := checkSession(ac.tx, a.NodeID, a.SessionID); err != nil {
		return nil, err
	}
	w, err := getWorkspace(ac.tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if w == nil || w.Pending == nil || w.Pending.CommandID != a.CommandID || w.Pending.NodeID != a.NodeID {
		return map[string]bool{"applied": false}, nil // a late answer to a command ctrl no longer waits for
	}
	old := cloneWorkspace(w)
	p := w.Pending
	w.Pending = nil
	fail := func(reason, msg string) {
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: reason, Message: msg, At: *at(ac.e)}
	}
	switch p.Kind {
	case api.WSCmdPause:
		pauseResult(ac.e, w, p, a)
	case api.WSCmdStart:
		switch a.Outcome {
		case OutcomeOK:
			w.State = api.WorkspaceAvailable
			w.Snapshot = nil // restored (or its files removed by a fresh boot)
			if a.Platform != "" {
				w.Platform = a.Platform
			}
			w.Import = nil // unpacked into the layer and Volumes
			if err := volumesMade(ac, w); err != nil {
				return nil, err
			}
		case OutcomeRefused:
			// The node turned it away (drained, memory tight): place
			// elsewhere at once, unless the layer pins it there.
			refused := append(append([]string(nil), p.Refused...), a.NodeID)
			sort.Strings(refused)
			w.NodeID, w.InstanceID = "", ""
			if w.State == api.WorkspaceCreating && w.ForkedFrom == "" {
				// No start of a CREATING Workspace has succeeded, so no node
				// created its layer (also after earlier refusals). A fork's
				// layer right is its source's pool from the start.
				w.Layer = nil
			} else if w.Layer != nil {
				w.Layer.Held = false
			}
			vols, err := loadVolumes(ac.tx, w)
			if err != nil {
				return nil, err
			}
			node, perr := place(ac, w, vols, "", refused, a.RefusalExhausts)
			if perr != nil {
				if w.Layer != nil {
					w.Layer.Held = false
				}
				if a.RefusalExhausts && api.CodeOf(perr) == api.CodeResourceExhausted {
					fail(api.FailureResourceExhausted, refusedEverywhere(w, refused, a, perr))
				} else {
					fail(api.FailureStart, fmt.Sprintf("node %s refused it (%s) and no other node can take it: %s", a.NodeID, a.Error, perr.Error()))
				}
				if forkSource(w) != "" {
					// Its source need not wait for it any longer.
					w.Snapshot.Discarded = true
				}
				break
			}
			state := w.State
			if err := beginExecution(ac, w, vols, node, state); err != nil {
				return nil, err
			}
			w.Pending.Refused = refused
		default:
			// The node removed what it had started; the layer stays.
			w.NodeID, w.InstanceID = "", ""
			if w.Layer != nil {
				w.Layer.Held = false
			}
			switch {
			case forkSource(w) != "":
				forkStartFailed(ac.e, w, a)
			case !resumeFailed(ac.e, w, a):
				fail(api.FailureStart, a.Error)
			}
		}
	case api.WSCmdStop, api.WSCmdStopForce:
		if a.Outcome != OutcomeOK {
			fail(api.FailureStop, a.Error) // still running: stop --force ends it
			break
		}
		if p.Kind == api.WSCmdStopForce && a.NotOnNode && w.Failure != nil {
			// The node no longer had the Instance: ctrl releases what it
			// held; the Workspace stays FAILED with its error and can be
			// started (as the seed's troubleshooting table says).
			w.State, w.NodeID, w.InstanceID, w.StopUnconfirmed = api.WorkspaceFailed, "", "", true
			if w.Layer != nil {
				w.Layer.Held = false
			}
			break
		}
		w.State, w.NodeID, w.InstanceID, w.Failure = api.WorkspaceStopped, "", "", nil
		w.StopUnconfirmed = p.Kind == api.WSCmdStopForce
		if w.Snapshot != nil {
			// A resume in flight stopped: its snapshot is not restored.
			w.Snapshot.Discarded = true
		}
		if w.Layer != nil {
			w.Layer.Held = false
		}
	case api.WSCmdNetwork:
		applyNetworkResult(ac.e, w, p, a)
	case api.WSCmdDelete:
		if a.Outcome != OutcomeOK {
			fail(api.FailureStop, "delete: "+a.Error)
			break
		}
		if err := deleteWorkspace(ac, old); err != nil {
			return nil, err
		}
		return map[string]bool{"applied": true}, nil
	}
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return map[string]bool{"applied": true}, nil
}

// refusedEverywhere is why a Workspace whose start the nodes in refused
// turned away (a's node the last) has no node to run on: the nodes, the
// last one's reason, the placement's and what to do.
func refusedEverywhere(w *api.Workspace, refused []string, a *WorkspaceResultArgs, perr error) string {
	who, why := "node "+a.NodeID, a.Error
	if len(refused) > 1 {
		who, why = "nodes "+strings.Join(refused, ", "), a.NodeID+": "+cmp.Or(a.Error, "refused")
	}
	if why != "" {
		why = " (" + why + ")"
	}
	return fmt.Sprintf("%s refused to start it%s and no other node can take it: %s; nothing of it runs: kibo workspace start %s places it again, or delete it",
		who, why, perr.Error(), w.WorkspaceID)
}

// failEndedInstances fails AVAILABLE Workspaces whose Instance the node
// reports FAILED (its VMM ended without the node stopping it). With
// oomStops, one whose VMM host OOM killed is stopped instead: ctrl has the
// node end the Instance, and the Workspace ends STOPPED, startable (the
// overcommit section of the node-operations seed).
func failEndedInstances(ac *applyCtx, node string, states []api.InstanceState, oomStops bool) error {
	if len(states) == 0 {
		return nil
	}
	failed := map[string]string{}
	oom := map[string]bool{}
	for _, s := range states {
		if s.State == "FAILED" {
			failed[s.InstanceID] = s.Error
			oom[s.InstanceID] = s.OOMKilled && oomStops
		}
	}
	if len(failed) == 0 {
		return nil
	}
	ws, err := workspacesOnNode(ac.tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		msg, ok := failed[w.InstanceID]
		if !ok || w.NodeID != node || w.State != api.WorkspaceAvailable {
			continue
		}
		old := cloneWorkspace(w)
		if msg == "" {
			msg = "node reports the Instance as no longer running"
		}
		dropNetworkChange(ac.e, w, "instance "+w.InstanceID+" ended before node "+node+" applied the change")
		if oom[w.InstanceID] {
			w.State = api.WorkspaceStopping
			w.LastError = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: msg + "; ctrl stopped the Workspace: start it again", At: *at(ac.e)}
			setPending(ac.e, w, api.WSCmdStopForce, nil)
			if err := putWorkspace(ac, old, w); err != nil {
				return err
			}
			continue
		}
		w.State = api.WorkspaceFailed
		w.Failure = &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: msg, Stage: api.FailureStage(msg), At: *at(ac.e)}
		if err := putWorkspace(ac, old, w); err != nil {
			return err
		}
	}
	return nil
}

// releaseIsolated fails every Workspace of an isolated node with
// UNAVAILABLE and releases what it held there; it returns the counts.
func releaseIsolated(ac *applyCtx, node string, res *api.IsolateResult) error {
	ws, err := workspacesOnNode(ac.tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		old := cloneWorkspace(w)
		if w.Pending != nil && w.Pending.NodeID == node {
			res.CommandsFailed++
			dropNetworkChange(ac.e, w, "node "+node+" was isolated before it answered")
			w.Pending = nil
		}
		if w.Layer != nil && w.Layer.Held && w.Layer.NodeID == node {
			res.RetainedLayersReleased++
			res.VolumesReleased += len(attachedVolumes(w))
			w.Layer.Held = false
		}
		if w.State == api.WorkspaceDeleting && w.Pending == nil && w.DeleteWaitsForPool == "" {
			// Its delete waited for this node (running here, or the layer of
			// a stopped Workspace): the files go with another member of
			// their pool, or wait for one.
			w.NodeID, w.InstanceID = "", ""
			if files, err := deleteFiles(ac, w, node); err != nil {
				return err
			} else if !files {
				if err := deleteWorkspace(ac, old); err != nil {
					return err
				}
				continue
			}
		}
		if w.NodeID == node {
			w.NodeID, w.InstanceID = "", ""
			if w.State != api.WorkspaceStopped {
				res.WorkspacesFailed++
				w.State = api.WorkspaceFailed
				w.Failure = &api.WorkspaceFailure{Reason: api.FailureUnavailable,
					Message: "node " + node + " was isolated; start the Workspace again", At: *at(ac.e)}
				w.StopUnconfirmed = true
			}
		}
		if err := putWorkspace(ac, old, w); err != nil {
			return err
		}
	}
	n, err := releaseVolumeCommands(ac, node, "was isolated")
	res.CommandsFailed += n
	return err
}

// releaseRetired hands the deletes waiting for a node being retired (it
// never answers) to another member of the layer's pool, or makes them
// wait for one. A DRAINED or isolated node has no other pending commands.
// The caller has marked the node retired already.
func releaseRetired(ac *applyCtx, node string) error {
	ws, err := workspacesOnNode(ac.tx, node)
	if err != nil {
		return err
	}
	for _, w := range ws {
		if w.State != api.WorkspaceDeleting || w.Pending == nil || w.Pending.NodeID != node {
			continue
		}
		old := cloneWorkspace(w)
		if files, err := deleteFiles(ac, w, node); err != nil {
			return err
		} else if !files {
			if err := deleteWorkspace(ac, old); err != nil {
				return err
			}
			continue
		}
		if err := putWorkspace(ac, old, w); err != nil {
			return err
		}
	}
	_, err = releaseVolumeCommands(ac, node, "was retired")
	return err
}
