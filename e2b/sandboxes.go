package e2b

import (
	"context"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Sandbox sizes: E2B takes them from the template; Kibotos templates have
// none, so a sandbox gets E2B's smallest.
const (
	sandboxCPU    api.Milli = 1000
	sandboxMemory uint64    = 512 << 20
)

// startWait bounds how long a create or a connect waits for the sandbox
// to run (a cold boot, or a resume, and placement retries).
const startWait = 3 * time.Minute

// pollEvery is how often a wait reads the Workspace (from this member's
// replica, in process).
const pollEvery = 100 * time.Millisecond

// listLimit is E2B's default and largest page of a list.
const listLimit = 100

func workspacePath(id string, verb ...string) string {
	return strings.Join(append([]string{"/v1/workspaces", url.PathEscape(id)}, verb...), "/")
}

// create is POST /sandboxes and /v2/sandboxes: a Workspace of the key's
// namespace, answered once it runs.
func (h *handler) create(c *call) error {
	var req newSandbox
	if err := c.decode(&req); err != nil {
		return err
	}
	keyID := c.keyID()
	create, err := h.createRequest(&req, keyID)
	if err != nil {
		return err
	}
	run, err := h.createFrom(c, req.TemplateID, create)
	if err != nil {
		return err
	}
	return h.replySandbox(c, http.StatusCreated, run)
}

// createFrom creates a sandbox from template, a Kibotos template or a
// snapshot (createSnapshot) by its ID or name, and waits until it runs.
// A snapshot's ID and its tagged name are no template names; a plain
// name is a snapshot's only when no template takes it (the create's
// refusal, which comes before a Workspace is made: an invalid, unknown
// or unbuilt template).
func (h *handler) createFrom(c *call, template string, create api.WorkspaceCreateRequest) (*api.Workspace, error) {
	fork := func(snap *api.Workspace) (*api.Workspace, error) {
		create.From, create.Template, create.CPU, create.MemoryBytes = snap.WorkspaceID, "", 0, 0
		return createRunning(c, create)
	}
	looked := strings.HasPrefix(template, "ws-") || strings.ContainsAny(template, ":/")
	if looked {
		snap, err := snapshotByRef(c, template)
		if err != nil {
			return nil, err
		}
		if snap != nil {
			return fork(snap)
		}
	}
	run, err := createRunning(c, create)
	switch api.CodeOf(err) {
	case api.CodeNotFound, api.CodeFailedPrecondition, api.CodeInvalidArgument:
		if template == "" || looked {
			return nil, err
		}
		snap, serr := snapshotByRef(c, template)
		if serr != nil || snap == nil {
			return nil, err
		}
		return fork(snap)
	}
	return run, err
}

// templateName is the Kibotos template of an E2B template ID: "base"
// (or none) is the configured one.
func (h *handler) templateName(id string) string {
	if id == "" || id == "base" {
		return h.c.BaseTemplate
	}
	return id
}

// createRequest is the Workspace a create by key keyID asks for.
func (h *handler) createRequest(req *newSandbox, keyID string) (api.WorkspaceCreateRequest, error) {
	var out api.WorkspaceCreateRequest
	switch {
	case req.MCP != nil:
		return out, api.Errorf(api.CodeInvalidArgument, "mcp is not served by Kibotos: leave it out")
	case len(req.VolumeMounts) > 0:
		return out, api.Errorf(api.CodeInvalidArgument, "volumeMounts are not served by Kibotos's E2B API yet: attach Volumes with the Kibotos API (kibo workspace create --volume)")
	case req.IAM != nil:
		return out, api.Errorf(api.CodeInvalidArgument, "iam (workload identity tokens) is not served by Kibotos: leave it out")
	}
	if n := req.Network; n != nil {
		if err := notServedNetwork(n.EgressProxy, n.Rules); err != nil {
			return out, err
		}
		switch {
		case n.MaskRequestHost != "":
			return out, api.Errorf(api.CodeInvalidArgument, "network.maskRequestHost is not served by Kibotos: a request reaches the sandbox's port with the host it was sent to; leave it out")
		case len(n.HTTPSPorts) > 0:
			return out, api.Errorf(api.CodeInvalidArgument, "network.httpsPorts is not served by Kibotos: its preview hosts speak plain HTTP to the sandbox's ports; leave it out")
		}
	}
	template := h.templateName(req.TemplateID)
	timeout := int64(DefaultTimeout)
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	life, err := seconds("timeout", &timeout)
	if err != nil {
		return out, err
	}
	onTimeout := api.TimeoutDelete
	if req.AutoPause != nil && *req.AutoPause {
		onTimeout = api.TimeoutPause
		if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
			onTimeout = api.TimeoutStop // a paused sandbox without its memory boots again
		}
	}
	auto := req.AutoResume != nil && req.AutoResume.Enabled
	if auto && onTimeout == api.TimeoutDelete {
		return out, api.Errorf(api.CodeInvalidArgument, "autoResume needs autoPause: a sandbox killed at its timeout cannot be resumed")
	}
	var network sandboxNetwork
	if req.Network != nil {
		network = *req.Network
	}
	policy, err := egressPolicy(req.AllowInternetAccess, network.AllowOut, network.DenyOut)
	if err != nil {
		return out, err
	}
	labels := map[string]string{CreatorLabel: keyID, TrafficLabel: TrafficPublic}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		labels[TrafficLabel] = TrafficToken
	}
	for k, v := range req.Metadata {
		if reservedLabel(k) {
			return out, api.Errorf(api.CodeInvalidArgument, "metadata key %q: keys beginning e2b/ are Kibotos's own: choose another", k)
		}
		labels[k] = v
	}
	return api.WorkspaceCreateRequest{Template: template, CPU: sandboxCPU, MemoryBytes: sandboxMemory, Labels: labels,
		Network: policy, Timeout: life, OnTimeout: onTimeout, AutoResume: auto, Env: api.EnvFromMap(req.EnvVars)}, nil
}

