package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// dispatcher delivers the pending Workspace commands of one node over its
// control session. Each command is sent once per session and again after
// resendAfter without an answer; the node executes a command id once.
type dispatcher struct {
	s      *Server
	nodeID string
	sc     *sessionConn
	sent   map[string]time.Time
	// sentDraining is the drain flag the node last got. The node rejects
	// new Workspaces itself while draining (a start ctrl sent just before
	// a drain is refused and placed elsewhere), so it gets the flag before
	// any command on the same connection: a start placed right after a
	// cancel-drain is never refused with a stale flag.
	sentDraining *bool
}

const resendAfter = time.Minute

func (d *dispatcher) run() error {
	var tasks []*api.WorkspaceTask
	var volTasks []*api.VolumeTask
	var draining bool
	err := d.s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		if draining, err = fsm.NodeDrainRequested(tx, d.nodeID); err != nil {
			return err
		}
		pending, err := fsm.PendingCommands(tx, d.nodeID)
		if err != nil {
			return err
		}
		for i := range pending {
			t := taskFor(&pending[i])
			if err := withNetworkObjects(tx, t); err != nil {
				// Never a task whose policy the node could not enforce:
				// it stays pending and is tried again at the next tick.
				d.s.log.Warn("workspace task not sent", "peer_node_id", d.nodeID, "workspace_id", t.WorkspaceID, "command_id", t.Command.CommandID, "err", err)
				continue
			}
			if t.Command.Kind == api.WSCmdStart {
				if t.Volumes, err = fsm.TaskVolumes(tx, &pending[i]); err != nil {
					return err
				}
				if t.Published, err = fsm.TaskTemplate(tx, t.Template); err != nil {
					return err
				}
				if t.Platforms, err = fsm.TaskPlatforms(tx, &pending[i]); err != nil {
					return err
				}
				t.Import = pending[i].Import
				if t.Env, err = fsm.TaskEnv(tx, t.WorkspaceID); err != nil {
					return err
				}
			}
			tasks = append(tasks, t)
		}
		vols, err := fsm.PendingVolumeCommands(tx, d.nodeID)
		for i := range vols {
			volTasks = append(volTasks, volumeTaskFor(&vols[i]))
		}
		return err
	})
	if err != nil {
		return nil
	}
	if d.sentDraining == nil || *d.sentDraining != draining {
		if err := d.sc.send(api.SessionMsg{Type: api.MsgNodeState, Draining: &draining}); err != nil {
			return err
		}
		d.sentDraining = &draining
	}
	live := map[string]bool{}
	// send delivers one command unless it went out less than resendAfter ago.
	send := func(id string, m api.SessionMsg) error {
		live[id] = true
		if t, ok := d.sent[id]; ok && time.Since(t) < resendAfter {
			return nil
		}
		if err := d.sc.send(m); err != nil {
			return err
		}
		d.sent[id] = time.Now()
		return nil
	}
	for _, task := range tasks {
		if err := send(task.Command.CommandID, api.SessionMsg{Type: api.MsgTask, Task: task}); err != nil {
			return err
		}
	}
	for _, task := range volTasks {
		if err := send(task.Command.CommandID, api.SessionMsg{Type: api.MsgVolumeTask, VolumeTask: task}); err != nil {
			return err
		}
	}
	for id := range d.sent {
		if !live[id] {
			delete(d.sent, id)
		}
	}
	return nil
}

// taskFor is the Workspace's pending command with what the node needs to
// execute it: a start carries the Workspace's policy (egress none for a
// record older than policies), a network command the requested one;
// withNetworkObjects adds the objects the policy names.
func taskFor(w *api.Workspace) *api.WorkspaceTask {
	p := w.Pending
	task := &api.WorkspaceTask{Command: *p, WorkspaceID: w.WorkspaceID, Template: w.Template, CPU: w.CPU, MemoryBytes: w.MemoryBytes, Snapshot: fsm.TaskSnapshot(w)}
	if w.Layer != nil {
		task.LayerPool = w.Layer.PoolID
	}
	switch p.Kind {
	case api.WSCmdStart:
		pol := w.Network.Effective()
		task.Network = &pol
	case api.WSCmdNetwork:
		task.Network = p.Network
	}
	return task
}

