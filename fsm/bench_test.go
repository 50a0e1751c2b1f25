package fsm

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// BenchmarkApplyBatch applies batches of 64 node.report entries (the group
// commit of a busy leader) spread over 16 nodes with live sessions.
func BenchmarkApplyBatch(b *testing.B) { benchApplyBatch(b, nil) }

// BenchmarkApplyBatchCommands is BenchmarkApplyBatch with a command id on
// every entry (as a client's write with --command-id): each apply also
// stores the command's record, in each layout (commandLayouts). The
// records are kept for the whole run, so a longer run applies over a
// larger log, as a cluster's 24 hours of records make it.
func BenchmarkApplyBatchCommands(b *testing.B) {
	for _, l := range commandLayouts {
		b.Run("layout="+l.name, func(b *testing.B) { benchApplyBatch(b, l.opt) })
	}
}

// commandLayouts are where an entry with a command id keeps its record:
// the command log the leader asks for from LevelCommandLog on, and the
// bucket keyed by the id's digest before it.
var commandLayouts = []struct {
	name string
	opt  entryOpt
}{{"log", withCommandLog()}, {"digest", withCommandDigest()}}

func benchApplyBatch(b *testing.B, command entryOpt) {
	const nodes, batch = 16, 64
	h := newHarness(b)
	h.bootstrap()
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("node-%02d", i)
		h.join(id)
		h.open(id, "s-"+id, 1)
	}
	rep := api.Report{
		Capacity:  api.Resources{CPU: 32000, MemoryBytes: 128 << 30},
		Allocated: api.Resources{CPU: 8000, MemoryBytes: 32 << 30},
		Instances: 4, Volumes: 4,
		Pools: []api.Pool{{PoolID: "p1", Path: "/srv/p1", Available: true, CapacityBytes: 1 << 40, FreeBytes: 1 << 39}},
	}
	clock := &ClockArgs{OffsetNS: 1e6, UncertaintyNS: 5e5, KernelSync: "synchronized"}
	entries := make([]Entry, batch)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.advance(time.Second)
		for j := range entries {
			id := fmt.Sprintf("node-%02d", j%nodes)
			entries[j] = h.entry(OpNodeReport, ReportArgs{NodeID: id, SessionID: "s-" + id, Report: rep, Clock: clock})
			if command != nil {
				entries[j].CommandID = fmt.Sprintf("cmd-%d-%d", i, j)
				command(&entries[j])
			}
		}
		for j, r := range h.f.Apply(entries) {
			if r.Error != nil {
				b.Fatalf("entry %d: %v", j, r.Error)
			}
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkListNodes10k lists 10,000 registered nodes in one page.
func BenchmarkListNodes10k(b *testing.B) {
	const total = 10_000
	h := newHarness(b)
	h.bootstrap()
	var es []Entry
	flush := func() {
		for j, r := range h.f.Apply(es) {
			if r.Error != nil {
				b.Fatalf("setup entry %d: %v", j, r.Error)
			}
		}
		es = es[:0]
	}
	for i := 1; i < total; i++ { // the bootstrap node is the first
		id := fmt.Sprintf("node-%05d", i)
		es = append(es,
			h.entry(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: secretOf(id), TTL: time.Hour}),
			h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: secretOf(id), Address: "addr-" + id}))
		if len(es) >= 1000 {
			flush()
		}
	}
	flush()
	b.ReportAllocs()
	for b.Loop() {
		var l *api.NodeList
		if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListNodes(tx, 0, ""); return }); err != nil {
			b.Fatal(err)
		}
		if len(l.Nodes) != total || l.NextPageToken != "" {
			b.Fatalf("listed %d nodes, token %q", len(l.Nodes), l.NextPageToken)
		}
	}
}

// BenchmarkPlaceWorkspaces creates 10,000 Workspaces (1 CPU, 1 GiB) on
// 1,000 schedulable nodes through the FSM, in batches of 64 creates (a busy
// leader's group commit): placement runs inside each apply.
func BenchmarkPlaceWorkspaces(b *testing.B) {
	const nodes, workspaces, batch = 1000, 10_000, 64
	for b.Loop() {
		b.StopTimer()
		h, _ := placementCluster(b, nodes)
		b.StartTimer()
		var es []Entry
		for i := 0; i < workspaces; i++ {
			e := h.entry(OpWorkspaceCreate, WorkspaceCreateArgs{Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30})
			e.CommandID = fmt.Sprintf("create-%d", i)
			es = append(es, e)
			if len(es) == batch {
				applyAll(b, h, es)
				es = es[:0]
			}
		}
		applyAll(b, h, es)
	}
	b.ReportMetric(float64(b.N*workspaces)/b.Elapsed().Seconds(), "workspaces/s")
}

