package cluster

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/fsm"
)

// CredentialTTL is how long a data-plane credential is valid. Connections
// opened with it outlive it; a new connection needs a new credential.
const CredentialTTL = 10 * time.Minute

// workspaceRoutes are the operator's calls about Workspaces.
func (s *Server) workspaceRoutes() []route {
	return []route{
		{"POST", "/v1/workspaces", operators, atLeader, decoded(s.handleWorkspaceCreate)},
		{"GET", "/v1/workspaces", operators, atReader, s.handleWorkspaceList},
		{"GET", "/v1/workspaces/{id}", operators, atReader, s.handleWorkspaceGet},
		{"GET", "/v1/workspaces/{id}/cleanup-status", operators, atReader, s.handleCleanupStatus},
		{"GET", "/v1/workspaces/{id}/logs", operators, atReader, s.handleMachineLog},
		{"GET", "/v1/workspaces/{id}/progress", operators, atReader, s.handleWorkspaceProgress},
		{"POST", "/v1/workspaces/{id}/start", operators, atLeader, s.workspaceOp(fsm.OpWorkspaceStart)},
		{"POST", "/v1/workspaces/{id}/stop", operators, atLeader, s.workspaceOp(fsm.OpWorkspaceStop)},
		{"POST", "/v1/workspaces/{id}/pause", operators, atLeader, s.workspaceOp(fsm.OpWorkspacePause)},
		{"POST", "/v1/workspaces/{id}/delete", operators, atLeader, s.workspaceOp(fsm.OpWorkspaceDelete)},
		{"POST", "/v1/workspaces/{id}/network", operators, atLeader, decoded(s.handleWorkspaceSetNetwork)},
		{"POST", "/v1/workspaces/{id}/credentials", operators, atLeader, s.handleCredential},
	}
}

func (s *Server) handleWorkspaceCreate(r *http.Request, req api.WorkspaceCreateRequest) response {
	if req.CommandID == "" {
		// The Workspace id derives from the command id; API callers that
		// do not retry need not invent one.
		req.WriteMeta = api.WriteMeta{CommandID: "api-" + newSessionID()[5:], Generated: true}
	}
	if err := checkCreateInput(req.MemoryBytes, req.Labels); err != nil {
		return fail(err)
	}
	if req.From != "" {
		// An older voter would not know From and boot a new Workspace.
		if err := s.levelsReach("workspace create --from", fsm.LevelForks); err != nil {
			return fail(err)
		}
	}
	return s.workspaceWrite(r, fsm.OpWorkspaceCreate, req.WriteMeta, fsm.WorkspaceCreateArgs{
		Template: req.Template, CPU: req.CPU, MemoryBytes: req.MemoryBytes, Labels: req.Labels, NodeID: req.NodeID, Network: req.Network,
		Volumes: req.Volumes, NewVolumes: req.NewVolumes, From: req.From,
	})
}

