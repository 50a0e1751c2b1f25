package e2b

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"syscall"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The commands of a sandbox are the guest's kept execs: process.Process
// List, Connect, SendSignal, SendInput, CloseStdin and Update find them
// there by pid or tag, whichever member takes the request, and after a
// pause. Each exec carries its start's config and tag as its meta.

// processMeta is the meta a command's kept exec carries: its config and
// tag, as List answers them. A config too large for it keeps its
// command line without the environment.
func processMeta(config processConfig, tag *string) json.RawMessage {
	m := keptMeta{Config: config, Tag: tag}
	raw, err := json.Marshal(m)
	if err == nil && len(raw) <= guestproto.MaxExecMeta {
		return raw
	}
	m.Config.Envs = nil
	if raw, err = json.Marshal(m); err == nil && len(raw) <= guestproto.MaxExecMeta {
		return raw
	}
	m.Config = processConfig{Cmd: config.Cmd}
	raw, _ = json.Marshal(m)
	return raw
}

type keptMeta struct {
	Config processConfig `json:"config"`
	Tag    *string       `json:"tag,omitempty"`
}

// commands are the sandbox's commands the guest keeps, as List answers.
func commands(ctx context.Context, gc *guestproto.Client) ([]processInfo, map[int]bool, error) {
	if !gc.Info().Has(guestproto.CapExecKeep) {
		return nil, nil, rpcErrorf("failed_precondition", "the guest agent of this sandbox predates commands that outlive their caller: stop and start the sandbox to list them")
	}
	kept, err := gc.ListExecs(ctx)
	if err != nil {
		return nil, nil, rpcErrorf("unavailable", "list the sandbox's commands: %v", err)
	}
	out := []processInfo{}
	pty := map[int]bool{}
	for _, k := range kept {
		var m keptMeta
		if len(k.Meta) == 0 || json.Unmarshal(k.Meta, &m) != nil {
			continue // not a command of this API (kibo exec keeps none)
		}
		out = append(out, processInfo{Config: m.Config, PID: k.PID, Tag: m.Tag})
		pty[k.PID] = k.PTY
	}
	return out, pty, nil
}

// find is the pid of the command of sel in the sandbox of gc, and
// whether it has a terminal.
func find(ctx context.Context, gc *guestproto.Client, id string, sel processSelector) (int, bool, error) {
	list, pty, err := commands(ctx, gc)
	if err != nil {
		return 0, false, err
	}
	for _, c := range list {
		if (sel.PID != nil && *sel.PID == c.PID) || (sel.Tag != nil && c.Tag != nil && *sel.Tag == *c.Tag) {
			return c.PID, pty[c.PID], nil
		}
	}
	return 0, false, rpcErrorf("not_found", "sandbox %s runs no such command", id)
}

// attach attaches to the output of the command of sel.
func attach(ctx context.Context, gc *guestproto.Client, id string, sel processSelector) (*guestproto.Process, bool, error) {
	pid, pty, err := find(ctx, gc, id, sel)
	if err != nil {
		return nil, false, err
	}
	p, err := gc.ConnectExec(ctx, pid, false, pty)
	if err != nil {
		return nil, false, rpcErrorf("not_found", "sandbox %s: command %d: %v", id, pid, err)
	}
	return p, pty, nil
}

// processConnect is process.Process/Connect: the events of a running
// command from now on, as its start streams them.
func (h *handler) processConnect(w http.ResponseWriter, r *http.Request, id string) {
	var req struct {
		Process processSelector `json:"process"`
	}
	h.streamRPC(w, r, id, &req, nil, func(r *http.Request, gc *guestproto.Client) error {
		p, pty, err := attach(r.Context(), gc, id, req.Process)
		if err != nil {
			return err
		}
		streamProcess(r, newStream(w), p, pty, id, "the command", false)
		return nil
	})
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
	gc, release, err := h.openGuest(r, id)
	if err != nil {
		unaryError(w, err)
		return
	}
	defer release()
	var out any = struct{}{}
	if method == "List" {
		list, _, err := commands(r.Context(), gc)
		if err != nil {
			unaryError(w, err)
			return
		}
		out = struct {
			Processes []processInfo `json:"processes"`
		}{list}
	} else if err := control(r.Context(), gc, id, method, req.Process, string(trimQuotes(req.Signal)), append(req.Input.Stdin, req.Input.Pty...), req.PTY); err != nil {
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

// control sends a command of sel what method asks: a signal, input, the
// close of its stdin, a terminal size, and returns once the guest took
// it.
func control(ctx context.Context, gc *guestproto.Client, id, method string, sel processSelector, signal string, input []byte, size *ptyConfig) error {
	var m guestproto.ExecControl
	switch method {
	case "SendSignal":
		sig, ok := signals[signal]
		if !ok {
			return rpcErrorf("invalid_argument", "signal %q: give SIGNAL_SIGKILL or SIGNAL_SIGTERM", signal)
		}
		m.Signal = int(sig)
	case "SendInput":
		m.Input = input
	case "CloseStdin":
		m.CloseStdin = true
	case "Update":
		if size == nil {
			return rpcErrorf("invalid_argument", "update without a pty size: nothing to change")
		}
		ws, err := size.winSize()
		if err != nil {
			return err
		}
		m.Resize = ws
	}
	pid, pty, err := find(ctx, gc, id, sel)
	if err != nil {
		return err
	}
	if m.Resize != nil && !pty {
		return rpcErrorf("failed_precondition", "sandbox %s: pid %d has no terminal to resize", id, pid)
	}
	p, err := gc.ControlExec(ctx, pid)
	if err != nil {
		return rpcErrorf("not_found", "sandbox %s: command %d: %v", id, pid, err)
	}
	defer p.Close()
	if err := p.Control(m); err != nil {
		return rpcErrorf("not_found", "sandbox %s: pid %d: %v", id, pid, err)
	}
	// Answered once the guest took it: the session ends after this.
	if err := p.Detach(ctx); err != nil {
		return rpcErrorf("unavailable", "sandbox %s: pid %d: %v", id, pid, err)
	}
	return nil
}
