// Package cluster runs a Kibotos member: the TLS port that carries Raft,
// control sessions and the HTTP API; the Raft group of ctrl members over the
// FSM; gossip; bootstrap and join; forwarding of writes to the leader.
// It owns no rules about the state (that is fsm) and runs no VMs (agent).
package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/ctrl"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// Timings of a member. Production defaults; tests shorten them.
type Timings struct {
	RaftHeartbeat     time.Duration
	RaftElection      time.Duration
	RaftLeaderLease   time.Duration
	SessionPing       time.Duration // leader → node ping
	SessionTimeout    time.Duration // no word from the peer for this long ends the session
	SyncInterval      time.Duration // full report + clock measurement
	AckTimeout        time.Duration // node must acknowledge new overcommit values within this
	CommandExpiry     time.Duration // how often the leader expires old command records
	SnapshotThreshold uint64
	RenewCheck        time.Duration // how often a member looks at its certificates' half-life
	TrustPoll         time.Duration // how often a member asks ctrl which CAs to trust (CA rotation)
	// CertLifetime, when set, replaces the lifetimes of the certificates
	// this member signs (tests of renewal and expiry).
	CertLifetime time.Duration
	// CommandRetention and CommandExpiryBatch, when set, replace how long
	// a command's result answers retries (fsm.CommandRetentionHours) and
	// how many records one expiry entry drops (ctrl's commandExpiryBatch):
	// tests of expiry.
	CommandRetention   time.Duration
	CommandExpiryBatch int
	// KeyUseFlush is how often a ctrl member reports the API keys it
	// authenticated to the leader (keyuse.go); 0 is keyUseFlush.
	KeyUseFlush time.Duration
}

// DefaultTimings are the production timings.
func DefaultTimings() Timings {
	return Timings{
		RaftHeartbeat: time.Second, RaftElection: time.Second, RaftLeaderLease: 500 * time.Millisecond,
		SessionPing: 2 * time.Second, SessionTimeout: 10 * time.Second, SyncInterval: 60 * time.Second,
		AckTimeout: 5 * time.Second, CommandExpiry: 10 * time.Minute, SnapshotThreshold: 8192, RenewCheck: 30 * time.Minute, TrustPoll: 30 * time.Second,
	}
}

// TestTimings are tight timings for in-process and multi-process tests.
func TestTimings() Timings {
	return Timings{
		RaftHeartbeat: 200 * time.Millisecond, RaftElection: 200 * time.Millisecond, RaftLeaderLease: 150 * time.Millisecond,
		SessionPing: 200 * time.Millisecond, SessionTimeout: 1500 * time.Millisecond, SyncInterval: 5 * time.Second,
		AckTimeout: 2 * time.Second, CommandExpiry: time.Minute, SnapshotThreshold: 1024, RenewCheck: time.Second, TrustPoll: 200 * time.Millisecond,
	}
}

// Config configures a member.
type Config struct {
	DataDir datadir.Dir
	// Bind is the listen address; empty means the advertised address.
	Bind    string
	Timings Timings
	Logger  *slog.Logger
	// FeatureLevel, when set, is the level this member claims instead of
	// its build's (tests of a mixed-version cluster).
	FeatureLevel int
	// Artifacts is the cluster's artifact store ([artifacts] url), nil
	// for none: ctrl removes Transfer archives and reads other clusters'
	// manifests there.
	Artifacts artifacts.Store
	// API is [api]: the API listener for applications (ctrl members).
	API APIConfig
	// E2B is the E2B API listener of a ctrl member ([e2b]).
	E2B E2BConfig
	// ClockSkew, when set, is what this member's wall clock is off by: the
	// entries it stamps and its measurements of node clocks see it (tests
	// and the fault harness step a host's clock with it).
	ClockSkew func() time.Duration
}

