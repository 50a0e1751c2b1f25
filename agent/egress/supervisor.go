package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/units"
)

// SupervisorConfig is how the node runs its egress process.
type SupervisorConfig struct {
	// Units is the service manager (the host's systemd or a private one).
	Units *units.Manager
	// Executable is the kibotos binary (absolute), normally
	// os.Executable(); the unit runs `<exe> egress serve --socket-dir DIR
	// --generation N`. The egress user must be able to execute it.
	Executable string
	// SocketDir holds the control sockets, e.g. /run/kibotos/node-egress
	// (the node's socket directory with "-egress" added). The supervisor
	// makes it, owned by User, mode 0700; it is the only directory the
	// process may write. Its parents must let User search them.
	SocketDir string
	// EarlierSocketDirs are where builds before this one put the control
	// sockets: a generation adopted at open whose socket is not in
	// SocketDir is reached there, so an upgrade that moved the directory
	// still drains the running process instead of cutting its
	// connections. New generations always use SocketDir.
	EarlierSocketDirs []string
	// StateDir is <storage.root>/state: the generation counter lives
	// there, and the process is not allowed to see it.
	StateDir string
	// Scope tells this node's units from other nodes' on the host, as the
	// data plane's scope does.
	Scope string
	// User runs the process; DefaultUser when empty. It is created as a
	// system account when missing.
	User string
	// TCPListen is the transparent listener (IPv4 ADDR:PORT, usually
	// 0.0.0.0:PORT), the node's TPROXY target.
	TCPListen string
	// DNSListen is the DNS socket, a specific IPv4 ADDR:PORT of the node.
	DNSListen string
	// NetNS, when set, is the node's network namespace as a path: the
	// sockets are made there and the unit joins it (NetworkNamespacePath,
	// as the service manager sees it: ManagerNetNS, default NetNS). Empty:
	// this process's and the manager's own, which are the node's.
	NetNS, ManagerNetNS string
	// DrainTimeout is the deadline a generation gets for its connections
	// once it stops serving (no more routes, or a newer generation took
	// its sockets); DefaultDrainTimeout when zero.
	DrainTimeout time.Duration
	// LogFormat, when set, is passed as --log-format (text or json).
	LogFormat string
	// WarmConnections is passed as --warm-connections: greeted proxy
	// connections kept per revision in use (0: none). The node gives
	// [network] egress_warm_connections, DefaultWarmConnections unless set.
	WarmConnections int
	Logger          *slog.Logger
	// Revision is the node's build revision (buildinfo.SourceRevision()
	// when empty), to compare with Generation.Revision: a process of
	// another build of the same release line is replaced with Switch.
	Revision string
}

// DefaultDrainTimeout bounds a drain the node asks for.
const DefaultDrainTimeout = 30 * time.Second

// ReasonNewerDrains is the reason logged when a draining generation is
// ended at once because a switch would make it the third.
const ReasonNewerDrains = generations.ReasonNewerDrains

// Supervisor keeps an egress process running exactly while the node has
// routes for it, replaces one that dies, and switches builds with at most
// two generations at a time. Its methods may be called concurrently.
type Supervisor struct {
	cfg  SupervisorConfig
	log  *slog.Logger
	acct account
	// series starts, finds and stops the units (mu held).
	series *generations.Series

	// ctx ends with Close: it bounds what the watch loop does.
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the watch loop returned

	// mu serializes everything that starts, talks to or ends a
	// generation, the watch loop included.
	mu       sync.Mutex
	closed   bool
	current  *generation
	draining []*generation // oldest first
	config   Config
	// known: config is what the node applied. An adopted process has a
	// config this node cannot read back (credentials live only in its
	// memory), so a replacement waits for the node's first Apply.
	known   bool
	retryAt time.Time // when the watch loop may try a failed start again
	backoff time.Duration
	// seen are the counters last read from each generation this node has
	// run, ended ones included: Totals sums them.
	seen map[uint64]Stats
	// seenGuests are the same by guest, of the guests config routes
	// (GuestTotals).
	seenGuests map[uint64][]GuestStats
}

// Generation describes one running egress process.
type Generation struct {
	Number   uint64
	Unit     string
	MainPID  uint32 // in the service manager's PID namespace
	Revision string // the build it reports (Hello.Revision)
	Release  string // and its release (Hello.Release)
	Adopted  bool   // found running when the Supervisor opened
	Draining bool
	Deadline time.Time // of its drain
}

var errClosed = errors.New("egress: supervisor closed")

