package dataplane

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a data-plane Server.
type Config struct {
	// Listen is the TCP address clients connect to (HOST:PORT).
	Listen string
	// AwaitListener: do not bind Listen; serve the listening socket the
	// node hands over (SendListener), which a previous generation served.
	AwaitListener bool
	// Predecessor is the generation still draining when this one started
	// (0: none). Its guest sessions are borrowed until its own
	// connections ended: a VMM serves an Instance's data socket to one
	// client at a time (lend.go).
	Predecessor uint64
	// SocketDir holds the control socket (created 0700).
	SocketDir string
	// Generation numbers this process among the node's data-plane processes.
	Generation uint64
	// TLS are the settings served; the zero value is DefaultTLS.
	TLS TLSSettings
	// Grace is how long Run lets connections end after ctx ended;
	// zero means DefaultGrace.
	Grace time.Duration
	// GuestTimeout bounds reaching an Instance's guest agent for a new
	// connection; zero means 10s.
	GuestTimeout time.Duration
	Logger       *slog.Logger
	// Now is the clock credentials are checked against; nil: time.Now.
	Now func() time.Time
}

// Server is the data-plane process's core: the TLS listener, the control
// socket and the connections.
//
// A process ends in one of three ways. Stopped (SIGTERM: ctx ends), it
// stops accepting, gives its connections Grace and closes the rest.
// Drained (the node handed its listening socket to a newer generation, or
// started one on a new address), it stops accepting and returns once its
// last connection ended on its own, however long that takes. Ended (the
// node needs room for a newer drain, or switches release lines), it closes
// everything at once.
type Server struct {
	cfg Config
	log *slog.Logger
	// life is Run's context without its cancellation, set before Run
	// serves anything: connections, guest links and lent sessions outlive
	// a stop (they get Grace, then each ends on its own cancel), so they
	// keep only its values.
	life     context.Context
	ready    chan struct{}
	finished chan struct{} // closed when a drained or ended process has nothing left
	finish   sync.Once
	tlsMin   uint16
	suites   []uint16

	mu              sync.Mutex
	applied         bool
	nodeID          string
	pubs            []ed25519.PublicKey // verify credentials, the signing key first
	cert            *tls.Certificate
	certPEM, keyPEM []byte
	targets         map[string]Target     // by workspace
	links           map[string]*guestLink // by instance
	conns           map[*clientConn]struct{}
	bound           map[string]uint64         // connections ever bound, by instance (activity.go)
	lends           map[*lendSession]struct{} // guest sessions lent to the successor
	stopping        bool                      // ctx ended: refuse what is not authorized yet
	draining        bool                      // drained or ended: accept nothing more
	ended           bool
	ln              net.Listener  // nil when not (or no longer) listening
	acceptDone      chan struct{} // closed when the accept loop returned
	acceptStopped   bool          // no accept loop runs (or will run again)
	addr            string
	connGone        chan struct{} // signalled whenever a connection or lent session ended

	handlers sync.WaitGroup
	// controls are the live control connections (lent ones too), each
	// served by a goroutine of controlConns; Run ends them and waits.
	controls     map[*net.UnixConn]struct{}
	controlConns sync.WaitGroup
	// dials are the guest links' first dials a new target starts (state.go):
	// cancelled (stopDials) and waited for when Run ends.
	dials     sync.WaitGroup
	dialCtx   context.Context
	stopDials context.CancelFunc
	// borrowed are the goroutines of the sessions borrowed from the
	// predecessor (lend.go); each ends once its session is closed, which
	// the links' close does last.
	borrowed sync.WaitGroup

	connections, bytesIn, bytesOut atomic.Uint64
	refused                        map[string]*atomic.Uint64 // by code, fixed at New
}