// Server is one running member.
type Server struct {
	cfg Config
	// local is this member's own side: metrics, the node runtime's
	// answers (ServeLocal).
	local atomic.Pointer[Local]
	// rfsm is the Raft FSM adapter (its applied index); nil before Raft
	// starts and on members without a state.
	rfsm *raftFSM
	// publishing is held (shared) by a publish from its upload until its
	// entry is applied, and whole by artifacts gc, so the collector never
	// removes an object a publish has just put (both run on the leader).
	publishing sync.RWMutex
	// leader runs the leader's services while this member leads (ctrl
	// members only, set before the member serves).
	leader *ctrl.Leader
	id     *datadir.Identity
	log    *slog.Logger

	rot    caState      // the CA, the signer and a rotation's progress (carotate.go)
	roots  *trust.Roots // the CAs trusted now (two during a rotation)
	certs  *trust.Store // this member's certificates, swapped on renewal
	client trust.Client // the member as a TLS client
	// memberHTTP makes the member-authenticated calls to ctrl members
	// (forwarding, renewal); see memberClient.
	memberHTTP atomic.Pointer[http.Client]
	conns      *connWatch // Raft and session connections, closed when their node is revoked
	// Nodes whose admission applied entries changed, for enforceRevocations.
	revokeMu      sync.Mutex
	revokePending map[string]bool
	revokeAll     bool
	revokeKick    chan struct{}
	// A node-only member's cache of ctrl's answers on admission.
	admissionMu    sync.Mutex
	admissionCache map[string]admissionAnswer
	joinLimit      *refusalLimiter
	refusals       auditLimiter // of api request refused lines

	mux     *mux
	httpSrv *http.Server
	// bearerAPI is the API listener for applications (nil: not served);
	// e2bAPI the E2B API listener.
	bearerAPI, e2bAPI *apiListener

	raft      *raft.Raft
	fsm       *fsm.FSM
	logStore  logStore
	transport *raft.NetworkTransport

	gossip *memberlist.Memberlist
	// leaderHint is the ctrl leader a node-only member last held its
	// session with: it names it first when it sends a caller to ctrl, so a
	// read after a write through the same member sees that write.
	leaderHint atomic.Value
	// consistentReady is set while this member leads and has applied every
	// entry of earlier terms (its leadership barrier went through).
	consistentReady atomic.Bool
	// levels tracks the voters' feature levels; rounds decides which
	// reports carry ended-Instance records (ctrl members only).
	levels *ctrl.Levels
	rounds *ctrl.Rounds

	sessions *sessionRegistry
	// changed wakes blocking reads when the local state changed.
	changed *broadcaster

	// cred: the data-plane credential keys derived from the CAs held.
	cred credentialKeys

	release func()
	wg      sync.WaitGroup
	stop    chan struct{}
	// keyUses are the API keys this member authenticated since its last
	// report of them (keyuse.go).
	keyUses keyUses
	// quotaRefusals count the quota refusals of the writes it led.
	quotaRefusals refusalCounts
	// life is the member's own context: Open's values without its
	// cancellation, ended by Shutdown and Kill. What the member runs on
	// its own (sessions, renewals, joining the voters) derives from it.
	life    context.Context
	endLife context.CancelFunc
	// leadership carries raft's leadership changes (Config.NotifyCh):
	// true on becoming leader, false on stepping down; raft keeps only
	// the latest when the loop has not read the one before.
	leadership chan bool
	// stopOnce runs Shutdown or Kill once; a concurrent caller waits
	// for it to finish.
	stopOnce sync.Once
	// opened is closed when Open has returned (a halt shuts down only then).
	opened chan struct{}

	// raftDown is closed once Raft has shut down: a write still waiting
	// then gives up, since Raft leaves the futures of entries it
	// committed but did not apply unanswered.
	raftDown chan struct{}

	// halted is closed when the member stopped applying the log; haltErr
	// says why (set before the close). haltDone is closed when the
	// shutdown a halt began has finished.
	haltOnce sync.Once
	halted   chan struct{}
	haltErr  error
	haltDone chan struct{}
}