// checkCreateInput refuses what the FSM's checks let through, where the
// request enters: memory over MaxWorkspaceMemory, label values that are
// not printable text (a label is shown in lists; control and bidi
// characters would disguise it).
func checkCreateInput(memory uint64, labels map[string]string) error {
	if memory > fsm.MaxWorkspaceMemory {
		return api.Errorf(api.CodeInvalidArgument, "--memory %d bytes is more than a Workspace may have (%s): give less", memory, api.FormatBytes(fsm.MaxWorkspaceMemory))
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := api.CheckText("label "+api.EscapeText(k), labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// handleWorkspaceSetNetwork changes the given items of a Workspace's
// network policy. The answer is the Workspace as ctrl accepted the change:
// for a running one with the command pending on its node, whose answer
// the caller reads from the Workspace (network_change).
func (s *Server) handleWorkspaceSetNetwork(r *http.Request, req api.WorkspaceNetworkRequest) response {
	return s.workspaceWrite(r, fsm.OpWorkspaceSetNetwork, req.WriteMeta, fsm.WorkspaceNetworkArgs{WorkspaceID: r.PathValue("id"), NetworkChange: req.NetworkChange})
}

// workspaceOp serves start, stop and delete.
func (s *Server) workspaceOp(op string) handler {
	return decoded(func(r *http.Request, req api.WorkspaceWriteRequest) response {
		args := fsm.WorkspaceArgs{WorkspaceID: r.PathValue("id"), NodeID: req.NodeID, Force: req.Force}
		if op != fsm.OpWorkspaceStart && req.NodeID != "" {
			return fail(api.Errorf(api.CodeInvalidArgument, "--node applies only to create, start and move"))
		}
		if op != fsm.OpWorkspaceStop && req.Force {
			return fail(api.Errorf(api.CodeInvalidArgument, "--force applies only to stop"))
		}
		return s.workspaceWrite(r, op, req.WriteMeta, args)
	})
}

// workspaceWrite applies a Workspace or Volume write and hands its command
// to the control sessions of the nodes its result names at once instead of
// at their next ping. Only those: waking every session for every write
// cost a thousand-node cluster a thousand dispatcher passes per create.
func (s *Server) workspaceWrite(r *http.Request, op string, meta api.WriteMeta, args any) response {
	res := s.write(r, op, meta, args)
	if ok, isResult := res.(resultResponse); isResult {
		if view, isRaw := ok.value.(json.RawMessage); isRaw {
			s.sessions.kick(commandNodes(view))
		}
	}
	return res
}

// commandNodes are the nodes a Workspace or Volume view names as running,
// holding, cleaning up or about to act on it: the sessions that may have a
// command of it to deliver. One it misses goes at the node's next ping.
func commandNodes(view json.RawMessage) []string {
	type onNode struct {
		NodeID string `json:"node_id"`
	}
	var v struct {
		onNode
		Pending, Cleanup, Layer *onNode
	}
	if json.Unmarshal(view, &v) != nil {
		return nil
	}
	ids := []string{v.NodeID}
	for _, n := range []*onNode{v.Pending, v.Cleanup, v.Layer} {
		if n != nil {
			ids = append(ids, n.NodeID)
		}
	}
	return distinctNodes(ids...)
}

// workspaceNodes is commandNodes of a Workspace.
func workspaceNodes(ws *api.Workspace) []string {
	ids := []string{ws.NodeID}
	if ws.Pending != nil {
		ids = append(ids, ws.Pending.NodeID)
	}
	if ws.Cleanup != nil {
		ids = append(ids, ws.Cleanup.NodeID)
	}
	if ws.Layer != nil {
		ids = append(ids, ws.Layer.NodeID)
	}
	return distinctNodes(ids...)
}

func distinctNodes(ids ...string) []string {
	var out []string
	for _, id := range ids {
		if id != "" && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// resultRecorder keeps a write's status and answer (a few kilobytes: one
// Workspace or Volume) as it passes them on.
type resultRecorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (rr *resultRecorder) WriteHeader(code int) {
	rr.status = code
	rr.ResponseWriter.WriteHeader(code)
}

func (rr *resultRecorder) Write(b []byte) (int, error) {
	if rr.body.Len() < 1<<20 {
		rr.body.Write(b)
	}
	return rr.ResponseWriter.Write(b)
}

// maxBlockingWait bounds ?wait= of a blocking read.
const maxBlockingWait = time.Minute

// handleWorkspaceGet answers at once, or with ?wait_version=V&wait=30s as
// a blocking read (see blockingGet).
func (s *Server) handleWorkspaceGet(r *http.Request) response {
	id := r.PathValue("id")
	return s.blockingGet(r,
		func(tx *bolt.Tx) (uint64, error) {
			ws, err := fsm.GetWorkspace(tx, id)
			if err != nil {
				return 0, err
			}
			return ws.Version, nil
		},
		func(tx *bolt.Tx) (any, error) { return fsm.ViewWorkspace(tx, id) })
}

// blockingGet answers get at once, or with ?wait_version=V&wait=30s when
// the object's version passes V (or it is gone: version fails), at the
// latest after the wait. Waiting CLIs see a change the moment this member
// applies it instead of at their next poll.
func (s *Server) blockingGet(r *http.Request, version func(tx *bolt.Tx) (uint64, error), get func(tx *bolt.Tx) (any, error)) response {
	q := r.URL.Query()
	if q.Get("wait_version") == "" {
		return s.view(get)
	}
	since, err := strconv.ParseUint(q.Get("wait_version"), 10, 64)
	if err != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "wait_version %q is not a version number", q.Get("wait_version")))
	}
	wait := 30 * time.Second
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return fail(api.Errorf(api.CodeInvalidArgument, "wait %q is not a duration such as 30s", v))
		}
	}
	deadline := time.NewTimer(min(wait, maxBlockingWait))
	defer deadline.Stop()
	for {
		changed := s.changed.next() // before the read: no change is missed
		var v uint64
		err := s.fsm.View(func(tx *bolt.Tx) (err error) { v, err = version(tx); return })
		if err != nil || v > since {
			return s.view(get)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return s.view(get)
		case <-r.Context().Done():
			return noAnswer
		case <-s.stop:
			return s.view(get)
		}
	}
}

