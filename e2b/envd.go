package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The sandbox API: what E2B's SDKs send to envd, the agent in an E2B
// sandbox (port 49983), reached here through E2B_SANDBOX_URL with the
// sandbox in the E2b-Sandbox-Id header. A request carries the sandbox's
// envdAccessToken (X-Access-Token); Sandboxes checks it and opens the
// guest through its node's data plane as the key the token was issued
// to, and the request is translated to the guest protocol.

// envdPort is the port of envd in an E2B sandbox.
const envdPort = "49983"

// Sandboxes reaches the guests of sandboxes for the sandbox API.
type Sandboxes interface {
	// AccessToken is the envdAccessToken of sandbox id for the holder of
	// key, answered with a create or a connect.
	AccessToken(key, id string) (string, error)
	// Open checks token for sandbox id and opens a session to its guest
	// as the key the token was issued to, or gives one it keeps for that
	// key: the caller calls release when done, never Close. A refusal is
	// an *api.Error.
	Open(ctx context.Context, token, id, remote string) (gc *guestproto.Client, release func(), err error)
	// TrafficToken is the trafficAccessToken of sandbox id for the
	// holder of key.
	TrafficToken(key, id string) (string, error)
	// CreatorToken is the envdAccessToken of the key that created sandbox
	// id (CreatorLabel), which signs its file URLs.
	CreatorToken(id string) (string, error)
	// OpenPort opens sandbox id's guest for traffic to its ports, with
	// its trafficAccessToken ("" without one), as TrafficLabel says.
	OpenPort(ctx context.Context, token, id, remote string) (*guestproto.Client, error)
}

// keepaliveDefault is how often a stream without a Keepalive-Ping-Interval
// header gets a keepalive event: proxies drop streams silent for long.
const keepaliveDefault = 50 * time.Second

// sandboxTraffic serves a request meant for a sandbox (E2b-Sandbox-Id).
func (h *handler) sandboxTraffic(w http.ResponseWriter, r *http.Request, id string) {
	if port := r.Header.Get("E2b-Sandbox-Port"); port != envdPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("sandbox %s: E2b-Sandbox-Port %.20q is no port: give 1 to 65535", api.EscapeText(id), port))
			return
		}
		h.portTraffic(w, r, id, n)
		return
	}
	h.envd(w, r, id)
}

// envd serves a request to sandbox id's envd.
func (h *handler) envd(w http.ResponseWriter, r *http.Request, id string) {
	if h.c.Sandboxes == nil {
		writeError(w, http.StatusNotFound, "this member does not serve E2B's sandbox API")
		return
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		h.health(w, r, id)
	case r.Method == http.MethodPost && r.URL.Path == "/process.Process/Start":
		h.processStart(w, r, id)
	case r.Method == http.MethodPost && r.URL.Path == "/process.Process/Connect":
		h.processConnect(w, r, id)
	case r.Method == http.MethodPost && slices.Contains([]string{"/process.Process/List", "/process.Process/SendSignal", "/process.Process/SendInput", "/process.Process/CloseStdin", "/process.Process/Update"}, r.URL.Path):
		h.processUnary(w, r, id, strings.TrimPrefix(r.URL.Path, "/process.Process/"))
	case r.Method == http.MethodGet && r.URL.Path == "/files":
		h.readFile(w, r, id)
	case r.Method == http.MethodPost && r.URL.Path == "/files":
		h.writeFiles(w, r, id)
	case r.Method == http.MethodPost && r.URL.Path == "/filesystem.Filesystem/WatchDir":
		h.watchDir(w, r, id)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/"):
		h.filesystemUnary(w, r, id, strings.TrimPrefix(r.URL.Path, "/filesystem.Filesystem/"))
	case strings.HasPrefix(r.URL.Path, "/process.Process/"):
		unaryError(w, rpcErrorf("unimplemented", "%s is not served by Kibotos's E2B sandbox API yet (docs/e2b.md)", r.URL.Path))
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of E2B's sandbox API that Kibotos serves (docs/e2b.md)", r.Method, r.URL.Path))
	}
}

