package dataplane

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/fdpass"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// The control socket carries JSON requests and replies, one per line, one
// after the other on a connection. Each generation has its own socket, so
// an old process waiting for its connections to end and its successor can
// both be reached. A listening socket rides on the line that carries it as
// SCM_RIGHTS. A lend request turns its connection into a guest session
// (lend.go).
type controlRequest struct {
	Op         string `json:"op"`
	State      *State `json:"state,omitempty"`
	InstanceID string `json:"instance_id,omitempty"` // lend
}

type controlReply struct {
	Error string `json:"error,omitempty"`
	// Code says, with Error, what the caller can do about it (lend:
	// codeNotHeld, dial the guest yourself).
	Code  string                `json:"code,omitempty"`
	Hello *Hello                `json:"hello,omitempty"`
	State *State                `json:"state,omitempty"` // export-state
	Lend  *guestproto.GuestInfo `json:"lend,omitempty"`  // lend: the handshake of the lent session
}

const (
	opHello        = "hello"
	opState        = "state"
	opExportState  = "export-state"  // the state last applied, for a successor
	opTakeListener = "take-listener" // reply: a copy of the listening socket
	opListener     = "listener"      // request: the listening socket to serve
	opDrain        = "drain"         // stop accepting; exit once the connections ended
	opEnd          = "end"           // close every connection now and exit
	opLend         = "lend"          // become a guest session of one Instance (lend.go)
)

// maxControlLine bounds one request or reply (a state with every target,
// the certificate and the key is a few KiB per hundred targets).
const maxControlLine = 16 << 20

// maxControlFDs is how many descriptors one line may carry.
const maxControlFDs = 2

// ControlSocket is the control socket of generation gen in socketDir.
func ControlSocket(socketDir string, gen uint64) string {
	return generations.ControlSocket(socketDir, gen)
}

func listenControl(dir string, gen uint64) (*net.UnixListener, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dataplane: socket directory %s: %w", dir, err)
	}
	// Only root (the node) may push state: the directory guards the socket.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dataplane: socket directory %s: %w", dir, err)
	}
	ln, err := generations.ListenControl(dir, gen)
	if err != nil {
		return nil, fmt.Errorf("dataplane: %w", err)
	}
	return ln, nil
}

// ctlConn is one end of a control connection: lines out, with optional
// descriptors, and lines in, collecting the descriptors that came along.
type ctlConn struct {
	c  *fdpass.Conn
	br *bufio.Reader
}

func newCtlConn(c *net.UnixConn) *ctlConn {
	fc := fdpass.NewConn(c, maxControlFDs)
	return &ctlConn{c: fc, br: bufio.NewReader(fc)}
}

func (cc *ctlConn) read(v any) error {
	var line []byte
	for {
		frag, err := cc.br.ReadSlice('\n')
		line = append(line, frag...)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
		if len(line) > maxControlLine {
			return fmt.Errorf("dataplane: control line longer than %d bytes", maxControlLine)
		}
	}
	return json.Unmarshal(line, v)
}

// write sends v as one line; fds ride on it (the caller keeps them open
// until write returns).
func (cc *ctlConn) write(v any, fds ...int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return cc.c.WriteFDs(append(b, '\n'), fds...)
}

func (cc *ctlConn) takeFDs() []int { return cc.c.TakeFDs() }

func (cc *ctlConn) close() { cc.c.Close() }

// serveControl accepts control connections until ln is closed; each is
// served by a goroutine of s.controlConns, which endControls waits for.
func (s *Server) serveControl(ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.controls[conn] = struct{}{}
		s.mu.Unlock()
		s.controlConns.Go(func() {
			defer func() {
				s.mu.Lock()
				delete(s.controls, conn)
				s.mu.Unlock()
			}()
			s.controlConn(conn)
		})
	}
}

// controlWait is how long a control connection still open when Run ends
// may take to write the reply in hand.
const controlWait = 2 * time.Second

// endControls ends the control connections once the accept loop returned
// (no more start) and waits for them. Reads end, but the reply to the
// request in hand still goes out: often the drain or end that let Run
// return, which the node would otherwise take for a failed one. A lent
// session's connection ends with its reads.
func (s *Server) endControls() {
	s.mu.Lock()
	for c := range s.controls {
		c.CloseRead()
		c.SetWriteDeadline(time.Now().Add(controlWait))
	}
	s.mu.Unlock()
	s.controlConns.Wait()
}

func (s *Server) controlConn(conn *net.UnixConn) {
	cc := newCtlConn(conn)
	lent := false
	defer func() {
		if !lent {
			cc.close()
		}
	}()
	for {
		var req controlRequest
		if err := cc.read(&req); err != nil {
			return
		}
		fds := cc.takeFDs()
		if req.Op == opLend {
			fdpass.Close(fds)
			lent = true
			s.lend(cc, req.InstanceID) // the connection is the session's now
			return
		}
		rep, out := s.handleControl(req, fds)
		err := cc.write(rep, out...)
		fdpass.Close(out)
		if err != nil {
			return
		}
	}
}

// handleControl answers one request. fds came with it and are closed
// here (installListener keeps copies); out are descriptors to send back,
// closed by the caller.
func (s *Server) handleControl(req controlRequest, fds []int) (rep controlReply, out []int) {
	defer fdpass.Close(fds)
	if len(fds) > 0 && req.Op != opListener {
		return controlReply{Error: fmt.Sprintf("dataplane: a %q request carried %d descriptors: only %q carries one", req.Op, len(fds), opListener)}, nil
	}
	var err error
	switch req.Op {
	case opHello:
		h := s.hello()
		rep.Hello = &h
	case opState:
		if req.State == nil {
			err = errors.New("dataplane: state request without state")
		} else if err = s.apply(*req.State); err != nil {
			s.log.Error("data-plane state refused", "err", err)
		}
	case opExportState:
		rep.State, err = s.exportState()
	case opTakeListener:
		out, err = s.takeListener()
	case opListener:
		err = s.installListener(fds)
	case opDrain:
		err = s.drainForSuccessor()
	case opEnd:
		s.end()
	default:
		err = fmt.Errorf("dataplane: unknown control op %q (this is generation %d, revision %s, protocol %d)", req.Op, s.cfg.Generation, buildinfo.SourceRevision(), ControlProtocol)
	}
	if err != nil {
		return controlReply{Error: err.Error()}, nil
	}
	return rep, out
}