// Open loads the member from its data directory and starts serving.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Timings.RaftHeartbeat == 0 {
		cfg.Timings = DefaultTimings()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	id, err := cfg.DataDir.LoadIdentity()
	if err != nil {
		return nil, err
	}
	release, err := cfg.DataDir.Lock()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, id: id, log: cfg.Logger.With("node_id", id.NodeID), release: release, stop: make(chan struct{}), leadership: make(chan bool, 1), sessions: newSessionRegistry(), changed: newBroadcaster(),
		conns: newConnWatch(), joinLimit: newRefusalLimiter(), revokePending: map[string]bool{}, revokeKick: make(chan struct{}, 1), admissionCache: map[string]admissionAnswer{},
		opened: make(chan struct{}), halted: make(chan struct{}), haltDone: make(chan struct{}), raftDown: make(chan struct{})}
	s.life, s.endLife = context.WithCancel(context.WithoutCancel(ctx))
	defer close(s.opened)
	if err := s.start(ctx); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	if err := s.checkAPI(); err != nil {
		return err
	}
	if err := s.checkE2B(); err != nil {
		return err
	}
	d := s.cfg.DataDir
	var err error
	if s.roots, err = d.CARoots(); err != nil {
		return err
	}
	if s.certs, err = loadCerts(d); err != nil {
		return err
	}
	if _, err := trust.FromCert(s.certs.Member().Leaf); err != nil {
		return fmt.Errorf("member certificate %s: %w; the data directory %s was made by a kibotos without role certificates: create it anew (kibotos join with a new grant; for a dev cluster kibotos dev down --purge)", d.MemberCert(), err, d)
	}
	ca, err := trust.LoadCA(d.CACert(), d.CAKey())
	if err != nil {
		return err
	}
	s.rot.init(ca)
	if ca.Key != nil && !s.id.HasRole(api.RoleCtrl) {
		return fmt.Errorf("data directory %s holds the cluster CA key but member %s is not a ctrl member: remove %s (only ctrl members sign certificates)", d, s.id.NodeID, d.CAKey())
	}
	s.client = trust.Client{Roots: s.roots, Cert: s.certs.Member}
	// Calls between members go to ctrl members only; a dead member must
	// not hold a forwarded request for long: the next candidate is tried.
	s.resetMemberConns()

	bind := s.cfg.Bind
	if bind == "" {
		bind = s.id.Advertise
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return fmt.Errorf("listen on %s: %w; is another member using this port?", bind, err)
	}
	s.mux = newMux(s.life, ln, datadir.ServerTLS(s.roots, s.certs.Member), s.log, s.authorizeConn, s.conns)
	if s.id.HasRole(api.RoleCtrl) {
		if err := s.startRaft(); err != nil {
			return err // Open's Shutdown closes the mux and its listener
		}
	}
	// Only now: authorizeConn reads the state and the Raft configuration
	// startRaft sets up. Served earlier, a connection in that window was
	// checked against no state at all (admitted as if on a node-only
	// member), and the race detector saw the two meet; peers that dial
	// meanwhile wait in the listen backlog.
	s.wg.Go(s.mux.serve)
	// Requests are small and quick to send; answers may wait up to 30 s
	// (blocking reads) and lists are megabytes.
	s.httpSrv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, ErrorLog: slogStd(s.log)}
	httpLn := newChanListener(s.mux, s.mux.http)
	s.wg.Go(func() { s.httpSrv.Serve(httpLn) })
	if err := s.startAPI(); err != nil {
		return err
	}
	if err := s.startE2B(); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() { defer s.wg.Done(); s.acceptSessions() }()

	if err := s.startGossip(); err != nil {
		return err
	}
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.renewLoop() }()
	go func() { defer s.wg.Done(); s.trustLoop() }()
	if s.raft != nil {
		s.wg.Go(s.watchCA)
		s.wg.Go(s.recordKeyUses)
		s.wg.Add(3)
		go func() { defer s.wg.Done(); s.enforceRevocations() }()
		go func() { defer s.wg.Done(); s.runLeader(ctx) }()
		go func() { defer s.wg.Done(); s.ensureVoter() }()
	}
	s.log.Info("member serving", "advertise", s.id.Advertise, "roles", s.id.Roles, "release", buildinfo.ReleaseName())
	return nil
}

// Shutdown stops the member; VMs and other units on the host are not touched.
func (s *Server) Shutdown() {
	s.stopOnce.Do(s.shutdown)
	s.waitHalt()
}

// waitHalt waits for the shutdown a halt began, if there was one.
func (s *Server) waitHalt() {
	select {
	case <-s.halted:
		<-s.haltDone
	default:
	}
}

func (s *Server) shutdown() {
	close(s.stop)
	s.endLife()
	s.sessions.closeAll()
	if s.gossip != nil {
		s.gossip.Leave(time.Second)
		s.gossip.Shutdown()
	}
	if s.httpSrv != nil {
		// The member's own context has ended: the grace of the requests
		// under way is a context of its own.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.httpSrv.Shutdown(ctx)
		s.bearerAPI.shutdown(ctx)
		s.e2bAPI.shutdown(ctx)
		cancel()
	}
	s.stopRaft()
	if s.mux != nil {
		s.mux.close()
	}
	if s.transport != nil {
		s.transport.Close()
	}
	s.wg.Wait()
	if s.logStore != nil {
		s.logStore.Close()
	}
	if s.fsm != nil {
		s.fsm.Close()
	}
	if s.release != nil {
		s.release()
	}
}

