package e2b

import (
	"context"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
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
	keyID, _, _ := api.ParseKeySecret(c.key) // the key check below refuses anything else
	create, err := h.createRequest(&req, keyID)
	if err != nil {
		return err
	}
	ctx := c.r.Context()
	var ws api.Workspace
	if _, err := c.cl.Do(ctx, http.MethodPost, "/v1/workspaces", create, &ws); err != nil {
		return err
	}
	run, err := waitRunning(ctx, c.cl, ws.WorkspaceID)
	if err != nil {
		// A sandbox that never ran is not left for the caller to find.
		c.cl.Do(context.WithoutCancel(ctx), http.MethodPost, workspacePath(ws.WorkspaceID, "delete"), api.WorkspaceWriteRequest{}, nil)
		return err
	}
	return h.replySandbox(c, http.StatusCreated, run)
}

// createRequest is the Workspace a create by key keyID asks for.
func (h *handler) createRequest(req *newSandbox, keyID string) (api.WorkspaceCreateRequest, error) {
	var out api.WorkspaceCreateRequest
	switch {
	case req.MCP != nil:
		return out, api.Errorf(api.CodeInvalidArgument, "mcp is not served by Kibotos: leave it out")
	case len(req.VolumeMounts) > 0:
		return out, api.Errorf(api.CodeInvalidArgument, "volumeMounts are not served by Kibotos's E2B API yet: attach Volumes with the Kibotos API (kibo workspace create --volume)")
	}
	template := req.TemplateID
	if template == "" || template == "base" {
		template = h.c.BaseTemplate
	}
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
	policy, err := networkPolicy(req)
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

// networkPolicy is a create's egress: E2B sandboxes reach the internet
// unless allow_internet_access is false; allowOut then lists the only
// destinations, denyOut what is never reached.
func networkPolicy(req *newSandbox) (*api.NetworkPolicy, error) {
	internet := req.AllowInternetAccess == nil || *req.AllowInternetAccess
	var allow, deny []string
	if n := req.Network; n != nil {
		var err error
		if allow, err = rules("allowOut", n.AllowOut); err != nil {
			return nil, err
		}
		if deny, err = rules("denyOut", n.DenyOut); err != nil {
			return nil, err
		}
	}
	if !internet && len(allow) == 0 {
		return &api.NetworkPolicy{Egress: api.EgressNone}, nil
	}
	return &api.NetworkPolicy{Egress: api.EgressPublic, Allow: allow, Deny: deny}, nil
}

// rules are E2B's destinations as Kibotos rules: an address becomes its
// one-address CIDR; CIDRs and domains stay (the API checks them).
func rules(what string, in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, r := range in {
		r = strings.TrimSpace(r)
		if r == "" {
			return nil, api.Errorf(api.CodeInvalidArgument, "network.%s has an empty destination", what)
		}
		if ip := net.ParseIP(r); ip != nil {
			bits := 32
			if ip.To4() == nil {
				bits = 128
			}
			r += "/" + strconv.Itoa(bits)
		}
		out = append(out, r)
	}
	return out, nil
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
	ctx, cancel := context.WithTimeout(ctx, startWait)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		var ws api.Workspace
		if _, err := cl.Do(ctx, http.MethodGet, workspacePath(id), nil, &ws); err != nil {
			return nil, err
		}
		if ws.State == want {
			return &ws, nil
		}
		if settled(&ws) {
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
			return nil, api.Errorf(code, "sandbox %s: the %s did not succeed: %s", id, what, msg)
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
	if !ok {
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
	return c.reply(http.StatusOK, sandboxDetail{listedSandbox: listedOf(ws, state), Domain: h.domain(),
		Lifecycle: &lifecycle{OnTimeout: onTimeout, AutoResume: ws.AutoResume}})
}

// list is GET /v2/sandboxes: running and paused ones (or the states
// asked), filtered by metadata, a page of limit with X-Next-Token.
func (h *handler) list(c *call) error {
	q := c.r.URL.Query()
	states := []string{stateRunning, statePaused}
	if v := q.Get("state"); v != "" {
		states = strings.Split(v, ",")
	}
	return h.listStates(c, states)
}

// listRunning is the v1 GET /sandboxes: the running ones.
func (h *handler) listRunning(c *call) error {
	return h.listStates(c, []string{stateRunning})
}

func (h *handler) listStates(c *call, states []string) error {
	q := c.r.URL.Query()
	if q.Get("order") != "" || q.Get("startedAfter") != "" {
		return api.Errorf(api.CodeInvalidArgument, "order and startedAfter are not served by Kibotos's E2B API yet: leave them out")
	}
	in := url.Values{}
	for _, s := range states {
		switch strings.TrimSpace(s) {
		case stateRunning:
			in.Add("state", strings.Join([]string{api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspacePausing, api.WorkspaceStopping}, ","))
		case statePaused:
			in.Add("state", api.WorkspacePaused+","+api.WorkspaceStopped)
		default:
			return api.Errorf(api.CodeInvalidArgument, "state %q: give running or paused", api.EscapeText(s))
		}
	}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return api.Errorf(api.CodeInvalidArgument, "metadata filter %q: want key=value pairs joined by &", api.EscapeText(m))
		}
		for k, vs := range pairs {
			for _, v := range vs {
				in.Add("label", k+"="+v)
			}
		}
	}
	limit := listLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > listLimit {
			return api.Errorf(api.CodeInvalidArgument, "limit %q: give a number from 1 to %d", api.EscapeText(v), listLimit)
		}
		limit = n
	}
	in.Set("page_size", strconv.Itoa(limit))
	if t := q.Get("nextToken"); t != "" {
		in.Set("page_token", t)
	}
	var page api.WorkspaceList
	if _, err := c.cl.Do(c.r.Context(), http.MethodGet, "/v1/workspaces?"+in.Encode(), nil, &page); err != nil {
		return err
	}
	out := make([]listedSandbox, 0, len(page.Workspaces))
	for i := range page.Workspaces {
		if state, ok := e2bState(page.Workspaces[i].State); ok {
			out = append(out, listedOf(&page.Workspaces[i], state))
		}
	}
	if page.NextPageToken != "" {
		c.w.Header().Set("X-Next-Token", page.NextPageToken)
	}
	return c.reply(http.StatusOK, out)
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
// when it is paused already.
func (h *handler) pause(c *call) error {
	id := c.r.PathValue("id")
	_, state, err := sandboxWorkspace(c, id)
	if err != nil {
		return err
	}
	if state == statePaused {
		return api.Errorf(api.CodeFailedPrecondition, "sandbox %s is already paused", id)
	}
	if _, err := c.cl.Do(c.r.Context(), http.MethodPost, workspacePath(id, "pause"), api.WorkspaceWriteRequest{}, nil); err != nil {
		return err
	}
	if _, err := waitPaused(c.r.Context(), c.cl, id); err != nil {
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