// OpenSupervisor prepares the account and socket directory and adopts
// what runs already: the newest generation that answers and serves stays
// the serving one, with its connections, a draining one goes on draining;
// anything else of the scope is ended. It starts nothing: Apply does, once
// there are routes.
func OpenSupervisor(ctx context.Context, cfg SupervisorConfig) (*Supervisor, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.User == "" {
		cfg.User = DefaultUser
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.Revision == "" {
		cfg.Revision = buildinfo.SourceRevision()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	acct, err := ensureAccount(ctx, cfg.User)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("egress: state directory %s: %w", cfg.StateDir, err)
	}
	if err := acct.prepareSocketDir(cfg.SocketDir); err != nil {
		return nil, err
	}
	for _, p := range []string{cfg.SocketDir, cfg.Executable} {
		if err := acct.checkReach(p); err != nil {
			return nil, err
		}
	}
	s := &Supervisor{cfg: cfg, log: log, acct: acct, series: newSeries(cfg), done: make(chan struct{})}
	// The watch loop outlives the open: it runs until Close, whatever
	// becomes of ctx, and keeps only its values.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := s.adopt(ctx); err != nil {
		s.cancel()
		return nil, err
	}
	go s.watch()
	return s, nil
}

func (cfg SupervisorConfig) validate() error {
	switch {
	case cfg.Units == nil:
		return errors.New("egress: no unit manager: the node runtime is needed to run the egress process")
	case !filepath.IsAbs(cfg.Executable):
		return fmt.Errorf("egress: executable %q is not an absolute path: pass os.Executable()", cfg.Executable)
	case !filepath.IsAbs(cfg.SocketDir):
		return fmt.Errorf("egress: socket directory %q is not an absolute path", cfg.SocketDir)
	case !filepath.IsAbs(cfg.StateDir):
		return fmt.Errorf("egress: state directory %q is not an absolute path", cfg.StateDir)
	case within(cfg.SocketDir, cfg.StateDir) || within(cfg.StateDir, cfg.SocketDir):
		// The unit hides the state directory and may write only the
		// socket directory: one inside the other cannot be both.
		return fmt.Errorf("egress: socket directory %s and state directory %s must not contain each other", cfg.SocketDir, cfg.StateDir)
	case cfg.Scope == "" || strings.ContainsAny(cfg.Scope, "/*?[ "):
		return fmt.Errorf("egress: scope %q: want a plain name (the data plane's scope of this node)", cfg.Scope)
	}
	if err := checkIPv4(cfg.TCPListen, true); err != nil {
		return fmt.Errorf("egress: transparent TCP listener %q: %w", cfg.TCPListen, err)
	}
	if err := checkIPv4(cfg.DNSListen, false); err != nil {
		return fmt.Errorf("egress: DNS socket %q: %w", cfg.DNSListen, err)
	}
	return nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// Apply makes the process forward by cfg. With routes, a process is
// started when none serves (new sockets, then cfg) or given cfg; without,
// the serving one drains (DrainTimeout) and ends by itself once its
// connections did. If the start or the push fails, the watch loop keeps
// trying with cfg.
func (s *Supervisor) Apply(ctx context.Context, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	s.config, s.known = cfg, true
	s.retryAt, s.backoff = time.Time{}, 0 // a new config is worth trying at once
	if len(cfg.Routes) == 0 {
		if s.current != nil {
			g := s.current
			s.current = nil
			s.drain(ctx, g, "no policy on this node references an Egress or a Resolver")
		}
		return nil
	}
	if s.current == nil {
		return s.startServing(ctx)
	}
	return s.call(ctx, s.current, func(c *Client) error { return c.SetConfig(ctx, cfg) })
}

// Switch replaces the serving generation with one of this build (a new
// node binary of the same release line): the new one gets the old one's
// sockets and the config, then the old one drains, so no connection is
// refused and none is cut. A generation still draining from an earlier
// switch is ended at once first: at most two run. Nothing serving, nothing
// to switch.
func (s *Supervisor) Switch(ctx context.Context) error { return s.switchTo(ctx, true) }

// Replace is Switch for a build of another release line: the new
// generation takes the sockets, and the old one is ended at once instead
// of draining (the seed: across release lines the old one is ended).
func (s *Supervisor) Replace(ctx context.Context) error { return s.switchTo(ctx, false) }

// ReasonOtherLine is the reason logged when Replace ends a generation.
const ReasonOtherLine = "a build of another release line took over"

func (s *Supervisor) switchTo(ctx context.Context, drainOld bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	old := s.current
	if old == nil {
		return nil
	}
	if !s.known {
		return fmt.Errorf("egress: switch from generation %d: the node has not applied its config yet: Apply first, the new generation needs it", old.num)
	}
	for len(s.draining) > 0 {
		s.endOldest(ctx, ReasonNewerDrains)
	}
	var socks Sockets
	err := s.call(ctx, old, func(c *Client) (err error) {
		socks, err = c.Listeners(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("egress: switch from generation %d: %w", old.num, err)
	}
	defer func() { socks.Close() }() // what socks holds at the end
	if socks.DNSTCP == nil {
		// An older build serves UDP only: nothing holds the TCP half.
		if socks.DNSTCP, err = s.listenDNSTCP(ctx); err != nil {
			return fmt.Errorf("egress: switch from generation %d: %w", old.num, err)
		}
	}
	if !boundTo(socks.TCP, s.cfg.TCPListen) {
		// An older build's listener port: the node's table TPROXYs to the
		// configured one now, which nobody holds yet.
		socks.TCP.Close()
		if err := s.retryBusy(ctx, func() (err error) {
			socks.TCP, err = ListenTransparentTCP(ctx, s.cfg.TCPListen)
			return err
		}); err != nil {
			socks.TCP = nil
			return fmt.Errorf("egress: switch from generation %d: %w", old.num, err)
		}
	}
	g, err := s.launch(ctx, socks)
	if err != nil {
		return fmt.Errorf("egress: switch from generation %d: %w", old.num, err)
	}
	s.current = g
	s.log.Info("egress generation switched", "from", old.num, "to", g.num, "unit", g.unit, "old_drains", drainOld)
	if drainOld {
		s.drain(ctx, old, "a newer generation took its sockets")
	} else {
		s.end(ctx, old, ReasonOtherLine)
	}
	return nil
}

// Stats returns the serving generation's state and counters.
func (s *Supervisor) Stats(ctx context.Context) (Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return Stats{}, errors.New("egress: no generation serves (the node has no routes for one)")
	}
	var st Stats
	err := s.call(ctx, s.current, func(c *Client) (err error) {
		st, err = c.Stats(ctx)
		return err
	})
	return st, err
}

// Totals are the egress counters summed over every generation this node
// process has talked to, as last read (now, for the running ones), so a
// generation switch or a replaced process never makes them go down;
// Active and Warm are the running ones' connections. A generation whose
// control socket does not answer counts with what it said last.
func (s *Supervisor) Totals(ctx context.Context) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[uint64]Stats{}
	}
	var t Stats
	s.eachLive(ctx, func(g *generation, c *Client) error {
		st, err := c.Stats(ctx)
		if err == nil {
			s.seen[g.num] = st
			t.Active += st.Active
			t.Warm += st.Warm
		}
		return err
	})
	for _, st := range s.seen {
		t.Accepted += st.Accepted
		t.Refused += st.Refused
		t.Failed += st.Failed
		t.Closed += st.Closed
		t.DNSAnswered += st.DNSAnswered
		t.DNSFailed += st.DNSFailed
		t.DNSDropped += st.DNSDropped
	}
	return t
}