// waitRunning reads the Workspace until it runs; FAILED, gone or out of
// time is an error.
func waitRunning(ctx context.Context, cl *api.Client, id string) (*api.Workspace, error) {
	return waitFor(ctx, cl, id, "start", func(ws *api.Workspace) bool {
		switch ws.State {
		case api.WorkspaceCreating, api.WorkspaceStarting:
			return false
		}
		return ws.State == api.WorkspaceAvailable || ws.Pending == nil
	}, api.WorkspaceAvailable)
}

// waitPaused reads the Workspace until it is PAUSED, or its pause was
// refused (AVAILABLE again with nothing pending).
func waitPaused(ctx context.Context, cl *api.Client, id string) (*api.Workspace, error) {
	return waitFor(ctx, cl, id, "pause", func(ws *api.Workspace) bool {
		return ws.State != api.WorkspacePausing && ws.Pending == nil
	}, api.WorkspacePaused)
}

// waitFor reads the Workspace until settled says its command (what) is
// over, which is an error unless it is in want: the Workspace's failure
// or last error says why.
func waitFor(ctx context.Context, cl *api.Client, id, what string, settled func(*api.Workspace) bool, want string) (*api.Workspace, error) {
	return poll(ctx, cl, id, func(ws *api.Workspace) (bool, error) {
		if ws.State == want {
			return true, nil
		}
		if !settled(ws) {
			return false, nil
		}
		msg, code := "it is "+ws.State, api.CodeUnavailable
		switch {
		case ws.Failure != nil:
			msg = ws.Failure.Reason + ": " + ws.Failure.Message
			if ws.Failure.Reason == api.FailureResourceExhausted {
				code = api.CodeResourceExhausted
			}
		case ws.LastError != nil:
			msg += ": " + ws.LastError.Message
		}
		return false, api.Errorf(code, "sandbox %s: the %s did not succeed: %s", id, what, msg)
	})
}

// poll reads the Workspace until done says so, or an error, for at most
// startWait.
func poll(ctx context.Context, cl *api.Client, id string, done func(*api.Workspace) (bool, error)) (*api.Workspace, error) {
	ctx, cancel := context.WithTimeout(ctx, startWait)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var ws api.Workspace
		if _, err := cl.Do(ctx, http.MethodGet, workspacePath(id), nil, &ws); err != nil {
			return nil, err
		}
		if ok, err := done(&ws); ok || err != nil {
			return &ws, err
		}
		select {
		case <-ctx.Done():
			return nil, api.Errorf(api.CodeUnavailable, "sandbox %s is still %s after %s: ask again with its ID", id, ws.State, startWait)
		case <-tick.C:
		}
	}
}

