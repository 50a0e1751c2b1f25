// Package clustertest builds real in-process Kibotos clusters for tests:
// real Raft over real loopback TLS sockets, real control sessions, tight
// timings. One call makes and joins N members (Nomad's TestServer/TestJoin
// idea); everything is stopped and removed by t.Cleanup, also on failure.
package clustertest

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Cluster is a set of in-process members.
type Cluster struct {
	t       testing.TB
	base    string // the members' data directories are under it
	Members []*Member
}

// Member is one in-process member: server plus, for the node role, agent.
type Member struct {
	t      testing.TB
	ID     string
	Dir    datadir.Dir
	Addr   string
	Server *cluster.Server
	Agent  *agent.Agent

	mu          sync.Mutex
	cancelAgent context.CancelFunc
	agentDone   chan error
}

// Options shape a test cluster.
type Options struct {
	Ctrl     int // ctrl,node members (at least 1)
	NodeOnly int // node-only members
	// Capacity each node reports (default 2 cores, 4 GiB).
	Capacity api.Resources
	Logs     io.Writer // member logs; default discarded
	// AdjustReport edits node reports (held Instances/Volumes for drain tests).
	AdjustReport func(nodeID string, r *api.Report)
	// HoldTask sees the tasks a node receives; one it returns true for the
	// node neither executes nor answers (the command stays pending).
	HoldTask func(nodeID string, t api.WorkspaceTask) bool
	// ClockSkew pretends a node's clock is off (the 30 s rule);
	// Member.Agent.SetClockSkew changes it.
	ClockSkew map[string]time.Duration
	// SyncInterval replaces the test timings' minute between periodic
	// syncs (full report and clock measurement).
	SyncInterval time.Duration
	// Runtimes gives nodes a real Instance runtime (the test owns it).
	Runtimes map[string]*runtime.Runtime
	// Timings replace the tight test timings (benchmarks with the
	// production ones).
	Timings *cluster.Timings
	// NoPoolCapacity leaves the nodes' private pools without a capacity
	// (they take no objects); by default each gets 1 TiB once ready, as
	// kibotos dev gives its own.
	NoPoolCapacity bool
	// FeatureLevels makes members claim a lower feature level than their
	// build's (a voter of an older build in a rolling upgrade).
	FeatureLevels map[string]int
	// Artifacts is the directory of the cluster's artifact store, the
	// same for every member (a shared file system); "": none.
	Artifacts string
	// API, when set, is the API listener ([api]) of every ctrl member;
	// an empty Listen is a free loopback port (Member.Server.APIAddr).
	API *cluster.APIConfig
	// E2B, when set, is the E2B API listener ([e2b]) of every ctrl
	// member; an empty Listen is a free loopback port
	// (Member.Server.E2BAddr).
	E2B *cluster.E2BConfig
}

// New builds, joins and starts a cluster and waits until every node is READY.
func New(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Ctrl < 1 {
		o.Ctrl = 1
	}
	if o.Capacity.CPU == 0 {
		o.Capacity = api.Resources{CPU: 2000, MemoryBytes: 4 << 30}
	}
	c := &Cluster{t: t}
	// Made first so it is removed last: after every member stopped writing.
	base := t.TempDir()
	t.Cleanup(c.stopAll)
	first := &Member{t: t, ID: "node-1", Dir: datadir.Dir(base + "/node-1"), Addr: FreeAddr(t)}
	if _, err := cluster.Init(context.Background(), cluster.InitOptions{DataDir: first.Dir, NodeID: first.ID, Advertise: first.Addr, Roles: []string{api.RoleCtrl, api.RoleNode}}); err != nil {
		t.Fatalf("init: %v", err)
	}
	c.base = base
	form := rollingStart(o)
	first.start(form)
	c.Members = append(c.Members, first)
	c.WaitLeader()
	for i := 2; i <= o.Ctrl+o.NodeOnly; i++ {
		roles := []string{api.RoleCtrl, api.RoleNode}
		if i > o.Ctrl {
			roles = []string{api.RoleNode}
		}
		c.AddMember("node-"+strconv.Itoa(i), roles, form)
	}
	c.WaitAllReady()
	// Then the ctrl members of the newer build are upgraded, one by one.
	for _, m := range c.Members {
		if o.FeatureLevels[m.ID] != form.FeatureLevels[m.ID] {
			m.Stop()
			m.Restart(o)
			c.WaitLeader()
			c.WaitAllReady()
		}
	}
	if !o.NoPoolCapacity {
		for _, m := range c.Members {
			c.SetPoolCapacity(api.PrivatePoolID(m.ID), 1<<40)
		}
	}
	return c
}