func (s *Server) hello() Hello {
	tls := s.cfg.TLS
	s.mu.Lock()
	defer s.mu.Unlock()
	return Hello{
		Revision:     buildinfo.SourceRevision(),
		Release:      buildinfo.ReleaseName(),
		Protocol:     ControlProtocol,
		Listen:       s.cfg.Listen,
		Address:      s.addr,
		Generation:   s.cfg.Generation,
		PID:          os.Getpid(),
		TLS:          &tls,
		Listening:    s.ln != nil,
		Draining:     s.draining,
		Connections:  len(s.conns),
		StateApplied: s.applied,
		Counters:     s.counters(),
		Instances:    s.activityLocked(),
		Activity:     true,
	}
}

// controlError is an error a process answered, with its code.
type controlError struct{ code, msg string }

func (e *controlError) Error() string { return e.msg }

// dialControl connects to a control socket; ctx bounds the whole
// conversation on it (until stop is called).
func dialControl(ctx context.Context, socket string) (cc *ctlConn, stop func() bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, nil, err
	}
	cc = newCtlConn(conn.(*net.UnixConn))
	stop = context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	return cc, stop, nil
}

// control sends one request (with fds) on a fresh connection to a control
// socket and returns the reply with the descriptors that came with it.
func control(ctx context.Context, socket string, req controlRequest, fds ...int) (controlReply, []int, error) {
	cc, stop, err := dialControl(ctx, socket)
	if err != nil {
		return controlReply{}, nil, err
	}
	defer cc.close()
	defer stop()
	if err := cc.write(req, fds...); err != nil {
		return controlReply{}, nil, ctxErr(ctx, err)
	}
	var rep controlReply
	if err := cc.read(&rep); err != nil {
		return controlReply{}, nil, ctxErr(ctx, err)
	}
	got := cc.takeFDs()
	if rep.Error != "" {
		fdpass.Close(got)
		return rep, nil, &controlError{code: rep.Code, msg: rep.Error}
	}
	return rep, got, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// AskHello asks the data-plane process of generation gen for its Hello.
func AskHello(ctx context.Context, socketDir string, gen uint64) (Hello, error) {
	rep, _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opHello})
	if err != nil {
		return Hello{}, fmt.Errorf("dataplane: ask generation %d for its hello: %w", gen, err)
	}
	if rep.Hello == nil {
		return Hello{}, fmt.Errorf("dataplane: generation %d answered hello without one", gen)
	}
	return *rep.Hello, nil
}

// PushState delivers st to the data-plane process of generation gen and
// waits until it was applied (or ctx ends).
func PushState(ctx context.Context, socketDir string, gen uint64, st State) error {
	if _, _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opState, State: &st}); err != nil {
		return fmt.Errorf("dataplane: push state to generation %d: %w", gen, err)
	}
	return nil
}

// ExportState returns the state generation gen applied last; ok is false
// when it has none yet.
func ExportState(ctx context.Context, socketDir string, gen uint64) (st State, ok bool, err error) {
	rep, _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opExportState})
	if err != nil {
		return State{}, false, fmt.Errorf("dataplane: export the state of generation %d: %w", gen, err)
	}
	if rep.State == nil {
		return State{}, false, nil
	}
	return *rep.State, true, nil
}

// TakeListener gets a copy of generation gen's listening socket, for a
// newer generation. The caller closes it. It must not call Fd on it: that
// would make the socket blocking under both processes' accept loops (the
// flag belongs to the socket, which the copy shares).
func TakeListener(ctx context.Context, socketDir string, gen uint64) (*os.File, error) {
	_, fds, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opTakeListener})
	if err == nil && len(fds) != 1 {
		fdpass.Close(fds)
		err = fmt.Errorf("the reply carried %d descriptors, want 1", len(fds))
	}
	if err != nil {
		return nil, fmt.Errorf("dataplane: take the listening socket of generation %d: %w", gen, err)
	}
	return os.NewFile(uintptr(fds[0]), "dataplane-listener"), nil
}

// SendListener hands ln (TakeListener's) to generation gen, which was
// started to wait for it, and returns once it accepts on it. The caller
// closes its copy afterwards.
func SendListener(ctx context.Context, socketDir string, gen uint64, ln *os.File) error {
	fd, err := fdpass.FileFD(ln)
	if err == nil {
		_, _, err = control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opListener}, fd)
	}
	if err != nil {
		return fmt.Errorf("dataplane: hand the listening socket to generation %d: %w", gen, err)
	}
	return nil
}

// Drain makes generation gen stop accepting; it exits by itself once its
// connections ended. It returns once the process no longer accepts.
func Drain(ctx context.Context, socketDir string, gen uint64) error {
	if _, _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opDrain}); err != nil {
		return fmt.Errorf("dataplane: drain generation %d: %w", gen, err)
	}
	return nil
}

// End makes generation gen close every connection now and exit.
func End(ctx context.Context, socketDir string, gen uint64) error {
	if _, _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opEnd}); err != nil {
		return fmt.Errorf("dataplane: end generation %d: %w", gen, err)
	}
	return nil
}
