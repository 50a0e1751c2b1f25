package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Kept execs (ExecRequest.Keep) are the commands E2B's SDKs start: they
// run on when their caller goes away, a pause included (the data
// channel's session ends and a new one begins), and a later caller
// attaches to one by pid (CallExecConnect). The agent reads a kept
// process's output itself and writes it to the streams attached at that
// moment, or drops it when none is; any attached stream may write its
// stdin, which only ExecControl.CloseStdin closes.

// keptWriteWait bounds one write of output to an attached stream: a
// caller that stops reading is detached rather than stalling the
// process and every other caller.
const keptWriteWait = 30 * time.Second

// keptExecs are the kept execs that run, by pid.
type keptExecs struct {
	mu sync.Mutex
	m  map[int]*keptExec
	n  int // running and starting: bounded by Options.MaxKeptExecs
}

// reserve takes a place for a kept exec about to start, of max.
func (t *keptExecs) reserve(max int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n >= max {
		return false
	}
	t.n++
	return true
}

// add records a started exec in its place; remove frees it (pid 0: the
// exec never started).
func (t *keptExecs) add(k *keptExec) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[int]*keptExec{}
	}
	t.m[k.pid] = k
}

func (t *keptExecs) remove(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, pid)
	t.n--
}

func (t *keptExecs) get(pid int) *keptExec {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[pid]
}

func (t *keptExecs) list() []guestproto.KeptExec {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []guestproto.KeptExec{}
	for _, k := range t.m {
		out = append(out, guestproto.KeptExec{PID: k.pid, PTY: k.pty, Meta: k.meta})
	}
	slices.SortFunc(out, func(a, b guestproto.KeptExec) int { return a.PID - b.PID })
	return out
}

// keptExec is one kept process.
type keptExec struct {
	pid   int
	pty   bool
	meta  json.RawMessage
	proc  *os.Process
	st    *stdio
	stdin *os.File // the stdin pipe's write end or the terminal; nil: /dev/null

	mu    sync.Mutex
	subs  map[*keptSub]struct{} // the attached streams
	ended bool                  // the output is done: no stream attaches any more
	exit  guestproto.ExecExit
}

// keptSub is one caller's attached streams: its control stream and
// stdin, stdout and stderr (nil where not asked or not there).
type keptSub struct {
	ctl     net.Conn
	streams [3]net.Conn
}

// runKept starts req as a kept exec, answers ctl, and serves ctl and
// streams as its first attached caller.
func (a *agent) runKept(ctl net.Conn, req guestproto.ExecRequest, streams [3]net.Conn) {
	if len(req.Meta) > guestproto.MaxExecMeta || (len(req.Meta) > 0 && !json.Valid(req.Meta)) {
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("exec meta: want JSON of at most %d bytes", guestproto.MaxExecMeta)})
		return
	}
	if !a.kept.reserve(a.opts.MaxKeptExecs) {
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeFailed, Message: fmt.Sprintf("the guest keeps %d processes already: end one first", a.opts.MaxKeptExecs)})
		return
	}
	st := &stdio{}
	k := &keptExec{pty: req.PTY != nil, meta: req.Meta, st: st, subs: map[*keptSub]struct{}{}}
	proc, exited, m, err := a.startProcess(req, st, func() error {
		if req.PTY != nil {
			if err := st.openPTY(req.Root, req.PTY, nil, keptOutput{k, 1}); err != nil {
				return err
			}
			k.stdin = st.master
			return nil
		}
		if err := st.openPipes(req.Stdin, nil, [2]io.WriteCloser{keptOutput{k, 1}, keptOutput{k, 2}}); err != nil {
			return err
		}
		k.stdin = st.stdinW
		return nil
	})
	if err != nil {
		st.finish(nil)
		a.kept.remove(0)
		respond(ctl, nil, err)
		return
	}
	k.pid, k.proc = proc.Pid, proc
	a.kept.add(k)
	// The agent owns it: it outlives this stream and its session.
	a.wg.Go(func() { a.keepRunning(k, m, exited) })
	respond(ctl, guestproto.ExecStarted{PID: k.pid}, nil)
	k.serve(ctl, streams)
}

// keepRunning waits for k's end: its output read (within outputDelay of
// the exit, as an exec's), then its exit reported to every caller still
// attached.
func (a *agent) keepRunning(k *keptExec, m *managed, exited <-chan unix.WaitStatus) {
	defer a.execs.Done()
	exit := a.ended(k.pid, m, <-exited)
	var waits sync.WaitGroup
	if !waitTimeout(&waits, &k.st.outputs, outputDelay) {
		k.st.closeAll() // a background child holds the output open
		k.st.outputs.Wait()
	}
	waits.Wait()
	k.mu.Lock()
	k.ended, k.exit = true, exit
	subs := make([]*keptSub, 0, len(k.subs))
	for s := range k.subs {
		subs = append(subs, s)
	}
	k.mu.Unlock()
	for _, s := range subs {
		if in := s.streams[0]; in != nil {
			in.SetReadDeadline(time.Unix(1, 0)) // ends its copy to stdin
		}
	}
	k.st.finish(nil) // no stream's input copy starts once ended: finish waits for them all
	a.kept.remove(k.pid)
	for _, s := range subs {
		s.exit(exit)
	}
	k.proc.Release()
}

