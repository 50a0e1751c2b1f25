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
	// SocketDir holds the control socket (created 0700).
	SocketDir string
	// Generation numbers this process among the node's data-plane processes.
	Generation uint64
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
type Server struct {
	cfg   Config
	log   *slog.Logger
	ready chan struct{}

	mu       sync.Mutex
	applied  bool
	nodeID   string
	pub      ed25519.PublicKey
	cert     *tls.Certificate
	targets  map[string]Target     // by workspace
	links    map[string]*guestLink // by instance
	conns    map[*clientConn]struct{}
	stopping bool
	addr     string
	connGone chan struct{} // signalled whenever a connection ended

	handlers sync.WaitGroup

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
		cfg:      cfg,
		log:      cfg.Logger.With("generation", cfg.Generation),
		ready:    make(chan struct{}),
		targets:  map[string]Target{},
		links:    map[string]*guestLink{},
		conns:    map[*clientConn]struct{}{},
		connGone: make(chan struct{}, 1),
		refused:  refused,
	}, nil
}

// Ready is closed once both sockets listen.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the bound TCP address (after Ready).
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Run listens and serves until ctx ends, then stops accepting, gives the
// open connections Grace to end, closes the rest and returns.
func (s *Server) Run(ctx context.Context) error {
	ctl, err := listenControl(s.cfg.SocketDir, s.cfg.Generation)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		ctl.Close()
		os.Remove(ControlSocket(s.cfg.SocketDir, s.cfg.Generation))
		return fmt.Errorf("dataplane: listen on %s: %w (is another data-plane process or service bound to it?)", s.cfg.Listen, err)
	}
	s.mu.Lock()
	s.addr = ln.Addr().String()
	s.mu.Unlock()
	s.log.Info("data plane listening", "listen", s.addr, "control", ctl.Addr().String(), "pid", os.Getpid())
	close(s.ready)

	var loops sync.WaitGroup
	loops.Go(func() { s.serveControl(ctl) })
	loops.Go(func() { s.accept(ctx, ln) })

	<-ctx.Done()
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	ln.Close()
	closed := s.drain()
	s.log.Info("data-plane connections closed", "closed", closed, "grace", s.cfg.Grace)
	s.handlers.Wait()
	// The control socket stays up during the grace: the node may still
	// withdraw targets (a stop or delete) from a stopping process.
	ctl.Close()
	os.Remove(ControlSocket(s.cfg.SocketDir, s.cfg.Generation))
	loops.Wait()
	s.mu.Lock()
	for id, l := range s.links {
		l.close()
		delete(s.links, id)
	}
	s.mu.Unlock()
	return nil
}

// drain waits up to Grace for the connections to end, then closes the rest
// and returns how many it closed.
func (s *Server) drain() int {
	deadline := time.NewTimer(s.cfg.Grace)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-s.connGone:
			continue
		case <-deadline.C:
		}
		s.mu.Lock()
		closed := 0
		for c := range s.conns {
			c.kill()
			closed++
		}
		s.mu.Unlock()
		return closed
	}
}

func (s *Server) accept(ctx context.Context, ln net.Listener) {
	for {
		raw, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
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

// track registers a new connection; nil once stopping.
func (s *Server) track(raw net.Conn) *clientConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil
	}
	c := newClientConn(s, raw)
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) untrack(c *clientConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
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
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{ALPN},
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