// rollingStart is how a cluster whose ctrl members claim different
// feature levels is formed: as a rolling upgrade leaves it. Every ctrl
// member starts at the lowest level claimed among them, and New then
// restarts the others at their own; a voter below the level of every
// other voter is never added (cluster refuseOlderVoter).
func rollingStart(o Options) Options {
	low, differ := 0, false
	for i := 1; i <= o.Ctrl; i++ {
		l := o.FeatureLevels["node-"+strconv.Itoa(i)]
		if l == 0 {
			l = fsm.FeatureLevel
		}
		if low != 0 && l != low {
			differ = true
		}
		if low == 0 || l < low {
			low = l
		}
	}
	if !differ {
		return o
	}
	form := o
	form.FeatureLevels = maps.Clone(o.FeatureLevels) // levels differ: not nil
	for i := 1; i <= o.Ctrl; i++ {
		form.FeatureLevels["node-"+strconv.Itoa(i)] = low
	}
	return form
}

// AddMember joins a member with roles to the cluster and starts it with
// o (its capacity defaults as New's).
func (c *Cluster) AddMember(id string, roles []string, o Options) *Member {
	c.t.Helper()
	if o.Capacity.CPU == 0 {
		o.Capacity = api.Resources{CPU: 2000, MemoryBytes: 4 << 30}
	}
	m := &Member{t: c.t, ID: id, Dir: datadir.Dir(c.base + "/" + id), Addr: FreeAddr(c.t)}
	token := c.Grant(m.ID, roles)
	if _, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: m.Dir, Advertise: m.Addr, Grant: token, Member: c.Members[0].Addr}); err != nil {
		c.t.Fatalf("join %s: %v", m.ID, err)
	}
	m.start(o)
	c.Members = append(c.Members, m)
	return m
}

// SetPoolCapacity sets a declared pool's capacity through the leader.
func (c *Cluster) SetPoolCapacity(pool string, size uint64) {
	c.t.Helper()
	req := api.PoolCapacityRequest{WriteMeta: api.WriteMeta{CommandID: "test-capacity-" + pool + "-" + strconv.FormatUint(size, 10), Generated: true}, CapacityBytes: size}
	if _, err := c.Client(c.WaitLeader()).Do(context.Background(), "POST", "/v1/storage-pools/"+pool+"/capacity", req, nil); err != nil {
		c.t.Fatalf("storage pool %s capacity: %v", pool, err)
	}
}

// FreeAddr returns a loopback address whose port and port+1 (gossip) are
// reserved for the rest of t.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(testenv.Ports(t, 2))
}