// eachLive calls read with every running generation's client (mu held).
func (s *Supervisor) eachLive(ctx context.Context, read func(g *generation, c *Client) error) {
	for _, g := range append(slices.Clone(s.draining), s.current) {
		if g != nil {
			s.call(ctx, g, func(c *Client) error { return read(g, c) })
		}
	}
}

// GuestTotals are Totals by guest, for the guests the node's Config
// routes now: a guest it no longer routes is forgotten (its Instance
// ended), so the figures stay bounded by the node's Instances. A
// generation of a build before guest counters adds nothing.
func (s *Supervisor) GuestTotals(ctx context.Context) map[netip.Addr]GuestStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seenGuests == nil {
		s.seenGuests = map[uint64][]GuestStats{}
	}
	s.eachLive(ctx, func(g *generation, c *Client) error {
		if g.noGuests {
			return nil
		}
		gs, err := c.GuestStats(ctx)
		switch {
		case err == nil:
			s.seenGuests[g.num] = gs
		case !c.Broken():
			g.noGuests = true // the process answered: it has none
		}
		return err
	})
	routed := map[netip.Addr]bool{}
	for _, r := range s.config.Routes {
		routed[r.Guest] = true
	}
	out := map[netip.Addr]GuestStats{}
	for num, gs := range s.seenGuests {
		kept := gs[:0]
		for _, x := range gs {
			if !routed[x.Guest] {
				continue
			}
			kept = append(kept, x)
			sum := out[x.Guest]
			sum.Guest = x.Guest
			sum.add(x)
			out[x.Guest] = sum
		}
		s.seenGuests[num] = kept
	}
	return out
}

// Generations lists the running generations, oldest first; a serving one
// is last.
func (s *Supervisor) Generations() []Generation {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Generation
	for _, g := range s.draining {
		out = append(out, g.describe())
	}
	if s.current != nil {
		out = append(out, s.current.describe())
	}
	return out
}

// Close stops supervising. The processes keep running and serving (the
// node is stopping or restarting): the next OpenSupervisor adopts them.
func (s *Supervisor) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.draining {
		g.closeClient()
	}
	if s.current != nil {
		s.current.closeClient()
	}
	return nil
}