// accessToken is the request's access token to sandbox id.
func accessToken(r *http.Request, id string) (string, error) {
	token := r.Header.Get("X-Access-Token")
	if token == "" {
		return "", rpcErrorf("unauthenticated", "sandbox %s: no access token: send the envdAccessToken of its create or connect as X-Access-Token", id)
	}
	return token, nil
}

// rpcError is err (an *api.Error from Sandboxes) as a Connect error,
// classed as errorStatus classes it for the control API.
func rpcError(err error) *connectError {
	var e *api.Error
	if !errors.As(err, &e) {
		return rpcErrorf("internal", "%v", err)
	}
	code := "internal"
	switch e.Code {
	case api.CodeInvalidArgument, api.CodeTooLarge:
		code = "invalid_argument"
	case api.CodeUnauthenticated, api.CodePermissionDenied, api.CodeNotFound, api.CodeResourceExhausted, api.CodeUnavailable:
		code = string(e.Code) // the same names in Connect
	case api.CodeFailedPrecondition, api.CodeAlreadyExists, api.CodeAborted:
		code = "failed_precondition"
	case api.CodeDeadlineExceeded:
		code = "unavailable"
	}
	return &connectError{Code: code, Message: e.Message}
}

// openGuest opens the sandbox's guest with the request's access token,
// or for a signed file URL its creator's.
func (h *handler) openGuest(r *http.Request, id string) (*guestproto.Client, func(), error) {
	token, err := accessToken(r, id)
	if err != nil && r.URL.Path == "/files" && r.URL.Query().Has("signature") {
		token, err = h.signedToken(r, id)
	}
	if err != nil {
		return nil, nil, err
	}
	gc, release, err := h.c.Sandboxes.Open(r.Context(), token, id, r.RemoteAddr)
	if err != nil {
		return nil, nil, rpcError(err)
	}
	return gc, release, nil
}