// BenchmarkCreateToAvailable is the FSM's part of a create through the
// placement benchmark (bench/placement.sh), on every voter: 10,000
// creates on 1,000 nodes (10 per node) in batches of 64, each batch
// followed by a batch of the nodes' answers, each answer carrying its
// node's report with the new Instance (one entry per task, as from
// LevelResultReports). On 200 nodes the same creates make 50 per node: a
// report lists every Instance of its node, so a result costs more the
// more the node runs.
//
//	go test ./fsm -run X -bench CreateToAvailable -benchtime 3x
func BenchmarkCreateToAvailable(b *testing.B) {
	for _, nodes := range []int{1000, 200} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchCreateToAvailable(b, nodes) })
	}
}

func benchCreateToAvailable(b *testing.B, nodes int) {
	const workspaces, batch = 10_000, 64
	for b.Loop() {
		b.StopTimer()
		h, rep := placementCluster(b, nodes)
		running := map[string][]api.InstanceState{}
		b.StartTimer()
		for i := 0; i < workspaces; i += batch {
			var es []Entry
			for j := i; j < min(i+batch, workspaces); j++ {
				e := h.entry(OpWorkspaceCreate, WorkspaceCreateArgs{Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30})
				e.CommandID = fmt.Sprintf("create-%d", j)
				es = append(es, e)
			}
			created := applyAll(b, h, es)
			es = es[:0]
			for _, res := range created {
				w := decode[api.Workspace](b, res)
				p := w.Pending
				running[p.NodeID] = append(running[p.NodeID], api.InstanceState{InstanceID: p.InstanceID, State: "RUNNING"})
				nr := rep
				nr.InstanceStates = running[p.NodeID]
				nr.Instances = len(nr.InstanceStates)
				nr.Allocated = api.Resources{CPU: api.Milli(nr.Instances * 1000), MemoryBytes: uint64(nr.Instances) << 30}
				sess := "s-" + p.NodeID
				es = append(es, h.entry(OpWorkspaceResult, WorkspaceResultArgs{NodeID: p.NodeID, SessionID: sess, WorkspaceID: w.WorkspaceID,
					CommandID: p.CommandID, Outcome: OutcomeOK, Report: &ReportArgs{NodeID: p.NodeID, SessionID: sess, Report: nr}}))
			}
			for j, r := range applyAll(b, h, es) {
				if rr := decode[ResultReport](b, r); rr.ReportError != nil || rr.Report == nil {
					b.Fatalf("answer %d: report not stored: %+v", j, rr.ReportError)
				}
			}
		}
	}
	b.ReportMetric(float64(b.N*workspaces)/b.Elapsed().Seconds(), "workspaces/s")
}

// placementCluster is a bootstrapped FSM with nodes schedulable nodes
// (node-0001...) with live sessions, and the report each made.
func placementCluster(b *testing.B, nodes int) (*harness, api.Report) {
	h := newHarness(b)
	h.bootstrap()
	rep := api.Report{Capacity: api.Resources{CPU: 64000, MemoryBytes: 256 << 30}, Pools: defaultPoolAvailable, Templates: testTemplates,
		TemplateBytes: map[string]uint64{"kibotos-base": 1 << 30}}
	var es []Entry
	for i := 1; i <= nodes; i++ {
		id := fmt.Sprintf("node-%04d", i)
		es = append(es,
			h.entry(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: secretOf(id), TTL: time.Hour}),
			h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: secretOf(id), Address: "addr-" + id}),
			h.entry(OpSessionOpen, SessionOpenArgs{NodeID: id, SessionID: "s-" + id, Incarnation: 1}),
			h.entry(OpOvercommitAck, OvercommitAckArgs{NodeID: id, SessionID: "s-" + id, Values: api.Multipliers{CPU: 1000, Memory: 1000}}),
			h.entry(OpNodeReport, ReportArgs{NodeID: id, SessionID: "s-" + id, Report: rep}),
			h.entry(OpPoolSetCapacity, PoolCapacityArgs{PoolID: api.PrivatePoolID(id), CapacityBytes: 1 << 50}))
		if len(es) >= 1000 {
			applyAll(b, h, es)
			es = es[:0]
		}
	}
	applyAll(b, h, es)
	return h, rep
}

// applyAll applies es as one batch; each must succeed.
func applyAll(b *testing.B, h *harness, es []Entry) []Result {
	rs := h.f.Apply(es)
	for j, r := range rs {
		if r.Error != nil {
			b.Fatalf("entry %d (%s): %v", j, es[j].Op, r.Error)
		}
	}
	return rs
}