// New checks cfg; Run starts serving.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		return nil, errors.New("dataplane: no listen address: pass --listen HOST:PORT (the node's data-plane address)")
	}
	if cfg.SocketDir == "" {
		return nil, errors.New("dataplane: no socket directory: pass --socket-dir DIR")
	}
	cfg.TLS = cfg.TLS.orDefault()
	tlsMin, suites, err := cfg.TLS.parse()
	if err != nil {
		return nil, err
	}
	if cfg.Predecessor >= cfg.Generation && cfg.Predecessor != 0 {
		return nil, fmt.Errorf("dataplane: predecessor %d is not older than generation %d", cfg.Predecessor, cfg.Generation)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.GuestTimeout <= 0 {
		cfg.GuestTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	refused := map[string]*atomic.Uint64{}
	for _, code := range RefusalCodes {
		refused[code] = new(atomic.Uint64)
	}
	return &Server{
		cfg:           cfg,
		log:           cfg.Logger.With("generation", cfg.Generation),
		ready:         make(chan struct{}),
		finished:      make(chan struct{}),
		tlsMin:        tlsMin,
		suites:        suites,
		targets:       map[string]Target{},
		links:         map[string]*guestLink{},
		conns:         map[*clientConn]struct{}{},
		lends:         map[*lendSession]struct{}{},
		controls:      map[*net.UnixConn]struct{}{},
		acceptStopped: true,
		connGone:      make(chan struct{}, 1),
		refused:       refused,
	}, nil
}

// Ready is closed once the control socket listens, and the TCP listener
// too unless AwaitListener.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the bound TCP address (after Ready; with AwaitListener, once
// the node handed the socket over).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run listens and serves until ctx ends (it then stops accepting, gives
// the open connections Grace, closes the rest and returns) or until a
// drain or an end requested by the node has nothing left.
func (s *Server) Run(ctx context.Context) error {
	s.life = context.WithoutCancel(ctx)
	s.dialCtx, s.stopDials = context.WithCancel(s.life)
	defer func() {
		s.stopDials()
		s.dials.Wait()
		s.borrowed.Wait()
	}()
	ctl, err := listenControl(s.cfg.SocketDir, s.cfg.Generation)
	if err != nil {
		return err
	}
	if s.cfg.AwaitListener {
		s.log.Info("data plane waiting for its listening socket from the node", "listen", s.cfg.Listen, "control", ctl.Addr().String(), "pid", os.Getpid(), "predecessor", s.cfg.Predecessor)
	} else {
		ln, err := net.Listen("tcp", s.cfg.Listen)
		if err != nil {
			ctl.Close()
			os.Remove(ControlSocket(s.cfg.SocketDir, s.cfg.Generation))
			return fmt.Errorf("dataplane: listen on %s: %w (is another data-plane process or service bound to it?)", s.cfg.Listen, err)
		}
		s.mu.Lock()
		s.serveLocked(ln)
		s.mu.Unlock()
		s.log.Info("data plane listening", "listen", ln.Addr().String(), "control", ctl.Addr().String(), "pid", os.Getpid(), "predecessor", s.cfg.Predecessor)
	}
	close(s.ready)

	var loops sync.WaitGroup
	loops.Go(func() { s.serveControl(ctl) })

	select {
	case <-ctx.Done():
		s.stop()
	case <-s.finished:
	}
	// Run owns the accept loop: the stop, drain or end before this waited
	// for it already, but Run returning must not depend on how it ended.
	s.stopListening()
	s.handlers.Wait()
	// The control socket stays up until here: the node may still withdraw
	// targets (a stop or delete) from a stopping or draining process.
	ctl.Close()
	os.Remove(ControlSocket(s.cfg.SocketDir, s.cfg.Generation))
	loops.Wait()
	s.endControls()
	s.mu.Lock()
	for id, l := range s.links {
		l.close()
		delete(s.links, id)
	}
	s.mu.Unlock()
	return nil
}

// serveLocked starts accepting on ln (mu held).
func (s *Server) serveLocked(ln net.Listener) {
	s.ln, s.addr = ln, ln.Addr().String()
	s.acceptStopped = false
	done := make(chan struct{})
	s.acceptDone = done
	go func() {
		defer close(done)
		s.accept(ln)
	}()
}

// stopListening closes the listener (this process's copy: a successor
// that got the socket keeps it open and accepting) and waits for the
// accept loop, so no connection is accepted afterwards.
func (s *Server) stopListening() {
	s.mu.Lock()
	ln, done := s.ln, s.acceptDone
	s.ln = nil
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	if done != nil {
		<-done
	}
}

// stop is the SIGTERM path: no new connections, Grace for the open ones.
func (s *Server) stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.stopListening()
	closed := s.drain()
	s.log.Info("data-plane connections closed", "closed", closed, "grace", s.cfg.Grace)
}

// drain waits up to Grace for the connections and lent sessions to end,
// then closes the rest and returns how many connections it closed.
func (s *Server) drain() int {
	deadline := time.NewTimer(s.cfg.Grace)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns) + len(s.lends)
		s.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-s.connGone:
			continue
		case <-deadline.C:
		}
		return s.closeAll()
	}
}