func (m *Member) start(o Options) {
	m.t.Helper()
	w := o.Logs
	if w == nil {
		w = io.Discard
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})).With("member", m.ID)
	tm := timings()
	if o.SyncInterval > 0 {
		tm.SyncInterval = o.SyncInterval
	}
	if o.Timings != nil {
		tm = *o.Timings
	}
	var store artifacts.Store
	if o.Artifacts != "" {
		var err error
		if store, err = artifacts.NewDir(o.Artifacts, m.ID); err != nil {
			m.t.Fatalf("artifact store of %s: %v", m.ID, err)
		}
	}
	var apiConf cluster.APIConfig
	var e2bConf cluster.E2BConfig
	if o.API != nil || o.E2B != nil {
		id, err := m.Dir.LoadIdentity()
		if err != nil {
			m.t.Fatalf("identity of %s: %v", m.ID, err)
		}
		if id.HasRole(api.RoleCtrl) && o.API != nil {
			apiConf = *o.API
			apiConf.Listen = cmp.Or(apiConf.Listen, "127.0.0.1:0")
		}
		if id.HasRole(api.RoleCtrl) && o.E2B != nil {
			e2bConf = *o.E2B
			e2bConf.Listen = cmp.Or(e2bConf.Listen, "127.0.0.1:0")
		}
	}
	srv, err := cluster.Open(context.Background(), cluster.Config{DataDir: m.Dir, Timings: tm, Logger: log, FeatureLevel: o.FeatureLevels[m.ID], Artifacts: store, API: apiConf, E2B: e2bConf})
	if err != nil {
		m.t.Fatalf("serve %s: %v", m.ID, err)
	}
	m.Server = srv
	var adjust func(*api.Report)
	if o.AdjustReport != nil {
		id := m.ID
		adjust = func(r *api.Report) { o.AdjustReport(id, r) }
	}
	var hold func(api.WorkspaceTask) bool
	if o.HoldTask != nil {
		id := m.ID
		hold = func(t api.WorkspaceTask) bool { return o.HoldTask(id, t) }
	}
	a, err := agent.New(agent.Config{DataDir: m.Dir, NodeID: m.ID, Artifacts: store, Capacity: o.Capacity, CtrlAddrs: srv.CtrlAddrs, Dial: srv.SessionDial, OnLeader: srv.NoteLeader,
		SessionTimeout: tm.SessionTimeout, Logger: log, SampleInterval: time.Second, AdjustReport: adjust, HoldTask: hold, ClockSkew: o.ClockSkew[m.ID], Runtime: o.Runtimes[m.ID]})
	if err != nil {
		m.t.Fatalf("agent %s: %v", m.ID, err)
	}
	srv.ServeLocal(nodeSide(a))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	m.mu.Lock()
	m.Agent, m.cancelAgent, m.agentDone = a, cancel, done
	m.mu.Unlock()
}

// timings are the tight test timings (stretched under -race, see
// timingScale), but with a slow periodic sync so a test sees registration
// versions move only when it acts (PushReport sends a report on demand).
func timings() cluster.Timings {
	t := cluster.TestTimings()
	for _, d := range []*time.Duration{&t.RaftHeartbeat, &t.RaftElection, &t.RaftLeaderLease, &t.SessionPing, &t.SessionTimeout, &t.AckTimeout} {
		*d *= timingScale
	}
	t.SyncInterval = time.Minute
	return t
}

// ServeMachineLogs gives the member's node a machine-log reader (the
// in-process cluster runs no Instance runtime that would have one).
func (m *Member) ServeMachineLogs(read cluster.MachineLogReader) {
	m.mu.Lock()
	l := nodeSide(m.Agent)
	m.mu.Unlock()
	l.MachineLogs = read
	m.Server.ServeLocal(l)
}

// nodeSide is what a member's node serves ctrl, as kibotos member wires it.
func nodeSide(a *agent.Agent) cluster.Local {
	return cluster.Local{Templates: a.PublishTemplate, Platforms: a.PublishPlatform, Transfers: a, Progress: a.Progress}
}

// Stop stops the member gracefully.
func (m *Member) Stop() { m.stop(false) }

// Kill stops the member as a crash would: no graceful leave or close.
func (m *Member) Kill() { m.stop(true) }

func (m *Member) stop(crash bool) {
	m.mu.Lock()
	cancel, done, srv := m.cancelAgent, m.agentDone, m.Server
	m.cancelAgent, m.Server = nil, nil
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if srv != nil {
		if crash {
			srv.Kill()
		} else {
			srv.Shutdown()
		}
	}
}

