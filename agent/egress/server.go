package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure the process; Config (the routes) comes later over the
// control socket.
type Options struct {
	// SocketDir holds the control socket. The node makes it, owned by the
	// process's user, mode 0700; the process refuses another.
	SocketDir string
	// Generation numbers this process among the node's egress processes.
	Generation uint64
	// HandshakeTimeout bounds reaching the proxy and its SOCKS5 handshake
	// for one connection; zero means 10 s.
	HandshakeTimeout time.Duration
	// MaxConnections bounds the connections carried at once; zero means
	// 16384. Past it new ones are refused.
	MaxConnections int
	// WarmConnections is how many greeted, authenticated connections are
	// kept ready per proxy revision while guests use it (warm.go), 0 (none)
	// to MaxWarmConnections. `kibotos egress serve` keeps
	// DefaultWarmConnections: a guest's connection then costs one round
	// trip to the proxy instead of three or four.
	WarmConnections int
	// WarmIdle is how long a proxy revision's warm connections are kept
	// after the last guest connection through it; zero means a minute.
	WarmIdle time.Duration
	Logger   *slog.Logger
}

// DefaultWarmConnections is the warm pool of `kibotos egress serve` per
// proxy revision in use: enough for a guest opening connections one after
// the other (each take refills), few enough to weigh nothing on the
// caller's proxy, and none held by a route unused for WarmIdle.
const DefaultWarmConnections = 2

// MaxWarmConnections bounds a node's egress_warm_connections.
const MaxWarmConnections = 16

// maxDNSInFlight bounds the queries being answered at once.
const maxDNSInFlight = 512

// Server is the egress process's core: the control socket, the sockets the
// node handed over and the connections and queries carried.
type Server struct {
	opts  Options
	log   *slog.Logger
	lines lineLimiter
	ready chan struct{}

	table atomic.Pointer[table]
	names nameCache

	mu         sync.Mutex
	files      Sockets // the node's sockets as received, for take-listeners
	tcp        *net.TCPListener
	udp        *net.UDPConn
	dnsTCP     *net.TCPListener
	dnsConns   map[net.Conn]struct{} // guests' DNS TCP connections
	configured bool
	draining   bool
	conns      map[*relay]struct{}
	deadline   *time.Timer
	session    *net.UnixConn // the node's control connection, if any
	slot       chan struct{} // held by the one control session
	sessions   sync.WaitGroup
	ending     bool // Run is returning: a session admitted now is closed

	connGone   chan struct{} // signalled whenever a carried connection ended
	acceptDone chan struct{} // closed when the accept loop returned
	// carriers are the accepted connections' goroutines, refused ones
	// too: a drain is over only once they returned.
	carriers sync.WaitGroup
	// warmers are the warm pools' fill goroutines: Run waits for them
	// once the drain closed every pool.
	warmers  sync.WaitGroup
	dns      sync.WaitGroup
	dnsSlots chan struct{}
	// life is Run's context without its cancellation: relays and warm
	// pools end on their own cancel (a drain gives them its deadline),
	// so they keep only its values. Set by Run before it serves.
	life      context.Context
	dnsCtx    context.Context // ends on a hard stop: queries are abandoned
	dnsCancel context.CancelFunc
	drained   chan struct{} // closed once draining has nothing left

	active                                 atomic.Int64
	accepted, refused, failed, closed      atomic.Uint64
	dnsAnswered, dnsFailed, dnsDroppedStat atomic.Uint64
	guests                                 map[netip.Addr]*guestCount // mu; by the last Config (guests.go)
}

// New checks opts; Run starts serving.
func New(opts Options) (*Server, error) {
	if opts.SocketDir == "" {
		return nil, errors.New("egress: no socket directory: pass --socket-dir DIR")
	}
	if opts.Generation == 0 {
		return nil, errors.New("egress: no generation: pass --generation N (N ≥ 1, from the node)")
	}
	if opts.WarmConnections < 0 || opts.WarmConnections > MaxWarmConnections {
		return nil, fmt.Errorf("egress: --warm-connections %d: want 0 (none) to %d", opts.WarmConnections, MaxWarmConnections)
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = 16384
	}
	if opts.WarmIdle <= 0 {
		opts.WarmIdle = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts:       opts,
		log:        opts.Logger.With("generation", opts.Generation),
		lines:      lineLimiter{perSecond: 20, burst: 50},
		ready:      make(chan struct{}),
		conns:      map[*relay]struct{}{},
		dnsConns:   map[net.Conn]struct{}{},
		slot:       make(chan struct{}, 1),
		connGone:   make(chan struct{}, 1),
		acceptDone: make(chan struct{}),
		dnsSlots:   make(chan struct{}, maxDNSInFlight),
		drained:    make(chan struct{}),
	}
	s.table.Store(emptyTable)
	return s, nil
}

// Ready is closed once the control socket listens.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Drained is closed once a drain has nothing left: Run returns then.
func (s *Server) Drained() <-chan struct{} { return s.drained }