func (s *Server) handleWorkspaceList(r *http.Request) response {
	q := r.URL.Query()
	f := fsm.WorkspaceFilter{NodeID: q.Get("node"), InstanceID: q.Get("instance"), All: q.Get("all") == "true", PoolID: q.Get("pool")}
	if f.PoolID != "" {
		if err := api.ValidPoolID(f.PoolID); err != nil {
			return fail(err)
		}
	}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			one = strings.ToUpper(strings.TrimSpace(one))
			if !validWorkspaceState(one) {
				return fail(api.Errorf(api.CodeInvalidArgument, "state %q is unknown: use CREATING, STARTING, AVAILABLE, PAUSING, PAUSED, STOPPING, STOPPED, FAILED or DELETING", one))
			}
			f.States = append(f.States, one)
		}
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fail(api.Errorf(api.CodeInvalidArgument, "label filter %q is not KEY=VALUE", l))
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if f.NodeID != "" && f.InstanceID != "" {
		return fail(api.Errorf(api.CodeInvalidArgument, "--node and --instance are exclusive: give one"))
	}
	if (f.NodeID != "" || f.InstanceID != "") && (len(f.States) > 0 || len(f.Labels) > 0 || f.PoolID != "") {
		return fail(api.Errorf(api.CodeInvalidArgument, "--node and --instance cannot be combined with --state, --label or --pool"))
	}
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListWorkspaces(tx, f, size, token) })
}

func validWorkspaceState(s string) bool {
	switch s {
	case api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspaceStopping,
		api.WorkspaceStopped, api.WorkspaceFailed, api.WorkspaceDeleting, api.WorkspacePausing, api.WorkspacePaused:
		return true
	}
	return false
}

// handleCleanupStatus answers from ctrl's records: what the latest
// execution still holds on its node.
func (s *Server) handleCleanupStatus(r *http.Request) response {
	id := r.PathValue("id")
	return s.view(func(tx *bolt.Tx) (any, error) {
		ws, err := fsm.GetWorkspace(tx, id)
		if err != nil {
			return nil, err
		}
		return cleanupStatus(ws), nil
	})
}