// replySandbox answers a create or a connect with status, and the
// sandbox's envdAccessToken for the caller's key when the sandbox API is
// served.
func (h *handler) replySandbox(c *call, status int, ws *api.Workspace) error {
	out, err := h.sandboxOf(c, ws)
	if err != nil {
		return err
	}
	return c.reply(status, out)
}

// sandboxOf is ws as a create, a connect or a fork answer it to the
// caller's key.
func (h *handler) sandboxOf(c *call, ws *api.Workspace) (sandbox, error) {
	out := sandbox{TemplateID: ws.Template, SandboxID: ws.WorkspaceID, Alias: ws.Template, ClientID: ClientID, EnvdVersion: EnvdVersion, Domain: h.domain()}
	if h.c.Sandboxes != nil {
		token, err := h.c.Sandboxes.AccessToken(c.key, ws.WorkspaceID)
		if err != nil {
			return out, err
		}
		out.EnvdAccessToken = &token
		if ws.Labels[TrafficLabel] == TrafficToken {
			traffic, err := h.c.Sandboxes.TrafficToken(c.key, ws.WorkspaceID)
			if err != nil {
				return out, err
			}
			out.TrafficAccessToken = &traffic
		}
	}
	return out, nil
}

func (h *handler) domain() *string {
	if h.c.Domain == "" {
		return nil
	}
	d := h.c.Domain
	return &d
}

// e2bState is the sandbox state of a Workspace: running from its create
// to its pause or stop, paused while it is PAUSED or STOPPED (a connect
// resumes or boots it); a FAILED or DELETING one is no sandbox.
func e2bState(state string) (string, bool) {
	switch state {
	case api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspacePausing, api.WorkspaceStopping:
		return stateRunning, true
	case api.WorkspacePaused, api.WorkspaceStopped:
		return statePaused, true
	}
	return "", false
}

// listedOf is the list item of a Workspace with a sandbox state.
func listedOf(ws *api.Workspace, state string) listedSandbox {
	end := ws.CreatedAt
	if ws.EndsAt != nil {
		end = *ws.EndsAt
	}
	return listedSandbox{TemplateID: ws.Template, Alias: ws.Template, SandboxID: ws.WorkspaceID, ClientID: ClientID,
		StartedAt: ws.CreatedAt, EndAt: end, CPUCount: int((ws.CPU + 999) / 1000), MemoryMB: int(ws.MemoryBytes >> 20),
		Metadata: metadata(ws.Labels), State: state, EnvdVersion: EnvdVersion}
}

// metadata is a Workspace's labels but Kibotos's own.
func metadata(labels map[string]string) map[string]string {
	out := maps.Clone(labels)
	maps.DeleteFunc(out, func(k, _ string) bool { return reservedLabel(k) })
	return out
}

// sandboxWorkspace reads the Workspace of a sandbox; one that is no
// sandbox (FAILED, being deleted) is not found.
func sandboxWorkspace(c *call, id string) (*api.Workspace, string, error) {
	var ws api.Workspace
	if _, err := c.cl.Do(c.r.Context(), http.MethodGet, workspacePath(id), nil, &ws); err != nil {
		if api.CodeOf(err) == api.CodeNotFound {
			return nil, "", notFound(id)
		}
		return nil, "", err
	}
	state, ok := e2bState(ws.State)
	if !ok || isSnapshot(&ws) {
		return nil, "", notFound(id)
	}
	return &ws, state, nil
}

func notFound(id string) error {
	return api.Errorf(api.CodeNotFound, "sandbox %s not found", api.EscapeText(id))
}

