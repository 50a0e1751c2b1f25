package e2b

import (
	"context"
	"maps"
	"net/http"

	"github.com/kibotos/kibotos/api"
)

// A sandbox's forks (POST /sandboxes/{id}/fork, the SDKs' fork): new
// sandboxes that run on from its memory and disk as they are now. A
// Kibotos fork is made from a PAUSED Workspace (pause-and-forks.md): a
// running sandbox is paused for the forks and resumed after them, as
// E2B's own fork pauses it for its snapshot.

// maxForks bounds the forks of one request: each is a VM.
const maxForks = 16

type forkBody struct {
	Timeout *int64 `json:"timeout,omitempty"` // seconds; E2B's default
	Count   *int   `json:"count,omitempty"`
}

// forkResult is one fork's answer: its sandbox, or why it was not made.
type forkResult struct {
	Sandbox *sandbox  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork: 201 with one result a fork.
func (h *handler) fork(c *call) error {
	id := c.r.PathValue("id")
	var body forkBody
	if err := c.decode(&body); err != nil {
		return err
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > maxForks {
		return api.Errorf(api.CodeInvalidArgument, "count %d: fork 1 to %d sandboxes at once", count, maxForks)
	}
	timeout := int64(DefaultTimeout)
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	life, err := seconds("timeout", &timeout)
	if err != nil {
		return err
	}
	src, resume, err := h.holdPaused(c, id)
	if err != nil {
		return err
	}
	defer resume()
	labels := maps.Clone(src.Labels)
	labels[CreatorLabel] = c.keyID() // the forks are the forking key's
	if labels[TrafficLabel] == "" {
		labels[TrafficLabel] = TrafficPublic
	}
	results := make([]forkResult, 0, count)
	for range count {
		results = append(results, h.forkOne(c, api.WorkspaceCreateRequest{From: src.WorkspaceID, Labels: labels, Network: src.Network,
			Timeout: life, OnTimeout: src.OnTimeout, AutoResume: src.AutoResume}))
	}
	return c.reply(http.StatusCreated, results)
}

// forkOne makes one fork and waits until it runs.
func (h *handler) forkOne(c *call, req api.WorkspaceCreateRequest) forkResult {
	fail := func(err error) forkResult {
		status, msg := errorStatus(err)
		return forkResult{Error: &apiError{Code: status, Message: msg}}
	}
	run, err := createRunning(c, req)
	if err != nil {
		return fail(err)
	}
	out, err := h.sandboxOf(c, run)
	if err != nil {
		return fail(err)
	}
	return forkResult{Sandbox: &out}
}

// holdPaused reads sandbox id and pauses it for forks of it: a fork is
// made of a PAUSED Workspace. The func it returns resumes the sandbox if
// it was running, whatever became of the forks, and waits until it runs:
// the caller's next command finds it running, as on E2B.
func (h *handler) holdPaused(c *call, id string) (src *api.Workspace, resume func(), err error) {
	src, state, err := sandboxWorkspace(c, id)
	if err != nil || state != stateRunning {
		return src, func() {}, err
	}
	ctx := c.r.Context()
	if _, err := c.cl.Do(ctx, http.MethodPost, workspacePath(id, "pause"), api.WorkspaceWriteRequest{}, nil); err != nil {
		return nil, nil, err
	}
	resume = func() {
		_, err := c.cl.Do(context.WithoutCancel(ctx), http.MethodPost, workspacePath(id, "start"), api.WorkspaceWriteRequest{}, nil)
		if err == nil {
			_, err = waitRunning(ctx, c.cl, id)
		}
		if err != nil {
			h.c.Log.Warn("sandbox not resumed after its forks", "sandbox_id", id, "err", err)
		}
	}
	if _, err := waitPaused(ctx, c.cl, id); err != nil {
		resume()
		return nil, nil, err
	}
	return src, resume, nil
}

// createRunning creates the Workspace req asks for and waits until it
// runs. One that never runs is deleted: not left for the caller to find.
func createRunning(c *call, req api.WorkspaceCreateRequest) (*api.Workspace, error) {
	ctx := c.r.Context()
	var ws api.Workspace
	if _, err := c.cl.Do(ctx, http.MethodPost, "/v1/workspaces", req, &ws); err != nil {
		return nil, err
	}
	run, err := waitRunning(ctx, c.cl, ws.WorkspaceID)
	if err != nil {
		c.cl.Do(context.WithoutCancel(ctx), http.MethodPost, workspacePath(ws.WorkspaceID, "delete"), api.WorkspaceWriteRequest{}, nil)
		return nil, err
	}
	return run, nil
}
