package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/fdpass"
)

// nodeUID is the only peer the control socket serves.
const nodeUID = 0

// listenControl checks the socket directory the node made and listens on
// this generation's socket in it. The process never creates the
// directory: under the production unit it could not, and a directory
// others can enter would expose the socket.
func listenControl(dir string, gen uint64) (*net.UnixListener, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("egress: socket directory: %w (the node creates it, owned by the egress user, mode 0700)", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || st == nil || fi.Mode().Perm()&0o077 != 0 || int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("egress: socket directory %s is %v owned by uid %d: want a directory of mode 0700 owned by uid %d (this process)", dir, fi.Mode(), uidOf(st), os.Geteuid())
	}
	ln, err := generations.ListenControl(dir, gen)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return ln, nil
}

func uidOf(st *syscall.Stat_t) int {
	if st == nil {
		return -1
	}
	return int(st.Uid)
}

// serveControl serves one node connection at a time; a second one gets an
// error reply and is closed, so a confused node learns why.
func (s *Server) serveControl(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		cred, err := peerCred(c)
		if err == nil {
			err = checkPeer(cred, nodeUID)
		}
		if err != nil {
			s.log.Warn("egress control connection refused", "err", err)
			c.Close()
			continue
		}
		s.sessions.Go(func() { s.admit(c) })
	}
}

// sessionWait is how long a new node connection waits for the previous
// one to end: a node that just closed its connection and dialed again is
// not a second node.
const sessionWait = 2 * time.Second

// admit serves c once the session slot is free, or tells it, in answer to
// its first request, that another node connection is open.
func (s *Server) admit(c *net.UnixConn) {
	select {
	case s.slot <- struct{}{}:
	case <-time.After(sessionWait):
		l := newLink(c)
		c.SetDeadline(time.Now().Add(sessionWait))
		var req request
		l.readFrame(&req)
		l.writeFrame(reply{Error: "egress: another node connection is open on this control socket: one at a time"})
		l.close()
		return
	}
	defer func() { <-s.slot }()
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.session = c
	s.mu.Unlock()
	s.serveSession(c)
}

func (s *Server) serveSession(c *net.UnixConn) {
	l := newLink(c)
	defer func() {
		l.close()
		s.mu.Lock()
		s.session = nil
		s.mu.Unlock()
	}()
	for {
		var req request
		if err := l.readFrame(&req); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				// After a bad frame the stream cannot be trusted: say why, end.
				s.log.Warn("egress control frame refused", "err", err)
				l.writeFrame(reply{Error: err.Error()})
			}
			return
		}
		fds := l.takeFDs()
		rep, out := s.handle(req, fds)
		err := l.writeFrame(rep, out...)
		fdpass.Close(out)
		if err != nil {
			return
		}
	}
}

// handle answers one request. fds came with it; they are closed here
// unless a listeners request took them. out are descriptors to send back
// (closed by the caller).
func (s *Server) handle(req request, fds []int) (rep reply, out []int) {
	defer fdpass.Close(fds) // installListeners keeps copies
	if len(fds) > 0 && req.Op != opListeners {
		return reply{Error: fmt.Sprintf("egress: a %q request carried %d descriptors: only %q carries any", req.Op, len(fds), opListeners)}, nil
	}
	if err := req.onlyFieldsOf(); err != nil {
		return reply{Error: err.Error()}, nil
	}
	var err error
	switch req.Op {
	case opHello:
		return reply{Hello: &Hello{Protocol: ProtocolVersion, Revision: buildinfo.SourceRevision(), Release: buildinfo.ReleaseName(), Generation: s.opts.Generation, PID: os.Getpid()}}, nil
	case opListeners:
		err = s.installListeners(fds)
	case opTakeListeners:
		out, err = s.takeListeners()
	case opConfig:
		err = s.applyConfig(*req.Config)
	case opDrain:
		s.Drain(*req.Deadline)
	case opStats:
		st := s.Stats()
		return reply{Stats: &st}, nil
	case opGuestStats:
		gs := s.GuestStats()
		return reply{Guests: &gs}, nil
	default:
		err = fmt.Errorf("egress: unknown control request %q (this is generation %d, protocol %d, revision %s)", req.Op, s.opts.Generation, ProtocolVersion, buildinfo.SourceRevision())
	}
	if err != nil {
		s.log.Warn("egress control request failed", "op", req.Op, "err", err)
		return reply{Error: err.Error()}, nil
	}
	return reply{}, out
}

// onlyFieldsOf checks that a request sets exactly the fields of its op.
func (r request) onlyFieldsOf() error {
	wantConfig, wantDeadline := r.Op == opConfig, r.Op == opDrain
	if (r.Config != nil) != wantConfig {
		if wantConfig {
			return errors.New("egress: config request without a config")
		}
		return fmt.Errorf("egress: a %q request carries a config", r.Op)
	}
	if (r.Deadline != nil) != wantDeadline {
		if wantDeadline {
			return errors.New("egress: drain request without a deadline")
		}
		return fmt.Errorf("egress: a %q request carries a deadline", r.Op)
	}
	return nil
}