// Run serves until a drain has ended every connection (then it returns
// nil) or ctx ends (then everything is closed at once).
func (s *Server) Run(ctx context.Context) error {
	s.life = context.WithoutCancel(ctx)
	s.dnsCtx, s.dnsCancel = context.WithCancel(s.life)
	ctl, err := listenControl(s.opts.SocketDir, s.opts.Generation)
	if err != nil {
		return err
	}
	path := ControlSocket(s.opts.SocketDir, s.opts.Generation)
	s.log.Info("egress control socket listening", "control", path, "pid", os.Getpid())
	close(s.ready)
	var loops sync.WaitGroup
	loops.Go(func() { s.serveControl(ctl) })

	select {
	case <-s.drained:
	case <-ctx.Done():
		s.log.Info("egress stopping at once", "reason", context.Cause(ctx))
		s.dnsCancel()
		s.Drain(time.Now())
		<-s.drained
	}
	ctl.Close()
	os.Remove(path)
	s.mu.Lock()
	s.ending = true
	if s.session != nil {
		// Reads end, but the reply to the request in hand still goes
		// out: often the drain that left nothing to carry, which the node
		// would otherwise take for a failed one.
		s.session.CloseRead()
		s.session.SetWriteDeadline(time.Now().Add(sessionWait))
	}
	s.mu.Unlock()
	loops.Wait()
	s.sessions.Wait()
	// The drain swapped in the empty table, closing every pool, and no
	// connection is left to take from one: the fills end now.
	s.warmers.Wait()
	s.dnsCancel()
	s.log.Info("egress drained", "accepted", s.accepted.Load(), "closed_at_deadline", s.closed.Load())
	return nil
}

// Drain stops accepting connections and reading queries, drops the
// routes and their credentials, answers queries already read within
// DNSAnswerWindow and closes the connections still open at deadline. A
// later call moves the deadline.
func (s *Server) Drain(deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.draining {
		s.draining = true
		closePools(s.table.Swap(emptyTable), emptyTable)
		s.names.reset()
		if s.tcp != nil {
			s.tcp.Close()
		} else {
			close(s.acceptDone)
		}
		if s.udp != nil {
			// Not closed yet: answers to queries already read leave from it.
			s.udp.SetReadDeadline(time.Unix(1, 0))
		}
		if s.dnsTCP != nil {
			s.dnsTCP.Close()
			// Connections finish the query they are answering, no more.
			for c := range s.dnsConns {
				c.SetReadDeadline(time.Unix(1, 0))
			}
		}
		s.releaseFiles()
		s.log.Info("egress draining", "deadline", deadline, "connections", len(s.conns))
		go s.finishDrain()
	}
	if s.deadline != nil {
		s.deadline.Stop()
	}
	s.deadline = time.AfterFunc(time.Until(deadline), s.closeAll)
}

// finishDrain waits for the accept loop, the queries and the connections,
// then closes the DNS socket and marks the server drained.
func (s *Server) finishDrain() {
	<-s.acceptDone
	s.dns.Wait()
	s.mu.Lock()
	if s.udp != nil {
		s.udp.Close()
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		<-s.connGone
	}
	// A connection the loop took just before the listener closed is
	// refused (or was carried and untracked): its goroutine ends now.
	s.carriers.Wait()
	s.mu.Lock()
	if s.deadline != nil {
		s.deadline.Stop()
	}
	s.mu.Unlock()
	close(s.drained)
}

// closeAll ends every carried connection (the drain deadline).
func (s *Server) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for r := range s.conns {
		r.kill()
		r.count.inc(outClosed)
		n++
	}
	s.closed.Add(uint64(n))
	if n > 0 {
		s.log.Info("egress connections closed at the drain deadline", "closed", n)
	}
}

// releaseFiles closes the received sockets kept for take-listeners (mu
// held): after a drain nobody may get them from this process.
func (s *Server) releaseFiles() {
	s.files.Close()
	s.files = Sockets{}
}

// applyConfig installs c whole; a draining process takes none, since that
// would bring credentials back.
func (s *Server) applyConfig(c Config) error {
	t, err := compile(c)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return errors.New("egress: this process is draining: send the config to the newer generation")
	}
	// A proxy revision that stays keeps its warm pool.
	old := s.table.Load()
	for k, p := range t.proxies {
		if prev, ok := old.proxies[k]; ok {
			p.warm = prev.warm
		} else {
			p.warm = newWarmPool(s.life, p, s.opts.WarmConnections, s.opts.WarmIdle)
		}
	}
	s.countGuests(t)
	s.table.Store(t)
	closePools(old, t)
	s.names.reset()
	s.configured = true
	s.log.Info("egress config applied", "routes", len(t.routes), "resolvers", len(t.resolvers))
	return nil
}

// closePools closes the warm pools of old that new does not carry on.
func closePools(old, new *table) {
	for k, p := range old.proxies {
		if q, ok := new.proxies[k]; !ok || q.warm != p.warm {
			p.warm.close()
		}
	}
}

// Stats reports the state and counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := Stats{Listening: s.tcp != nil && !s.draining, Configured: s.configured, Draining: s.draining}
	s.mu.Unlock()
	t := s.table.Load()
	st.Routes = len(t.routes)
	for _, p := range t.proxies {
		if p.warm != nil {
			st.Warm += len(p.warm.conns)
		}
	}
	st.Active = s.active.Load()
	st.Accepted, st.Refused, st.Failed, st.Closed = s.accepted.Load(), s.refused.Load(), s.failed.Load(), s.closed.Load()
	st.DNSAnswered, st.DNSFailed, st.DNSDropped = s.dnsAnswered.Load(), s.dnsFailed.Load(), s.dnsDroppedStat.Load()
	return st
}

// track registers a connection to carry; an error says why it is refused.
func (s *Server) track(r *relay) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return errors.New("draining")
	}
	if len(s.conns) >= s.opts.MaxConnections {
		return fmt.Errorf("%d connections carried already", len(s.conns))
	}
	s.conns[r] = struct{}{}
	s.active.Add(1)
	return nil
}

func (s *Server) untrack(r *relay) {
	s.mu.Lock()
	delete(s.conns, r)
	s.mu.Unlock()
	s.active.Add(-1)
	select {
	case s.connGone <- struct{}{}:
	default:
	}
}
