// Command nodesim simulates many nodes in one process, each speaking the
// real node protocol to a running kibotos cluster, so ctrl's placement path
// can be measured at fleet size on one machine without VMs.
//
//	nodesim -data-dir DIR -addrs a,b,c -nodes 1000
//
// Per node, what a real node does (agent/agent.go session, agent/workspaces.go):
//
//   - enrollment: POST /v1/enrollment/grants then POST /v1/join with the
//     token (two Raft entries, a member certificate signed for the node);
//     every node reuses one ECDSA key pair, as bench/nodelist does;
//   - a control session: a TLS connection with ALPN kibotos-session/1 and
//     the node's member certificate to a ctrl member, hello, redirect to the
//     leader, welcome; then pong to ping, a full report with the clock
//     timestamps to sync, overcommit_ack to overcommit;
//   - the report says what placement needs of a node: capacity (-cpu,
//     -memory), its private storage pool available (the default pool new
//     layers go to), template -template built with its size, no memory
//     pressure, and the Instances it runs (RUNNING, with what they
//     allocate);
//   - a Workspace task is answered at once without a VM: ok for start (the
//     Instance is then RUNNING), stop, delete and network; after each
//     answer a full report, as runTask does (PushReport); with -watch
//     (default), also the real agent's once-a-second watcher, which pushes
//     another full report when the Instances changed since the last report
//     sent.
//
// Before it says ready, it waits until every node is READY with a report
// and acknowledged overcommit values, then sets each node's private pool
// capacity (POST /v1/storage-pools/ID/capacity, as an operator does once per
// pool). It prints one JSON line {"stage":"ready",...} on stdout, runs until
// SIGTERM or SIGINT, closes its sessions and prints {"stage":"done",...}
// with what it sent and received.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