// Restart starts a stopped member again on the same data directory.
func (m *Member) Restart(o Options) {
	if o.Capacity.CPU == 0 {
		o.Capacity = api.Resources{CPU: 2000, MemoryBytes: 4 << 30}
	}
	m.start(o)
}

// WaitAgentExit waits for the node agent to end on its own (e.g. refused
// as isolated) and returns its error.
func (m *Member) WaitAgentExit(timeout time.Duration) (error, bool) {
	m.mu.Lock()
	done := m.agentDone
	m.mu.Unlock()
	select {
	case err := <-done:
		done <- err // stop() still waits on it
		return err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Running reports whether the member is serving.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.Server != nil
}

func (c *Cluster) stopAll() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Add(1)
		go func() { defer wg.Done(); m.Stop() }()
	}
	wg.Wait()
}

// Client is an operator API client for member m: with m's host operator
// certificate where it holds one (ctrl and operator members), else with
// the first member's (always ctrl), as a person who holds one calls a
// node-only member.
func (c *Cluster) Client(m *Member) *api.Client {
	c.t.Helper()
	creds := m.Dir
	if !creds.HasAdminCertificate() {
		creds = c.Members[0].Dir
	}
	tlsConf, err := creds.AdminClient()
	if err != nil {
		c.t.Fatal(err)
	}
	return api.NewClient(m.Addr, tlsConf)
}

// Grant issues an enrollment grant through the first running member.
func (c *Cluster) Grant(nodeID string, roles []string) string {
	c.t.Helper()
	var out api.GrantResponse
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		_, err := c.Client(m).Do(context.Background(), "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: nodeID, Roles: roles}, &out)
		if err != nil {
			c.t.Fatalf("grant %s: %v", nodeID, err)
		}
		return out.Token
	}
	c.t.Fatal("no running member")
	return ""
}

// Leader returns the member leading Raft, or nil.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members {
		if m.Running() && m.Server.IsLeader() {
			return m
		}
	}
	return nil
}

// WaitLeader waits for a leader and returns it.
func (c *Cluster) WaitLeader() *Member {
	c.t.Helper()
	var l *Member
	testenv.WaitFor(c.t, 15*time.Second, "a leader", func() (bool, string) {
		l = c.Leader()
		return l != nil, "no leader"
	})
	return l
}

// Node reads a node through member m (consistent read).
func (c *Cluster) Node(m *Member, id string) (*api.Node, error) {
	cl := c.Client(m)
	cl.Consistent = true
	var n api.Node
	_, err := cl.Do(context.Background(), "GET", "/v1/nodes/"+id, nil, &n)
	return &n, err
}

// WaitAllReady waits until every running member's node is READY.
func (c *Cluster) WaitAllReady() {
	c.t.Helper()
	testenv.WaitFor(c.t, 20*time.Second, "every running member's node READY", func() (bool, string) {
		via := c.anyRunning()
		for _, m := range c.Members {
			if !m.Running() {
				continue
			}
			n, err := c.Node(via, m.ID)
			if err != nil {
				return false, err.Error()
			}
			if n.Status != api.NodeReady || n.Report == nil || !n.Overcommit.Acknowledged {
				raw, _ := json.Marshal(n)
				return false, m.ID + " not ready: " + string(raw)
			}
		}
		return true, ""
	})
}

func (c *Cluster) anyRunning() *Member {
	if l := c.Leader(); l != nil {
		return l
	}
	for _, m := range c.Members {
		if m.Running() {
			return m
		}
	}
	c.t.Fatal("no running member")
	return nil
}

// WaitFor is testenv.WaitFor for the cluster tests' conditions, which say
// what they observe but not what they wait for.
func WaitFor(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	testenv.WaitFor(t, timeout, "the condition", cond)
}
