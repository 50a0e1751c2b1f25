package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kibotos/kibotos/buildinfo"
)

// The control socket carries JSON requests and replies, one after the
// other on a connection. Each generation has its own socket, so an old
// process waiting for its connections to end and its successor can both be
// reached.
type controlRequest struct {
	Op    string `json:"op"` // "hello" or "state"
	State *State `json:"state,omitempty"`
}

type controlReply struct {
	Error string `json:"error,omitempty"`
	Hello *Hello `json:"hello,omitempty"`
}

const (
	opHello = "hello"
	opState = "state"
)

// ControlSocket is the control socket of generation gen in socketDir.
func ControlSocket(socketDir string, gen uint64) string {
	return filepath.Join(socketDir, "control-"+strconv.FormatUint(gen, 10)+".sock")
}

func listenControl(dir string, gen uint64) (net.Listener, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dataplane: socket directory %s: %w", dir, err)
	}
	// Only root (the node) may push state: the directory guards the socket.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("dataplane: socket directory %s: %w", dir, err)
	}
	path := ControlSocket(dir, gen)
	// A socket file of this generation can only be left by a process of
	// this generation that died: generations are never reused.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket {
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("dataplane: control socket: %w", err)
	}
	return ln, nil
}

func (s *Server) serveControl(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go s.controlConn(conn)
	}
}

func (s *Server) controlConn(conn net.Conn) {
	defer conn.Close()
	dec := json.NewDecoder(conn)
	enc := json.NewEncoder(conn)
	for {
		var req controlRequest
		if err := dec.Decode(&req); err != nil {
			return
		}
		var rep controlReply
		switch req.Op {
		case opHello:
			h := s.hello()
			rep.Hello = &h
		case opState:
			if req.State == nil {
				rep.Error = "dataplane: state request without state"
			} else if err := s.apply(*req.State); err != nil {
				rep.Error = err.Error()
				s.log.Error("data-plane state refused", "err", err)
			}
		default:
			rep.Error = fmt.Sprintf("dataplane: unknown control op %q (this is generation %d, revision %s)", req.Op, s.cfg.Generation, buildinfo.SourceRevision())
		}
		if err := enc.Encode(rep); err != nil {
			return
		}
	}
}

func (s *Server) hello() Hello {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Hello{
		Revision:     buildinfo.SourceRevision(),
		Listen:       s.cfg.Listen,
		Address:      s.addr,
		Generation:   s.cfg.Generation,
		PID:          os.Getpid(),
		StateApplied: s.applied,
		Counters:     s.counters(),
	}
}

// control sends one request on a fresh connection to a control socket.
func control(ctx context.Context, socket string, req controlRequest) (controlReply, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return controlReply{}, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return controlReply{}, ctxErr(ctx, err)
	}
	var rep controlReply
	if err := json.NewDecoder(conn).Decode(&rep); err != nil {
		return controlReply{}, ctxErr(ctx, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// AskHello asks the data-plane process of generation gen for its Hello.
func AskHello(ctx context.Context, socketDir string, gen uint64) (Hello, error) {
	rep, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opHello})
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
	if _, err := control(ctx, ControlSocket(socketDir, gen), controlRequest{Op: opState, State: &st}); err != nil {
		return fmt.Errorf("dataplane: push state to generation %d: %w", gen, err)
	}
	return nil
}