// exit reports the exit to the caller of s and ends its control reader.
func (s *keptSub) exit(exit guestproto.ExecExit) {
	for _, o := range s.streams[1:] {
		if o != nil {
			o.Close()
		}
	}
	guestproto.WriteFrame(s.ctl, exit)
	s.ctl.SetReadDeadline(time.Unix(1, 0))
}

// serve attaches ctl and streams to k until the caller goes away or k
// ends: its input goes to k's stdin, its control frames are applied.
func (k *keptExec) serve(ctl net.Conn, streams [3]net.Conn) {
	sub := &keptSub{ctl: ctl, streams: streams}
	k.mu.Lock()
	if k.ended {
		exit := k.exit
		k.mu.Unlock()
		sub.exit(exit)
		return
	}
	k.subs[sub] = struct{}{}
	if in := streams[0]; in != nil && k.stdin != nil {
		// Counted in st.inputs under mu before the end: keepRunning's
		// finish closes stdin and waits for this copy.
		k.st.inputs.Go(func() { copyQuiet(k.stdin, in) })
	}
	k.mu.Unlock()
	for {
		var m guestproto.ExecControl
		if err := guestproto.ReadFrame(ctl, &m); err != nil {
			break
		}
		k.control(m)
	}
	k.detach(sub)
	if in := streams[0]; in != nil {
		in.SetReadDeadline(time.Unix(1, 0)) // ends its copy unless it is blocked on a full stdin
	}
}

// detach forgets sub; its control stream is closed so its reader ends.
func (k *keptExec) detach(sub *keptSub) {
	k.mu.Lock()
	delete(k.subs, sub)
	k.mu.Unlock()
	sub.ctl.Close()
}

func (k *keptExec) control(m guestproto.ExecControl) {
	if m.Signal != 0 {
		k.proc.Signal(unix.Signal(m.Signal))
	}
	if m.Resize != nil {
		k.st.resize(m.Resize)
	}
	if len(m.Input) > 0 && k.stdin != nil {
		k.stdin.Write(m.Input) // fails once stdin was closed
	}
	if m.CloseStdin && !k.pty && k.stdin != nil {
		k.stdin.Close() // a terminal's input ends with the terminal
	}
}

// keptOutput is fd 1 or 2 of k: each write goes to every attached
// caller's stream, none of whom can stall the process for long.
type keptOutput struct {
	k  *keptExec
	fd int
}

func (o keptOutput) Write(b []byte) (int, error) {
	o.k.mu.Lock()
	subs := make([]*keptSub, 0, len(o.k.subs))
	for s := range o.k.subs {
		subs = append(subs, s)
	}
	o.k.mu.Unlock()
	for _, s := range subs {
		dst := s.streams[o.fd]
		if dst == nil {
			continue
		}
		dst.SetWriteDeadline(time.Now().Add(keptWriteWait))
		if _, err := dst.Write(b); err != nil {
			o.k.detach(s)
		}
	}
	return len(b), nil
}

// Close keeps the callers' streams: the exit report closes them.
func (keptOutput) Close() error { return nil }

// handleExecConnect attaches a caller to a kept exec.
func (a *agent) handleExecConnect(ctx context.Context, ctl net.Conn, raw json.RawMessage) {
	defer ctl.Close()
	var req guestproto.ExecConnect
	if err := decodeArgs(raw, &req); err != nil {
		respond(ctl, nil, err)
		return
	}
	if req.ID == "" {
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: "exec-connect needs an id"})
		return
	}
	// The caller's streams are taken first, whatever the answer, so
	// that none waits for a claim that will not come.
	var streams [3]net.Conn
	if !req.ControlOnly {
		var ok bool
		streams, ok = a.takeStreams(ctx, ctl, req.ID, req.Stdin, req.PTY)
		defer closeStreams(streams)
		if !ok {
			return
		}
	}
	k := a.kept.get(req.PID)
	switch {
	case k == nil:
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeNotFound, Message: fmt.Sprintf("no kept process %d runs", req.PID)})
		return
	case k.pty != req.PTY && !req.ControlOnly:
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("kept process %d has a terminal: %v; attach as it was started", req.PID, k.pty)})
		return
	}
	if k.stdin == nil && streams[0] != nil {
		streams[0].Close() // it was started without stdin: nothing to write to
		streams[0] = nil
	}
	respond(ctl, guestproto.ExecStarted{PID: k.pid}, nil)
	k.serve(ctl, streams)
}