func main() {
	dataDir := flag.String("data-dir", "", "data directory of a ctrl member (admin credentials)")
	addrList := flag.String("addrs", "", "comma-separated ctrl API addresses; default: the member of -data-dir")
	count := flag.Int("nodes", 1000, "simulated nodes")
	prefix := flag.String("prefix", "sim-", "node id prefix")
	cpu := flag.Int("cpu", 256, "cores each node reports")
	memGiB := flag.Int("memory-gib", 1024, "memory each node reports, GiB")
	template := flag.String("template", "bench", "template each node reports built")
	templateBytes := flag.Uint64("template-bytes", 1<<30, "the template's image size, charged to the pool per layer")
	poolBytes := flag.Uint64("pool-capacity", 1<<50, "capacity set on each node's private pool")
	conc := flag.Int("concurrency", 16, "enrollment and pool-capacity workers")
	dials := flag.Int("dials", 32, "sessions being opened at once")
	watch := flag.Bool("watch", true, "mirror the agent's once-a-second report watcher")
	resultReports := flag.Bool("result-reports", true, "send the report owed after a task with its result when the leader takes it, as the agent does")
	flag.Parse()
	if *dataDir == "" {
		fatalf("-data-dir is required")
	}
	d := datadir.Dir(*dataDir)
	admin, err := d.AdminClient()
	if err != nil {
		fatalf("admin credentials: %v", err)
	}
	addrs := split(*addrList)
	if len(addrs) == 0 {
		id, err := d.LoadIdentity()
		if err != nil {
			fatalf("%v", err)
		}
		addrs = []string{id.Advertise}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	start := time.Now()
	api0 := api.NewClient(addrs[0], admin)
	fleet := &fleet{addrs: addrs, template: *template, templateBytes: *templateBytes, watch: *watch, resultReports: *resultReports,
		capacity:    api.Resources{CPU: api.Milli(*cpu * 1000), MemoryBytes: uint64(*memGiB) << 30},
		incarnation: uint64(time.Now().UnixNano())}
	nodes, err := enroll(ctx, api0, *count, *conc, *prefix)
	if err != nil {
		fatalf("enrollment: %v", err)
	}
	enrolled := time.Since(start)
	fleet.stats.start = time.Now()
	sem := make(chan struct{}, *dials)
	var wg sync.WaitGroup
	for _, n := range nodes {
		n.f = fleet
		n.dialSem = sem
		wg.Add(1)
		go func() { defer wg.Done(); n.run(ctx) }()
	}
	if err := waitReady(ctx, api0, nodes); err != nil {
		fatalf("%v", err)
	}
	sessions := time.Since(start) - enrolled
	if err := setPoolCapacity(ctx, api0, nodes, *poolBytes, *conc); err != nil {
		fatalf("pool capacity: %v", err)
	}
	emit(map[string]any{"stage": "ready", "nodes": len(nodes), "enroll_s": secs(enrolled), "sessions_s": secs(sessions),
		"total_s": secs(time.Since(start)), "reconnects": fleet.stats.sessions.Load() - int64(len(nodes))})
	<-ctx.Done()
	wg.Wait()
	emit(fleet.stats.summary())
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodesim: "+format+"\n", args...)
	os.Exit(1)
}

var out = struct {
	sync.Mutex
	w *bufio.Writer
}{w: bufio.NewWriter(os.Stdout)}

func emit(v any) {
	b, _ := json.Marshal(v)
	out.Lock()
	defer out.Unlock()
	out.w.Write(append(b, '\n'))
	out.w.Flush()
}

func secs(d time.Duration) float64 { return float64(d.Milliseconds()) / 1000 }

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// fleet is what the simulated nodes share.
type fleet struct {
	addrs         []string
	template      string
	templateBytes uint64
	capacity      api.Resources
	watch         bool
	resultReports bool         // -result-reports
	incarnation   uint64       // one process: one incarnation for every node
	leader        atomic.Value // string: the address the last redirect named
	stats         stats
}

type stats struct {
	start                               time.Time
	sessions, refused, redirects, drops atomic.Int64
	tasks, starts, stops, deletes       atomic.Int64
	results, reports, watchReports      atomic.Int64
	pings, syncs, overcommits           atomic.Int64
	mu                                  sync.Mutex
	firstErr                            string
}

func (s *stats) note(err error) {
	s.mu.Lock()
	if s.firstErr == "" {
		s.firstErr = err.Error()
	}
	s.mu.Unlock()
}

func (s *stats) summary() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return map[string]any{"stage": "done", "seconds": secs(time.Since(s.start)),
		"sessions": s.sessions.Load(), "refused": s.refused.Load(), "redirects": s.redirects.Load(), "sessions_lost": s.drops.Load(),
		"tasks": s.tasks.Load(), "starts": s.starts.Load(), "stops": s.stops.Load(), "deletes": s.deletes.Load(),
		"task_results": s.results.Load(), "reports": s.reports.Load(), "watcher_reports": s.watchReports.Load(),
		"pings": s.pings.Load(), "syncs": s.syncs.Load(), "overcommits": s.overcommits.Load(), "first_error": s.firstErr}
}