// BenchmarkPendingCommands reads the pending commands of a node that runs
// 200 Workspaces, one of which has a command waiting (a stop): what the
// node's control session reads at every wake.
//
//	go test ./fsm -run X -bench PendingCommands
func BenchmarkPendingCommands(b *testing.B) {
	h := newHarness(b)
	h.bootstrap()
	h.schedNode("node-a", 1, 400_000, 1<<40)
	var last api.Workspace
	for i := range 200 {
		last = h.running(fmt.Sprintf("c%d", i), wsArgs(1000, gib))
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: last.WorkspaceID})
	for b.Loop() {
		if err := h.f.View(func(tx *bolt.Tx) error {
			ws, err := PendingCommands(tx, "node-a")
			if err == nil && len(ws) != 1 {
				err = fmt.Errorf("%d pending, want 1", len(ws))
			}
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommandsExpire is the leader's periodic commands.expire on a
// state holding 100,000 command records (about 20 minutes of writes at
// the write benchmark's 64-client rate, all with a 24-hour retention
// still to run) of which the oldest 1,000 are past it: what every member
// stalls its apply for, every CommandExpiry. restore-ms is the restore of
// that state from a snapshot, outside the timing.
//
//	go test ./fsm -run X -bench CommandsExpire -benchtime 5x
func BenchmarkCommandsExpire(b *testing.B) {
	for _, l := range commandLayouts {
		b.Run("layout="+l.name, func(b *testing.B) { benchCommandsExpire(b, l.opt) })
	}
}

func benchCommandsExpire(b *testing.B, layout entryOpt) {
	const total, expired, batch = 100_000, 1_000, 1_000
	h := newHarness(b)
	readyNode(h)
	entries := make([]Entry, 0, batch)
	for i := 0; i < total; i++ {
		entries = append(entries, h.entry(OpNodeDrain, NodeArgs{NodeID: "node-a"}, withCommand(fmt.Sprintf("cmd-%07d", i)), layout))
		if i == expired-1 {
			h.apply(entries...)
			entries = entries[:0]
			h.advance(time.Hour)
		}
		if len(entries) == batch {
			h.apply(entries...)
			entries = entries[:0]
		}
	}
	h.apply(entries...)
	cutoff := h.now.Add(-time.Minute)
	var snap bytes.Buffer
	if err := h.f.Snapshot(&snap); err != nil {
		b.Fatal(err)
	}
	f := openFSM(b)
	var restore time.Duration
	for b.Loop() {
		b.StopTimer()
		t0 := time.Now()
		if err := f.Restore(bytes.NewReader(snap.Bytes())); err != nil {
			b.Fatal(err)
		}
		restore += time.Since(t0)
		b.StartTimer()
		r := f.Apply([]Entry{makeEntry(h.now, OpCommandsExpire, CommandsExpireArgs{Before: cutoff})})[0]
		if r.Error != nil {
			b.Fatal(r.Error)
		}
		if n := decode[map[string]int](b, r)["expired"]; n != expired {
			b.Fatalf("expired %d records, want %d", n, expired)
		}
	}
	// The restore of the snapshot (not timed above), which builds the
	// time index or the command log's index.
	b.ReportMetric(float64(restore.Milliseconds())/float64(b.N), "restore-ms")
}

// BenchmarkOvercommitSet applies batches of 64 node overcommit writes
// (the write of bench/raft_vs_etcd.sh) spread over 3 nodes that report
// 20 Instances each, as the members of a running cluster do.
//
//	go test ./fsm -run X -bench OvercommitSet
func BenchmarkOvercommitSet(b *testing.B) {
	const nodes, batch = 3, 64
	h := newHarness(b)
	h.bootstrap()
	rep := api.Report{Capacity: api.Resources{CPU: 32000, MemoryBytes: 128 << 30}, Pools: defaultPoolAvailable, Templates: testTemplates,
		TemplateBytes: map[string]uint64{"kibotos-base": 1 << 30}, Instances: 20}
	for i := range rep.Instances {
		rep.InstanceStates = append(rep.InstanceStates, api.InstanceState{InstanceID: fmt.Sprintf("inst-%026d", i), State: "RUNNING"})
	}
	for i := range nodes {
		id := fmt.Sprintf("node-%02d", i)
		h.join(id)
		h.open(id, "s-"+id, 1)
		h.ok(OpNodeReport, ReportArgs{NodeID: id, SessionID: "s-" + id, Report: rep})
	}
	entries := make([]Entry, batch)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range entries {
			v := api.Milli(1000 + (i*batch+j)%1000)
			entries[j] = h.entry(OpOvercommitSet, OvercommitSetArgs{NodeID: fmt.Sprintf("node-%02d", j%nodes), CPU: &MultiplierChange{Value: v}})
		}
		applyAll(b, h, entries)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "entries/s")
}