// closeAll closes every connection and lent session; it returns how many
// connections it closed.
func (s *Server) closeAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	closed := 0
	for c := range s.conns {
		c.kill()
		closed++
	}
	for ls := range s.lends {
		ls.kill()
	}
	return closed
}

// drainForSuccessor is the node's drain: this process stops accepting
// (its successor accepts on the same socket, or on a new address), lets go
// of the guest sessions it no longer needs, and finishes once its last
// connection ended. Connections accepted before are served in full.
func (s *Server) drainForSuccessor() error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return errors.New("dataplane: this process is stopping already")
	}
	already := s.draining
	s.draining = true
	s.mu.Unlock()
	if already {
		return nil
	}
	s.stopListening()
	s.mu.Lock()
	n := len(s.conns)
	s.settleLocked()
	s.mu.Unlock()
	s.log.Info("data-plane generation draining", "connections", n)
	return nil
}

// end is the node ending this process: everything closes now.
func (s *Server) end() {
	s.mu.Lock()
	s.draining, s.ended = true, true
	s.mu.Unlock()
	s.stopListening()
	closed := s.closeAll()
	s.log.Info("data-plane connections closed", "closed", closed, "reason", "the node ended this generation")
	s.mu.Lock()
	s.settleLocked()
	s.mu.Unlock()
}

// settleLocked lets a draining process go of what it no longer needs (mu
// held): the guest session of an Instance none of its connections uses
// (its successor dials it then), the lent sessions' hold on an Instance
// its own connections left, and finally itself. A connection that has not
// named its Workspace yet may need any Instance.
func (s *Server) settleLocked() {
	if !s.draining {
		return
	}
	unbound := 0
	bound := map[string]int{}
	for c := range s.conns {
		if c.instanceID == "" {
			unbound++
		} else {
			bound[c.instanceID]++
		}
	}
	lent := map[string]int{}
	for ls := range s.lends {
		lent[ls.instanceID]++
		if unbound == 0 && bound[ls.instanceID] == 0 {
			ls.ownerGone()
		}
	}
	for id, l := range s.links {
		if unbound == 0 && bound[id] == 0 && lent[id] == 0 {
			l.close()
			delete(s.links, id)
		}
	}
	if len(s.conns) == 0 && len(s.lends) == 0 && s.acceptStopped {
		s.finish.Do(func() {
			s.log.Info("data-plane generation drained", "ended", s.ended)
			close(s.finished)
		})
	}
}

// connsOf counts this process's connections bound to instanceID and those
// not bound yet, which may still name it (mu held).
func (s *Server) connsOf(instanceID string) (bound, unbound int) {
	for c := range s.conns {
		switch c.instanceID {
		case "":
			unbound++
		case instanceID:
			bound++
		}
	}
	return bound, unbound
}

func (s *Server) accept(ln net.Listener) {
	defer func() {
		s.mu.Lock()
		s.acceptStopped = true
		s.settleLocked()
		s.mu.Unlock()
	}()
	for {
		raw, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("data plane stopped accepting", "err", err)
			}
			return
		}
		s.connections.Add(1)
		c := s.track(raw)
		if c == nil {
			raw.Close()
			continue
		}
		s.handlers.Go(c.serve)
	}
}

// track registers a new connection; nil once stopping or ended. A
// draining process serves what its accept loop still took.
func (s *Server) track(raw net.Conn) *clientConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping || s.ended {
		return nil
	}
	c := newClientConn(s, raw)
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) untrack(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.settleLocked()
	s.mu.Unlock()
	s.signalGone()
}

// signalGone wakes a stop waiting for connections and lent sessions.
func (s *Server) signalGone() {
	select {
	case s.connGone <- struct{}{}:
	default:
	}
}

// counters reads what this process carried.
func (s *Server) counters() Counters {
	c := Counters{Connections: s.connections.Load(), BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(), Refused: map[string]uint64{}}
	for code, n := range s.refused {
		if v := n.Load(); v > 0 {
			c.Refused[code] = v
		}
	}
	return c
}

// Connections is the number of open client connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// tlsConfig serves the certificate the node delivered last.
func (s *Server) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   s.tlsMin,
		CipherSuites: s.suites,
		NextProtos:   []string{ALPN},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.cert == nil {
				return nil, errors.New("the node has not delivered the data-plane certificate yet")
			}
			return s.cert, nil
		},
	}
}