// enroll grants and joins count nodes and returns them with the TLS
// credentials of their member certificates.
func enroll(ctx context.Context, c *api.Client, count, conc int, prefix string) ([]*node, error) {
	key, err := trust.NewKey()
	if err != nil {
		return nil, err
	}
	keyPEM, err := trust.EncodeKey(key)
	if err != nil {
		return nil, err
	}
	pub := trust.PublicKeyPEM(&key.PublicKey)
	nodes := make([]*node, count)
	err = inParallel(ctx, count, conc, func(i int) error {
		id := fmt.Sprintf("%s%05d", prefix, i)
		var gr api.GrantResponse
		_, err := c.Do(ctx, "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: id, Roles: []string{api.RoleNode}, TTL: "24h"}, &gr)
		var jr api.JoinResponse
		if err == nil {
			// The advertised address is only recorded: nothing
			// dials a node while Workspaces are placed on it.
			_, err = c.Do(ctx, "POST", "/v1/join", api.JoinRequest{Token: gr.Token,
				Advertise: fmt.Sprintf("127.0.0.2:%d", 30000+i), MemberKey: pub, AdminKey: pub}, &jr)
		}
		if err == nil {
			nodes[i], err = newNode(id, jr, keyPEM)
		}
		if err != nil {
			return fmt.Errorf("node %s: %w", id, err)
		}
		return nil
	})
	return nodes, err
}

// inParallel runs do(0) to do(count-1) on conc goroutines and stops at
// the first error, which it returns (or ctx's).
func inParallel(ctx context.Context, count, conc int, do func(i int) error) error {
	var next atomic.Int64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= count || ctx.Err() != nil {
					return
				}
				if err := do(i); err != nil {
					once.Do(func() { firstErr = err })
					next.Store(int64(count))
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

func newNode(id string, jr api.JoinResponse, keyPEM []byte) (*node, error) {
	cert, err := tls.X509KeyPair([]byte(jr.MemberCert), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("member certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(jr.CACert)) {
		return nil, errors.New("the join answer holds no CA certificate")
	}
	return &node{id: id, pool: api.PrivatePoolID(id), tls: trust.Client{Pool: pool, Cert: trust.Static(cert)},
		instances: map[string]instance{}, done: map[string]*api.WorkspaceTaskResult{}}, nil
}

// waitReady polls the node list until every simulated node is READY with a
// report and acknowledged overcommit values (what placement checks first).
func waitReady(ctx context.Context, c *api.Client, nodes []*node) error {
	want := map[string]bool{}
	for _, n := range nodes {
		want[n.id] = true
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var l api.NodeList
		_, err := c.Do(ctx, "GET", "/v1/nodes", nil, &l)
		ready, notReady := 0, ""
		for _, n := range l.Nodes {
			if !want[n.NodeID] {
				continue
			}
			if n.Status == api.NodeReady && n.Report != nil && n.Overcommit != nil && n.Overcommit.Acknowledged {
				ready++
			} else if notReady == "" {
				notReady = n.NodeID + " " + n.Status
			}
		}
		if err == nil && ready == len(nodes) {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes ready (first not ready: %s, list error: %v)", ready, len(nodes), notReady, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func setPoolCapacity(ctx context.Context, c *api.Client, nodes []*node, size uint64, conc int) error {
	return inParallel(ctx, len(nodes), conc, func(i int) error {
		p := nodes[i].pool
		if _, err := c.Do(ctx, "POST", "/v1/storage-pools/"+p+"/capacity", api.PoolCapacityRequest{CapacityBytes: size}, nil); err != nil {
			return fmt.Errorf("storage pool %s: %w", p, err)
		}
		return nil
	})
}

// instance is a simulated Instance: it runs from its start to its stop.
type instance struct {
	workspace string
	cpu       api.Milli
	memory    uint64
}

// node is one simulated node.
type node struct {
	id, pool string
	tls      trust.Client
	f        *fleet
	dialSem  chan struct{}

	mu        sync.Mutex
	instances map[string]instance                 // by instance id
	layers    map[string]bool                     // workspaces whose layer it holds
	done      map[string]*api.WorkspaceTaskResult // by command id: a resent command gets its answer again
	send      func(api.SessionMsg) error          // nil between sessions
	changes   uint64                              // bumped when the Instances change
	sent      uint64                              // changes when the last report went
}

// run keeps a session open until ctx ends, reconnecting as the agent does.
func (n *node) run(ctx context.Context) {
	backoff := 200 * time.Millisecond
	for i := 0; ctx.Err() == nil; i++ {
		addr := n.f.addrs[i%len(n.f.addrs)]
		if l, _ := n.f.leader.Load().(string); l != "" {
			addr = l
		}
		redirect, err := n.session(ctx, addr)
		switch {
		case ctx.Err() != nil:
			return
		case redirect != "":
			n.f.stats.redirects.Add(1)
			n.f.leader.Store(redirect)
			continue
		case err != nil:
			n.f.stats.note(fmt.Errorf("node %s: %w", n.id, err))
		}
		n.f.leader.Store("")
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// session runs one control session against addr; it returns the leader's
// address when addr redirected.
func (n *node) session(ctx context.Context, addr string) (string, error) {
	n.dialSem <- struct{}{}
	conn, err := n.tls.Dial(ctx, datadir.ProtoSession, trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, addr, 5*time.Second)
	if err != nil {
		<-n.dialSem
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	enc := json.NewEncoder(conn)
	dec := api.NewSessionDecoder(conn)
	var wmu sync.Mutex
	send := func(m api.SessionMsg) error {
		wmu.Lock()
		defer wmu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		return enc.Encode(m)
	}
	err = send(api.SessionMsg{Type: api.MsgHello, NodeID: n.id, Incarnation: n.f.incarnation, Release: "nodesim", Revision: "nodesim"})
	var first api.SessionMsg
	if err == nil {
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		err = dec.Decode(&first)
	}
	<-n.dialSem
	if err != nil {
		return "", err
	}
	switch first.Type {
	case api.MsgRedirect:
		return first.Leader, nil
	case api.MsgRefused:
		n.f.stats.refused.Add(1)
		return "", fmt.Errorf("session refused (%s): %s", first.Refusal, first.Message)
	case api.MsgWelcome:
	default:
		return "", fmt.Errorf("unexpected %q from %s", first.Type, addr)
	}
	n.f.stats.sessions.Add(1)
	n.mu.Lock()
	n.send = send
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.send = nil
		n.mu.Unlock()
	}()
	withReport := n.f.resultReports && first.ResultReports
	if n.f.watch {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go n.watchInstances(wctx)
	}
	for {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		var m api.SessionMsg
		if err := dec.Decode(&m); err != nil {
			if ctx.Err() == nil {
				n.f.stats.drops.Add(1)
			}
			return "", fmt.Errorf("control session %s: %w", first.SessionID, err)
		}
		recv := time.Now().UnixNano()
		switch m.Type {
		case api.MsgPing:
			n.f.stats.pings.Add(1)
			err = send(api.SessionMsg{Type: api.MsgPong, T1: m.T1, T2: recv, T3: time.Now().UnixNano()})
		case api.MsgSync:
			n.f.stats.syncs.Add(1)
			err = n.sendReport(send, func(r *api.SessionMsg) {
				r.KernelSync, r.T1, r.T2, r.T3 = "synchronized", m.T1, recv, time.Now().UnixNano()
			})
		case api.MsgOvercommit:
			if m.Overcommit != nil {
				n.f.stats.overcommits.Add(1)
				v := *m.Overcommit
				err = send(api.SessionMsg{Type: api.MsgOvercommitAck, Overcommit: &v})
			}
		case api.MsgTask:
			if m.Task != nil {
				err = n.handleTask(send, *m.Task, withReport)
			}
		case api.MsgVolumeTask:
			if t := m.VolumeTask; t != nil {
				err = send(api.SessionMsg{Type: api.MsgVolumeResult, VolumeResult: &api.VolumeTaskResult{VolumeID: t.VolumeID, CommandID: t.Command.CommandID, Outcome: fsm.OutcomeOK}})
			}
		case api.MsgRefused:
			n.f.stats.refused.Add(1)
			return "", fmt.Errorf("session refused (%s): %s", m.Refusal, m.Message)
		}
		if err != nil {
			return "", err
		}
	}
}

// handleTask answers a Workspace command at once, as if the VM work took
// no time, then pushes a full report as the agent does after each task:
// withReport, in the result's message (agent.sendResult).
func (n *node) handleTask(send func(api.SessionMsg) error, t api.WorkspaceTask, withReport bool) error {
	n.f.stats.tasks.Add(1)
	n.mu.Lock()
	r, seen := n.done[t.Command.CommandID]
	if !seen {
		r = &api.WorkspaceTaskResult{WorkspaceID: t.WorkspaceID, CommandID: t.Command.CommandID, Outcome: fsm.OutcomeOK}
		n.done[t.Command.CommandID] = r
		id := t.Command.InstanceID
		switch t.Command.Kind {
		case api.WSCmdStart:
			n.f.stats.starts.Add(1)
			n.instances[id] = instance{workspace: t.WorkspaceID, cpu: max(1000, t.CPU/1000*1000), memory: t.MemoryBytes >> 20 << 20}
			if n.layers == nil {
				n.layers = map[string]bool{}
			}
			n.layers[t.WorkspaceID] = true
		case api.WSCmdStop, api.WSCmdStopForce:
			n.f.stats.stops.Add(1)
			delete(n.instances, id)
		case api.WSCmdDelete:
			n.f.stats.deletes.Add(1)
			delete(n.instances, id)
			delete(n.layers, t.WorkspaceID)
		case api.WSCmdNetwork:
		default:
			r.Outcome, r.Error = fsm.OutcomeFailed, fmt.Sprintf("command kind %q is unknown to this node; upgrade it", t.Command.Kind)
		}
		n.changes++
	}
	n.mu.Unlock()
	if withReport {
		err := n.sendReport(send, func(m *api.SessionMsg) { m.Type, m.TaskResult = api.MsgTaskResult, r })
		if err == nil {
			n.f.stats.results.Add(1)
		}
		return err
	}
	if err := send(api.SessionMsg{Type: api.MsgTaskResult, TaskResult: r}); err != nil {
		return err
	}
	n.f.stats.results.Add(1)
	if seen {
		return nil
	}
	return n.sendReport(send, nil)
}

// watchInstances is the agent's watcher (agent.watchInstances): once a
// second, a full report when the Instances changed since the last report
// any push sent (the one after each task counts).
func (n *node) watchInstances(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n.mu.Lock()
		changed, send := n.changes != n.sent, n.send
		n.mu.Unlock()
		if !changed || send == nil {
			continue
		}
		if n.sendReport(send, nil) == nil {
			n.f.stats.watchReports.Add(1)
		}
	}
}

// sendReport sends a full report; fill completes it (a sync's timestamps).
func (n *node) sendReport(send func(api.SessionMsg) error, fill func(*api.SessionMsg)) error {
	n.mu.Lock()
	at := n.changes
	n.mu.Unlock()
	rep, usage := n.report()
	m := api.SessionMsg{Type: api.MsgReport, Report: &rep, HostUsage: usage}
	if fill != nil {
		fill(&m)
	}
	if err := send(m); err != nil {
		return err
	}
	n.mu.Lock()
	n.sent = max(n.sent, at)
	n.mu.Unlock()
	n.f.stats.reports.Add(1)
	return nil
}

// report is what agent.buildReport(true) sends for a node with one private
// pool, one template and RUNNING Instances, plus a host usage sample.
func (n *node) report() (api.Report, *api.HostUsage) {
	n.mu.Lock()
	defer n.mu.Unlock()
	total := uint64(1) << 50
	r := api.Report{
		Capacity:       n.f.capacity,
		Pools:          []api.Pool{{PoolID: n.pool, Path: "/var/lib/kibotos/node/pools/default", Available: true, CapacityBytes: total, FreeBytes: total - uint64(len(n.layers))*n.f.templateBytes}},
		DefaultPool:    n.pool,
		Templates:      []string{n.f.template},
		TemplateBytes:  map[string]uint64{n.f.template: n.f.templateBytes},
		EndedComplete:  true,
		RetainedLayers: len(n.layers),
	}
	ids := make([]string, 0, len(n.instances))
	for id := range n.instances {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		in := n.instances[id]
		r.InstanceStates = append(r.InstanceStates, api.InstanceState{InstanceID: id, State: "RUNNING"})
		r.Instances++
		r.Allocated.CPU += in.cpu
		r.Allocated.MemoryBytes += in.memory
	}
	now := time.Now().UTC()
	memTotal, memAvail := n.f.capacity.MemoryBytes, n.f.capacity.MemoryBytes-min(r.Allocated.MemoryBytes, n.f.capacity.MemoryBytes)
	vmCPU, vmMem, idle, zero := float64(r.Instances)*0.01, r.Allocated.MemoryBytes, 0.9, 0.0
	return r, &api.HostUsage{SampledAt: now, VMCPUCores: &vmCPU, VMMemoryBytes: &vmMem,
		MemoryTotalBytes: &memTotal, MemoryAvailableBytes: &memAvail, CPUIdle: &idle,
		CPUPressureSome: &zero, CPUPressureFull: &zero, MemoryPressureSome: &zero, MemoryPressureFull: &zero}
}