func cleanupStatus(ws *api.Workspace) api.CleanupStatus {
	out := api.CleanupStatus{WorkspaceID: ws.WorkspaceID, InstanceID: ws.InstanceID, NodeID: ws.NodeID}
	observed, source := ws.UpdatedAt, "control-plane"
	unknown := false
	if c := ws.Cleanup; c != nil && ws.InstanceID == "" && ws.Pending == nil && c.InstanceID == fsm.LatestInstanceID(ws) {
		// Nothing runs: the latest execution's release as its node
		// observed it (ctrl stored it before the node dropped its record),
		// or unknown when the record was gone before that.
		out.InstanceID, out.NodeID = c.InstanceID, c.NodeID
		observed, source, unknown = c.ObservedAt, "node", c.Unknown
	}
	item := func(name, state string, since *time.Time) {
		it := api.CleanupItem{Item: name, State: state, Source: source, ObservedAt: &observed, Since: since}
		if unknown && state == api.CleanupReleased {
			// Only the node's record could say it was released; what ctrl
			// itself still waits for (a delete waiting for its pool) stands.
			it.State, it.ObservedAt = api.CleanupUnknown, nil
		}
		out.Items = append(out.Items, it)
	}
	runtime := api.CleanupReleased
	var since *time.Time
	switch {
	case ws.Pending != nil && ws.Pending.Kind != api.WSCmdStart && ws.Pending.Kind != api.WSCmdNetwork:
		runtime, since = api.CleanupPending, &ws.Pending.IssuedAt
	case ws.InstanceID != "":
		runtime = api.CleanupHeld
	}
	item("RUNTIME", runtime, since)
	attachment := api.CleanupReleased
	switch {
	case len(ws.Volumes) == 0:
	case runtime == api.CleanupPending:
		attachment = api.CleanupPending
	case ws.Layer != nil && ws.Layer.Held:
		// The Volumes' use right goes with the layer's.
		attachment = api.CleanupHeld
	}
	item("VOLUME_ATTACHMENT", attachment, since)
	residual := api.CleanupReleased
	if ws.Layer != nil && ws.Layer.Held {
		residual = api.CleanupHeld
	}
	if runtime == api.CleanupPending {
		residual = api.CleanupPending
	}
	if ws.DeleteWaitsForPool != "" {
		// Its files wait for a node that reaches their pool.
		residual, since = api.CleanupPending, &ws.UpdatedAt
	}
	item("RESIDUAL", residual, since)
	return out
}

// handleCredential issues a data-plane credential for the Workspace's
// current Instance, signed with the key every ctrl member derives from
// the cluster CA.
func (s *Server) handleCredential(r *http.Request) response {
	id := r.PathValue("id")
	var ws *api.Workspace
	var node *api.Node
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		if ws, err = fsm.GetWorkspace(tx, id); err != nil {
			return err
		}
		if ws.NodeID != "" {
			node, err = fsm.GetNode(tx, ws.NodeID)
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	if ws.State != api.WorkspaceAvailable || ws.InstanceID == "" {
		return fail(api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: exec, terminal, cp and port-forward need AVAILABLE; %s", id, ws.State, untilAvailable(ws)))
	}
	if node == nil || node.Report == nil || node.Report.DataPlaneAddress == "" {
		return fail(api.Errorf(api.CodeUnavailable, "node %s of workspace %s has not reported a data-plane address yet; retry in a few seconds", ws.NodeID, id))
	}
	key, err := s.credentialKey()
	if err != nil {
		return fail(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	c := credential.Claims{WorkspaceID: ws.WorkspaceID, InstanceID: ws.InstanceID, NodeID: ws.NodeID, IssuedAt: now, ExpiresAt: now.Add(CredentialTTL)}
	tok, err := credential.Sign(key, c)
	if err != nil {
		return fail(err)
	}
	return answer(api.DataPlaneCredential{WorkspaceID: ws.WorkspaceID, NodeID: ws.NodeID, InstanceID: ws.InstanceID,
		Address: node.Report.DataPlaneAddress, Credential: tok, ExpiresAt: c.ExpiresAt})
}

// credentialKey derives the signing key from the cluster CA key, which
// every ctrl member holds.
func (s *Server) credentialKey() (ed25519.PrivateKey, error) {
	s.credOnce.Do(func() {
		pemBytes, err := os.ReadFile(s.cfg.DataDir.CAKey())
		if err != nil {
			s.credErr = api.Errorf(api.CodeFailedPrecondition, "member %s holds no cluster CA key (%v): credentials are issued by ctrl members", s.id.NodeID, err)
			return
		}
		s.credKey, s.credErr = credential.KeyFromCA(pemBytes)
	})
	return s.credKey, s.credErr
}

// CredentialPublicKey is the key nodes hand their data-plane process.
func (s *Server) CredentialPublicKey() ed25519.PublicKey {
	k, err := s.credentialKey()
	if err != nil {
		return nil
	}
	return k.Public().(ed25519.PublicKey)
}

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