// Kill stops the member abruptly as a crash would (tests): no leave, no
// session close, no graceful HTTP shutdown.
func (s *Server) Kill() {
	s.stopOnce.Do(s.kill)
	s.waitHalt()
}

func (s *Server) kill() {
	close(s.stop)
	s.endLife()
	if s.gossip != nil {
		s.gossip.Shutdown()
	}
	s.mux.close()
	if s.httpSrv != nil {
		s.httpSrv.Close()
	}
	s.bearerAPI.close()
	s.e2bAPI.close()
	s.sessions.closeAll()
	s.stopRaft()
	if s.transport != nil {
		s.transport.Close()
	}
	s.wg.Wait()
	if s.logStore != nil {
		s.logStore.Close()
	}
	if s.fsm != nil {
		s.fsm.Close()
	}
	s.release()
}

// NodeID is this member's node id.
func (s *Server) NodeID() string { return s.id.NodeID }

// wallNow is this member's wall clock, Config.ClockSkew included.
func (s *Server) wallNow() time.Time {
	if s.cfg.ClockSkew == nil {
		return time.Now()
	}
	return time.Now().Add(s.cfg.ClockSkew())
}

// Advertise is this member's advertised address.
func (s *Server) Advertise() string { return s.id.Advertise }

// Identity returns the member identity.
func (s *Server) Identity() *datadir.Identity { return s.id }

// Raft exposes the Raft handle (tests, benchmarks).
func (s *Server) Raft() *raft.Raft { return s.raft }

// FSM exposes the local state (nil on node-only members).
func (s *Server) FSM() *fsm.FSM { return s.fsm }

// ControlSessions counts the nodes' control sessions attached here (only
// a leader has any).
func (s *Server) ControlSessions() int { return s.sessions.count() }

// IsLeader reports whether this member leads the Raft group.
func (s *Server) IsLeader() bool { return s.raft != nil && s.raft.State() == raft.Leader }

// leaderAddr returns the leader's advertised address, "" when unknown.
func (s *Server) leaderAddr() string {
	if s.raft == nil {
		hint, _ := s.leaderHint.Load().(string)
		return hint
	}
	addr, _ := s.raft.LeaderWithID()
	return string(addr)
}

// slogStd routes net/http's internal errors (TLS handshake noise) to debug.
func slogStd(l *slog.Logger) *log.Logger { return slog.NewLogLogger(l.Handler(), slog.LevelDebug) }

// SessionDial opens a control-session connection to addr, which must be a
// ctrl member holding that address (gossip's ctrl claim is only a hint).
func (s *Server) SessionDial(ctx context.Context, addr string) (*tls.Conn, error) {
	return s.client.Dial(ctx, datadir.ProtoSession, trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, addr, 5*time.Second)
}

// NoteLeader records the address of the ctrl leader this member's node
// holds its session with (node-only members order ctrl addresses by it).
func (s *Server) NoteLeader(addr string) {
	if s.raft == nil {
		s.leaderHint.Store(addr)
	}
}

// authorizeConn admits a Raft or control-session connection.
func (s *Server) authorizeConn(proto string, cs tls.ConnectionState) (trust.Identity, error) {
	id, err := s.peerIdentity(cs)
	if err != nil {
		return id, err
	}
	if proto == datadir.ProtoRaft {
		return id, s.authorizeRaft(id)
	}
	return id, s.authorizeSession(id)
}

// serverAt is the node id of the Raft server at addr ("" when none).
func (s *Server) serverAt(addr raft.ServerAddress) string {
	if s.raft == nil {
		return ""
	}
	f := s.raft.GetConfiguration()
	if f.Error() != nil {
		return ""
	}
	for _, srv := range f.Configuration().Servers {
		if srv.Address == addr {
			return string(srv.ID)
		}
	}
	return ""
}

// CtrlAddrs lists ctrl API addresses, the leader first when known.
func (s *Server) CtrlAddrs() []string { return s.ctrlAddrs() }
