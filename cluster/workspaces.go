package cluster

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// workspaceRoutes are the operator's calls about Workspaces.
func (s *Server) workspaceRoutes() []route {
	return []route{
		{"POST", "/v1/workspaces", tenants, atLeader, decoded(s.handleWorkspaceCreate)},
		{"GET", "/v1/workspaces", tenants, atReader, s.handleWorkspaceList},
		{"GET", "/v1/workspaces/{id}", tenants, atReader, s.handleWorkspaceGet},
		{"GET", "/v1/workspaces/{id}/cleanup-status", tenants, atReader, s.handleCleanupStatus},
		{"GET", "/v1/workspaces/{id}/logs", tenants, atReader, s.handleMachineLog},
		{"GET", "/v1/workspaces/{id}/progress", tenants, atReader, s.handleWorkspaceProgress},
		{"POST", "/v1/workspaces/{id}/start", tenants, atLeader, s.workspaceOp(fsm.OpWorkspaceStart)},
		{"POST", "/v1/workspaces/{id}/stop", tenants, atLeader, s.workspaceOp(fsm.OpWorkspaceStop)},
		{"POST", "/v1/workspaces/{id}/pause", tenants, atLeader, s.workspaceOp(fsm.OpWorkspacePause)},
		{"POST", "/v1/workspaces/{id}/delete", tenants, atLeader, s.workspaceOp(fsm.OpWorkspaceDelete)},
		{"POST", "/v1/workspaces/{id}/network", tenants, atLeader, decoded(s.handleWorkspaceSetNetwork)},
		{"POST", "/v1/workspaces/{id}/timeout", tenants, atLeader, decoded(s.handleWorkspaceSetTimeout)},
		{"POST", "/v1/workspaces/{id}/credentials", tenants, atLeader, s.handleCredential},
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
	ns, err := namespaceArg(r)
	if err != nil {
		return fail(err)
	}
	if err := s.namespaceLevel("workspace create", ns); err != nil {
		return fail(err)
	}
	if req.From != "" {
		// An older voter would not know From and boot a new Workspace.
		if err := s.levelsReach("workspace create --from", fsm.LevelForks); err != nil {
			return fail(err)
		}
	}
	env := api.SortedEnv(req.Env)
	if len(env) > 0 {
		if err := api.CheckWorkspaceEnv("workspace "+fsm.WorkspaceIDFor(req.CommandID), env); err != nil {
			return fail(err)
		}
		// An older voter would drop it: the Workspace would run without.
		if err := s.levelsReach("workspace create with environment variables", fsm.LevelWorkspaceEnv); err != nil {
			return fail(err)
		}
	}
	timeout, err := createTimeout(req)
	if err != nil {
		return fail(err)
	}
	idle, err := parseIdleTimeout(req.IdleTimeout)
	if err != nil {
		return fail(err)
	}
	if timeout > 0 || req.AutoResume || idle > 0 {
		// An older voter would drop them: the Workspace would never end,
		// never pause when idle, or never resume on connect on that
		// voter's state.
		if err := s.levelsReach("workspace create with a timeout, an idle timeout or auto-resume", fsm.LevelLifetimes); err != nil {
			return fail(err)
		}
	}
	return s.workspaceWrite(r, fsm.OpWorkspaceCreate, req.WriteMeta, fsm.WorkspaceCreateArgs{
		Namespace: ns, Template: req.Template, CPU: req.CPU, MemoryBytes: req.MemoryBytes, Labels: req.Labels, NodeID: req.NodeID, Network: req.Network,
		Volumes: req.Volumes, NewVolumes: req.NewVolumes, From: req.From,
		TimeoutSeconds: int64(timeout / time.Second), OnTimeout: req.OnTimeout, AutoResume: req.AutoResume,
		IdleTimeoutSeconds: int64(idle / time.Second), Env: env,
	})
}

// createTimeout reads a create's timeout; on_timeout needs one.
func createTimeout(req api.WorkspaceCreateRequest) (time.Duration, error) {
	if req.Timeout == "" {
		if req.OnTimeout != "" {
			return 0, api.Errorf(api.CodeInvalidArgument, "on_timeout %s without a timeout: give a timeout too", req.OnTimeout)
		}
		return 0, nil
	}
	d, err := api.ParseTimeout(req.Timeout)
	if err != nil {
		return 0, err
	}
	if d == 0 && req.OnTimeout != "" {
		return 0, api.Errorf(api.CodeInvalidArgument, "on_timeout %s without a timeout: give a timeout too", req.OnTimeout)
	}
	return d, api.CheckTimeoutAction(req.OnTimeout)
}

// parseIdleTimeout reads an idle timeout ("" or "0" for none).
func parseIdleTimeout(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := api.ParseTimeout(s)
	if err != nil {
		return 0, api.Errorf(api.CodeInvalidArgument, "idle_timeout: %s", err.Error())
	}
	return d, nil
}

// handleWorkspaceSetTimeout ends a Workspace the given time from now
// (the entry's time), or never with "0".
func (s *Server) handleWorkspaceSetTimeout(r *http.Request, req api.WorkspaceTimeoutRequest) response {
	args, err := setTimeoutArgs(r.PathValue("id"), req)
	if err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpWorkspaceSetTimeout, req.WriteMeta, args)
}

// setTimeoutArgs reads a set-timeout: the timeout, the idle timeout, or
// both.
func setTimeoutArgs(id string, req api.WorkspaceTimeoutRequest) (fsm.WorkspaceSetTimeoutArgs, error) {
	a := fsm.WorkspaceSetTimeoutArgs{WorkspaceID: id, OnTimeout: req.OnTimeout}
	if req.IdleTimeout != nil {
		d, err := parseIdleTimeout(*req.IdleTimeout)
		if err != nil {
			return a, err
		}
		secs := int64(d / time.Second)
		a.IdleTimeoutSeconds = &secs
		if req.Timeout == "" {
			if req.OnTimeout != "" {
				return a, api.Errorf(api.CodeInvalidArgument, "on_timeout %s without a timeout: give a timeout too", req.OnTimeout)
			}
			a.KeepTimeout = true
			return a, nil
		}
	}
	d, err := api.ParseTimeout(req.Timeout)
	a.TimeoutSeconds = int64(d / time.Second)
	return a, err
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
	if callerOf(r).key != nil {
		// An older voter would refuse the key's entry.
		if err := s.levelsReach("workspace set-network with an API key", fsm.LevelKeyNetwork); err != nil {
			return fail(err)
		}
	}
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
			ws, err := visibleWorkspace(r, tx, id)
			if err != nil {
				return 0, err
			}
			return ws.Version, nil
		},
		func(tx *bolt.Tx) (any, error) {
			if _, err := visibleWorkspace(r, tx, id); err != nil {
				return nil, err
			}
			return fsm.ViewWorkspace(tx, id)
		})
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
	ns, all, err := requestNamespace(r)
	if err != nil {
		return fail(err)
	}
	if !all {
		f.Namespace = &ns
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
		ws, err := visibleWorkspace(r, tx, id)
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
