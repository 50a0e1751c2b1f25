package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"syscall"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The commands of sandboxes whose Start stream this member serves, so
// that process.Process/List, SendSignal, SendInput and CloseStdin find
// them by pid or tag. A command lives as long as its stream: the table
// is this member's, and a command started through another member is not
// found here.

// maxProcessesPerSandbox bounds the commands one sandbox may run through
// this member at once: each holds a guest session and a stream.
const maxProcessesPerSandbox = 256

type process struct {
	p      *guestproto.Process
	config processConfig
	tag    string
	stdin  sync.Mutex // serializes writes and the close of p.Stdin
	closed bool       // p.Stdin was closed (under stdin)
}

type processTable struct {
	mu sync.Mutex
	m  map[string]map[int]*process // sandbox id → pid
}

// add records a started command; false when the sandbox has too many.
func (t *processTable) add(id string, pr *process) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]map[int]*process{}
	}
	if len(t.m[id]) >= maxProcessesPerSandbox {
		return false
	}
	if t.m[id] == nil {
		t.m[id] = map[int]*process{}
	}
	t.m[id][pr.p.PID] = pr
	return true
}

func (t *processTable) remove(id string, pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m[id], pid)
	if len(t.m[id]) == 0 {
		delete(t.m, id)
	}
}

// find is the command of selector in sandbox id.
func (t *processTable) find(id string, sel processSelector) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid, pr := range t.m[id] {
		if (sel.PID != nil && *sel.PID == pid) || (sel.Tag != nil && *sel.Tag == pr.tag) {
			return pr, nil
		}
	}
	return nil, rpcErrorf("not_found", "sandbox %s has no such command running through this member", id)
}

// list is the sandbox's commands by pid.
func (t *processTable) list(id string) []processInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []processInfo{}
	for pid, pr := range t.m[id] {
		info := processInfo{Config: pr.config, PID: pid}
		if pr.tag != "" {
			info.Tag = &pr.tag
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b processInfo) int { return a.PID - b.PID })
	return out
}

// processSelector is process.proto's ProcessSelector: a pid or a tag.
type processSelector struct {
	PID *int    `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    int           `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

// signals are process.proto's Signal values, by name and number.
var signals = map[string]syscall.Signal{"SIGNAL_SIGKILL": syscall.SIGKILL, "9": syscall.SIGKILL, "SIGNAL_SIGTERM": syscall.SIGTERM, "15": syscall.SIGTERM}

// processUnary serves the unary process RPCs of sandbox id.
func (h *handler) processUnary(w http.ResponseWriter, r *http.Request, id, method string) {
	token, err := accessToken(r, id)
	if err != nil {
		unaryError(w, err)
		return
	}
	if err := h.c.Sandboxes.Authorize(r.Context(), token, id); err != nil {
		unaryError(w, rpcError(err))
		return
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvelope))
	if err != nil {
		unaryError(w, rpcErrorf("invalid_argument", "request: %v", err))
		return
	}
	var req struct {
		Process processSelector `json:"process"`
		Signal  json.RawMessage `json:"signal"`
		Input   struct {
			Stdin []byte `json:"stdin"`
			Pty   []byte `json:"pty"`
		} `json:"input"`
		PTY *ptyConfig `json:"pty"`
	}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &req); err != nil {
			unaryError(w, rpcErrorf("invalid_argument", "request: %v", err))
			return
		}
	}
	var out any = struct{}{}
	switch method {
	case "List":
		out = struct {
			Processes []processInfo `json:"processes"`
		}{h.procs.list(id)}
	case "SendSignal":
		err = h.sendSignal(id, req.Process, string(trimQuotes(req.Signal)))
	case "SendInput":
		err = h.sendInput(id, req.Process, append(req.Input.Stdin, req.Input.Pty...))
	case "Update":
		err = h.resize(id, req.Process, req.PTY)
	case "CloseStdin":
		err = h.closeStdin(id, req.Process)
	}
	if err != nil {
		unaryError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

func trimQuotes(b json.RawMessage) []byte {
	if len(b) >= 2 && b[0] == '"' {
		return b[1 : len(b)-1]
	}
	return b
}

func (h *handler) sendSignal(id string, sel processSelector, name string) error {
	sig, ok := signals[name]
	if !ok {
		return rpcErrorf("invalid_argument", "signal %q: give SIGNAL_SIGKILL or SIGNAL_SIGTERM", name)
	}
	pr, err := h.procs.find(id, sel)
	if err != nil {
		return err
	}
	if err := pr.p.Signal(sig); err != nil {
		return rpcErrorf("unavailable", "sandbox %s: signal pid %d: %v", id, pr.p.PID, err)
	}
	return nil
}

func (h *handler) sendInput(id string, sel processSelector, data []byte) error {
	pr, err := h.procs.find(id, sel)
	if err != nil {
		return err
	}
	pr.stdin.Lock()
	defer pr.stdin.Unlock()
	switch {
	case pr.p.Stdin == nil:
		return rpcErrorf("failed_precondition", "sandbox %s: pid %d was started without stdin: start it with stdin: true", id, pr.p.PID)
	case pr.closed:
		return rpcErrorf("failed_precondition", "sandbox %s: pid %d: its stdin is closed", id, pr.p.PID)
	}
	if _, err := pr.p.Stdin.Write(data); err != nil {
		return rpcErrorf("unavailable", "sandbox %s: pid %d: write its stdin: %v", id, pr.p.PID, err)
	}
	return nil
}

func (h *handler) closeStdin(id string, sel processSelector) error {
	pr, err := h.procs.find(id, sel)
	if err != nil {
		return err
	}
	pr.stdin.Lock()
	defer pr.stdin.Unlock()
	if pr.p.Stdin == nil {
		return rpcErrorf("failed_precondition", "sandbox %s: pid %d was started without stdin", id, pr.p.PID)
	}
	if !pr.closed {
		pr.closed = true
		pr.p.Stdin.Close()
	}
	return nil
}

// resize gives a command's terminal a new size.
func (h *handler) resize(id string, sel processSelector, c *ptyConfig) error {
	if c == nil {
		return rpcErrorf("invalid_argument", "update without a pty size: nothing to change")
	}
	size, err := c.winSize()
	if err != nil {
		return err
	}
	pr, err := h.procs.find(id, sel)
	if err != nil {
		return err
	}
	if pr.p.Stderr != nil {
		return rpcErrorf("failed_precondition", "sandbox %s: pid %d has no terminal to resize", id, pr.p.PID)
	}
	if err := pr.p.Resize(size.Rows, size.Cols); err != nil {
		return rpcErrorf("unavailable", "sandbox %s: resize pid %d: %v", id, pr.p.PID, err)
	}
	return nil
}