// health is envd's GET /health: 204 when the sandbox's guest answers
// for the token's key, else 502 as E2B answers for a sandbox that is not
// running.
func (h *handler) health(w http.ResponseWriter, r *http.Request, id string) {
	gc, release, err := h.openGuest(r, id)
	if err != nil {
		writeError(w, http.StatusBadGateway, err.Error())
		return
	}
	defer release()
	if _, err := gc.GuestInfo(r.Context()); err != nil { // a kept session may be the answer: ask
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: its guest does not answer: %v", id, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// processConfig, startRequest and the events are process.proto's JSON.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	PTY     *ptyConfig    `json:"pty"`
	Tag     *string       `json:"tag"`
	Stdin   *bool         `json:"stdin"`
}

// ptyConfig is process.proto's PTY: a terminal of that size.
type ptyConfig struct {
	Size struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"size"`
}

// winSize is a terminal size the guest takes, refused out of bounds.
func (c *ptyConfig) winSize() (*guestproto.WinSize, error) {
	if c.Size.Cols == 0 || c.Size.Rows == 0 || c.Size.Cols > 4096 || c.Size.Rows > 4096 {
		return nil, rpcErrorf("invalid_argument", "pty size %dx%d: give 1 to 4096 columns and rows", c.Size.Cols, c.Size.Rows)
	}
	return &guestproto.WinSize{Cols: uint16(c.Size.Cols), Rows: uint16(c.Size.Rows)}, nil
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID int `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Pty    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int    `json:"exitCode"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

type startResponse struct {
	Event processEvent `json:"event"`
}

// processStart is process.Process/Start: the command runs in the guest
// as the request's user, its output streamed as it comes, then its end.
// As envd's, it runs on when the caller goes away: the guest keeps it,
// and process.Process/Connect attaches to it again by pid or tag, from
// any member, a pause in between included. Past the request's timeout
// it is killed.
func (h *handler) processStart(w http.ResponseWriter, r *http.Request, id string) {
	var req startRequest
	var exec guestproto.ExecRequest
	h.streamRPC(w, r, id, &req, func(r *http.Request) (err error) {
		exec, err = execRequest(r, &req)
		return err
	}, func(r *http.Request, gc *guestproto.Client) error {
		ctx := r.Context()
		if gc.Info().Has(guestproto.CapExecKeep) {
			exec.Keep, exec.Meta = true, processMeta(req.Process, req.Tag)
		}
		p, err := startExec(ctx, gc, exec)
		if err != nil {
			var ge *guestproto.Error
			if errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound {
				return rpcErrorf("not_found", "sandbox %s: %s", id, ge.Message)
			}
			return rpcErrorf("failed_precondition", "sandbox %s: start %s: %v", id, req.Process.Cmd, err)
		}
		if !exec.Keep {
			// A guest from before kept execs: the command dies with the
			// request, as nothing could attach to it again.
			stop := context.AfterFunc(ctx, func() { p.Signal(syscall.SIGKILL) })
			defer stop()
		}
		streamProcess(r, newStream(w), p, req.PTY != nil, id, req.Process.Cmd, true)
		return nil
	})
}

// streamRPC serves a server-streaming RPC of sandbox id: it reads the
// request into req, checks it (check may be nil), opens the guest and
// runs serve, which streams. An error before serve streams ends the
// stream as well: a streaming client reads only the HTTP status of any
// other answer, and maps 404 to unimplemented.
func (h *handler) streamRPC(w http.ResponseWriter, r *http.Request, id string, req any, check func(*http.Request) error, serve func(*http.Request, *guestproto.Client) error) {
	r, cancel, err := streamRequest(w, r, req)
	defer cancel()
	if err == nil && check != nil {
		err = check(r)
	}
	if err == nil {
		var gc *guestproto.Client
		var release func()
		if gc, release, err = h.openGuest(r, id); err == nil {
			defer release()
			err = serve(r, gc)
		}
	}
	if err != nil {
		newStream(w).end(err)
	}
}

// streamProcess streams p's events to s: its start, its output as it
// comes, keepalives, its end. At the request's deadline the command is
// killed when kill says so (a start) and the stream ends
// deadline_exceeded; when the caller goes away, p is only let go.
func streamProcess(r *http.Request, s *stream, p *guestproto.Process, pty bool, id, cmd string, kill bool) {
	ctx := r.Context()
	defer p.Close()
	s.send(startResponse{Event: processEvent{Start: &startEvent{PID: p.PID}}})
	var wg sync.WaitGroup
	pump := func(src io.Reader, event func([]byte) *dataEvent) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				s.send(startResponse{Event: processEvent{Data: event(slices.Clone(buf[:n]))}})
			}
			if err != nil {
				return
			}
		}
	}
	if pty {
		wg.Go(func() { pump(p.Stdout, func(b []byte) *dataEvent { return &dataEvent{Pty: b} }) })
	} else {
		wg.Go(func() { pump(p.Stdout, func(b []byte) *dataEvent { return &dataEvent{Stdout: b} }) })
		wg.Go(func() { pump(p.Stderr, func(b []byte) *dataEvent { return &dataEvent{Stderr: b} }) })
	}
	wg.Go(func() { keepalive(ctx, s, p.Done(), keepaliveInterval(r)) })
	// The caller gone or its deadline past: let the process go (its
	// streams closed end the pumps), after killing it for a deadline.
	stop := context.AfterFunc(ctx, func() {
		if kill && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			p.Signal(syscall.SIGKILL)
		}
		p.Close()
	})
	defer stop()
	exit, err := p.Wait()
	wg.Wait()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && kill:
		s.end(rpcErrorf("deadline_exceeded", "sandbox %s: %s ran past the request's timeout and was killed", id, cmd))
		return
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		s.end(rpcErrorf("deadline_exceeded", "sandbox %s: the request's timeout passed; the command runs on", id))
		return
	case ctx.Err() != nil:
		return // the caller is gone
	}
	if err != nil {
		s.end(rpcErrorf("unavailable", "sandbox %s: lost the command: %v (the sandbox may have been paused or killed meanwhile: connect to it again by pid)", id, err))
		return
	}
	end := &endEvent{ExitCode: exit.ExitCode, Exited: exit.Signal == 0, Status: "exit status " + strconv.Itoa(exit.ExitCode)}
	if exit.Signal != 0 {
		end.ExitCode = -1
		end.Status = "signal: " + syscall.Signal(exit.Signal).String()
	}
	if end.ExitCode != 0 {
		end.Error = end.Status // what the SDK's CommandExitError says
	}
	s.send(startResponse{Event: processEvent{End: end}})
	s.end(nil)
}

// execRequest is the guest's exec of a start: what is not served yet is
// refused, saying so.
func execRequest(r *http.Request, req *startRequest) (guestproto.ExecRequest, error) {
	var out guestproto.ExecRequest
	switch {
	case req.Process.Cmd == "":
		return out, rpcErrorf("invalid_argument", "process.cmd is empty: give the program to run")
	}
	out.Argv = append([]string{req.Process.Cmd}, req.Process.Args...)
	for _, k := range slices.Sorted(maps.Keys(req.Process.Envs)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return out, rpcErrorf("invalid_argument", "environment variable name %q is not valid", k)
		}
		out.Env = append(out.Env, k+"="+req.Process.Envs[k])
	}
	if req.Process.Cwd != nil {
		out.Dir = *req.Process.Cwd
	}
	out.Root = guestproto.WorkspaceRoot
	out = withUser(r, out)
	out.Stdin = req.Stdin != nil && *req.Stdin
	if req.PTY != nil {
		size, err := req.PTY.winSize()
		if err != nil {
			return out, err
		}
		// A terminal's input is its keyboard: always there.
		out.PTY, out.Stdin = size, true
	}
	return out, nil
}

// withUser is req run as the user the request names. E2B's "user" is
// the account of its templates' images, which a template built for E2B
// has as its default user (the image config's): it is left to the
// template, so that a template whose default user has another name still
// runs the SDK's commands. Any other name is an account of the sandbox's
// /etc/passwd, "root" among them: the sandbox is its user's own machine.
func withUser(r *http.Request, req guestproto.ExecRequest) guestproto.ExecRequest {
	u := r.URL.Query().Get("username") // /files names it there
	if u == "" {
		u = basicUser(r)
	}
	if u != "user" {
		req.User = u
	}
	return req
}

// startExec starts req in the guest with the Workspace's environment.
func startExec(ctx context.Context, gc *guestproto.Client, req guestproto.ExecRequest) (*guestproto.Process, error) {
	if req.User != "" && !gc.Info().Has(guestproto.CapExecUser) {
		return nil, fmt.Errorf("the guest agent of this sandbox predates commands as another user than the template's (%s): stop and start the sandbox to update it", req.User)
	}
	return gc.Exec(ctx, req.WithWorkspaceEnv(gc.Info()))
}

// basicUser is the user name of envd's Authorization: Basic header
// (the SDK's user option), "" without one.
func basicUser(r *http.Request) string {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user
}

// requestDeadline bounds the request by its Connect-Timeout-Ms.
func requestDeadline(r *http.Request) (context.Context, context.CancelFunc) {
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		return context.WithTimeout(r.Context(), time.Duration(ms)*time.Millisecond)
	}
	return context.WithCancel(r.Context())
}

// keepaliveInterval is the stream's Keepalive-Ping-Interval (seconds).
func keepaliveInterval(r *http.Request) time.Duration {
	if s, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return keepaliveDefault
}

// keepalive sends a keepalive event every interval until done or ctx.
func keepalive(ctx context.Context, s *stream, done <-chan struct{}, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
			if s.send(startResponse{Event: processEvent{Keepalive: &struct{}{}}}) != nil {
				return
			}
		}
	}
}