// get is GET /sandboxes/{id}.
func (h *handler) get(c *call) error {
	ws, state, err := sandboxWorkspace(c, c.r.PathValue("id"))
	if err != nil {
		return err
	}
	onTimeout := "kill"
	if ws.OnTimeout == api.TimeoutPause || ws.OnTimeout == api.TimeoutStop {
		onTimeout = "pause"
	}
	internet, network := networkOf(ws)
	return c.reply(http.StatusOK, sandboxDetail{listedSandbox: listedOf(ws, state), Domain: h.domain(),
		Lifecycle: &lifecycle{OnTimeout: onTimeout, AutoResume: ws.AutoResume}, AllowInternetAccess: internet, Network: network})
}

// kill is DELETE /sandboxes/{id}: the Workspace is deleted (its Volumes
// stay), answered once ctrl took the delete.
func (h *handler) kill(c *call) error {
	id := c.r.PathValue("id")
	if _, _, err := sandboxWorkspace(c, id); err != nil {
		return err
	}
	if _, err := c.cl.Do(c.r.Context(), http.MethodPost, workspacePath(id, "delete"), api.WorkspaceWriteRequest{}, nil); err != nil {
		return err
	}
	return c.noContent()
}

// setTimeout is POST /sandboxes/{id}/timeout: the sandbox ends that many
// seconds from now, and every later resume runs that long.
func (h *handler) setTimeout(c *call) error {
	id := c.r.PathValue("id")
	var body timeoutBody
	if err := c.decode(&body); err != nil {
		return err
	}
	if body.Timeout == nil {
		return api.Errorf(api.CodeInvalidArgument, "timeout is missing: give the seconds from now until the sandbox ends")
	}
	life, err := seconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	if _, _, err := sandboxWorkspace(c, id); err != nil {
		return err
	}
	if _, err := c.cl.Do(c.r.Context(), http.MethodPost, workspacePath(id, "timeout"), api.WorkspaceTimeoutRequest{Timeout: life}, nil); err != nil {
		return err
	}
	return c.noContent()
}

// pause is POST /sandboxes/{id}/pause: answered once it is PAUSED; 409
// when it is paused already. Without its memory (memory: false) the
// sandbox is stopped: its disk stays and a connect boots it.
func (h *handler) pause(c *call) error {
	id := c.r.PathValue("id")
	var body pauseBody
	if err := c.decode(&body); err != nil {
		return err
	}
	_, state, err := sandboxWorkspace(c, id)
	if err != nil {
		return err
	}
	if state == statePaused {
		return api.Errorf(api.CodeFailedPrecondition, "sandbox %s is already paused", id)
	}
	ctx := c.r.Context()
	if body.Memory != nil && !*body.Memory {
		if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(id, "stop"), api.WorkspaceWriteRequest{}, nil); err != nil {
			return err
		}
		if _, err := waitFor(ctx, c.cl, id, "pause", func(ws *api.Workspace) bool {
			return ws.State != api.WorkspaceStopping && ws.Pending == nil
		}, api.WorkspaceStopped); err != nil {
			return err
		}
		return c.noContent()
	}
	if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(id, "pause"), api.WorkspaceWriteRequest{}, nil); err != nil {
		return err
	}
	if _, err := waitPaused(ctx, c.cl, id); err != nil {
		return err
	}
	return c.noContent()
}

// connect is POST /sandboxes/{id}/connect (v1 and v2) and the older
// resume: a running sandbox answers 200 at once, a paused one is resumed
// (or booted, when it was stopped) and answers 201 once it runs. A
// timeout given ends it that long from now.
func (h *handler) connect(c *call) error {
	id := c.r.PathValue("id")
	var body connectBody
	if err := c.decode(&body); err != nil {
		return err
	}
	life, err := seconds("timeout", body.Timeout)
	if err != nil {
		return err
	}
	ws, state, err := sandboxWorkspace(c, id)
	if err != nil {
		return err
	}
	ctx := c.r.Context()
	status := http.StatusOK
	if state == statePaused {
		status = http.StatusCreated
		if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(id, "start"), api.WorkspaceWriteRequest{}, nil); err != nil {
			return err
		}
	}
	if ws.State != api.WorkspaceAvailable {
		if ws, err = waitRunning(ctx, c.cl, id); err != nil {
			return err
		}
	}
	if life != "" {
		if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(id, "timeout"), api.WorkspaceTimeoutRequest{Timeout: life}, nil); err != nil {
			return err
		}
	}
	return h.replySandbox(c, status, ws)
}