// volumeTaskFor is the Volume's pending command with what the node needs.
func volumeTaskFor(v *api.Volume) *api.VolumeTask {
	t := &api.VolumeTask{Command: *v.Pending, VolumeID: v.VolumeID, PoolID: v.PoolID}
	if v.Pending.InstanceID != "" {
		t.WorkspaceID, t.MountPath = v.WorkspaceID, v.MountPath
	}
	return t
}

// applyVolumeResult stores the node's answer to a Volume command.
func (s *Server) applyVolumeResult(ctx context.Context, nodeID, sid string, r *api.VolumeTaskResult) error {
	res, err := s.ApplyOp(ctx, fsm.OpVolumeResult, fsm.VolumeResultArgs{
		NodeID: nodeID, SessionID: sid, VolumeID: r.VolumeID, CommandID: r.CommandID, Outcome: r.Outcome, Error: r.Error, FilesystemPending: r.FilesystemPending,
	})
	if err != nil {
		return err
	}
	return res.Err()
}

// applyTaskResult stores a node's answer to a Workspace command and the
// report sent with it, if any (m.Report): in one entry where every voter
// reaches fsm.LevelResultReports, else as a result entry and then a
// report entry, in the order a node that sends them apart gives them.
// It returns why the result, and why the report, was not stored. A
// result refused with its report leaves the report to an entry of its
// own, as before the level.
func (s *Server) applyTaskResult(ctx context.Context, sc *sessionConn, nodeID, sid string, m api.SessionMsg) (resErr, repErr error) {
	r := m.TaskResult
	args := fsm.WorkspaceResultArgs{
		NodeID: nodeID, SessionID: sid, WorkspaceID: r.WorkspaceID, CommandID: r.CommandID, Outcome: r.Outcome, Error: r.Error,
		Snapshot: r.Snapshot, InstanceGone: r.InstanceGone, SnapshotDiscarded: r.SnapshotDiscarded,
		NotOnNode: r.NotOnNode && s.levels.TroubleshootingRules(),
		// Asked only of refusals: the one answer it changes.
		RefusalExhausts: r.Outcome == fsm.OutcomeRefused && s.levelsReach("refusals that exhaust", fsm.LevelRefusalExhausted) == nil,
		Platform:        s.platformOfResult(r.Platform),
	}
	apart := m.Report != nil
	if apart && s.levelsReach("reports with task results", fsm.LevelResultReports) == nil {
		rep := s.reportArgs(nodeID, sid, m)
		args.Report, apart = &rep, false
	}
	res, err := s.ApplyOp(ctx, fsm.OpWorkspaceResult, args)
	if err != nil {
		return err, nil
	}
	s.kickAfterResult(nodeID, r.WorkspaceID)
	resErr = res.Err()
	switch {
	case apart || args.Report != nil && resErr != nil:
		repErr = s.applyReport(ctx, sc, nodeID, sid, m, 0) // a result carries no clock sample
	case args.Report != nil:
		var rr fsm.ResultReport
		if err := json.Unmarshal(res.Value, &rr); err != nil {
			return nil, fmt.Errorf("the outcome of a result with its report: %w", err)
		}
		if rr.ReportError != nil {
			return nil, rr.ReportError
		}
		if rr.Report != nil {
			repErr = sendForget(sc, *rr.Report)
		}
	}
	return resErr, repErr
}

// kickAfterResult wakes the sessions a Workspace result concerns: a
// refusal re-places the Workspace, so they deliver what is now pending.
func (s *Server) kickAfterResult(nodeID, workspaceID string) {
	// The answering node may have the next command, and a refusal may
	// have placed the Workspace on another node.
	nodes := []string{nodeID}
	s.fsm.View(func(tx *bolt.Tx) error {
		if ws, err := fsm.GetWorkspace(tx, workspaceID); err == nil {
			nodes = append(nodes, workspaceNodes(ws)...)
		}
		return nil
	})
	s.sessions.kick(nodes)
}

// untilAvailable says what makes ws AVAILABLE again, for an error that
// needs it so.
func untilAvailable(ws *api.Workspace) string {
	id := ws.WorkspaceID
	switch ws.State {
	case api.WorkspacePaused:
		return "resume it with kibo workspace resume " + id
	case api.WorkspaceStopped, api.WorkspaceFailed:
		return "start it with kibo workspace start " + id
	case api.WorkspaceDeleting:
		return "it is being deleted"
	default:
		return "wait until kibo workspace get " + id + " shows AVAILABLE"
	}
}
