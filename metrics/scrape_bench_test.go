package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// BenchmarkScrapeCtrl is one scrape of a ctrl member whose replica holds
// 10,000 nodes (1,000 with live sessions and reports) and 1,000
// Workspaces, their placements counted: gathering every collector and
// writing the exposition format, as promhttp does.
//
//	go test ./metrics -run X -bench ScrapeCtrl -benchtime 20x
func BenchmarkScrapeCtrl(b *testing.B) {
	f := replica(b, 10_000, 1_000, 1_000)
	reg := Registry(Sources{FSM: f})
	b.ReportAllocs()
	for b.Loop() {
		fams, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range fams {
			if err := enc.Encode(mf); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()*1000/float64(b.N), "ms/scrape")
}

// replica is the state of a ctrl member: the bootstrap member (ctrl and
// node, no session), total-1 more nodes of which the first live are
// schedulable (a live session, a report of 64 cores and 256 GiB, the
// template, a default pool with a capacity), and workspaces Workspaces of
// 1 core and 1 GiB created by entries that count their placements.
func replica(tb testing.TB, total, live, workspaces int) *fsm.FSM {
	f, err := fsm.Open(filepath.Join(tb.TempDir(), "fsm.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	var es []fsm.Entry
	add := func(op string, args any) {
		raw, err := json.Marshal(args)
		if err != nil {
			tb.Fatal(err)
		}
		es = append(es, fsm.Entry{Op: op, IssuedAt: now, Args: raw})
	}
	flush := func() {
		for i, r := range f.Apply(es) {
			if r.Error != nil {
				tb.Fatalf("setup entry %d (%s): %v", i, es[i].Op, r.Error)
			}
		}
		es = es[:0]
	}
	add(fsm.OpBootstrap, fsm.BootstrapArgs{ClusterID: "cluster-1", NodeID: "ctrl-1", Roles: []string{"ctrl", "node"}, Address: "10.0.0.1:7000"})
	rep := api.Report{Capacity: api.Resources{CPU: 64000, MemoryBytes: 256 << 30}, Templates: []string{"kibotos-base"},
		Pools: []api.Pool{{PoolID: fsm.DefaultPool, Path: "/srv/default", Available: true, CapacityBytes: 1 << 40, FreeBytes: 1 << 39}}}
	for i := 1; i < total; i++ {
		id := fmt.Sprintf("node-%05d", i)
		add(fsm.OpEnrollmentGrant, fsm.GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: "hash-" + id, TTL: time.Hour})
		add(fsm.OpEnrollmentConsume, fsm.ConsumeArgs{NodeID: id, SecretHash: "hash-" + id, Address: "addr-" + id})
		if i <= live {
			add(fsm.OpSessionOpen, fsm.SessionOpenArgs{NodeID: id, SessionID: "s-" + id, Incarnation: 1})
			add(fsm.OpOvercommitAck, fsm.OvercommitAckArgs{NodeID: id, SessionID: "s-" + id, Values: api.Multipliers{CPU: 1000, Memory: 1000}})
			add(fsm.OpNodeReport, fsm.ReportArgs{NodeID: id, SessionID: "s-" + id, Report: rep,
				Clock: &fsm.ClockArgs{OffsetNS: 1e6, UncertaintyNS: 5e5, KernelSync: "synchronized"}})
			add(fsm.OpPoolSetCapacity, fsm.PoolCapacityArgs{PoolID: api.PrivatePoolID(id), CapacityBytes: 1 << 40})
		}
		if len(es) >= 1000 {
			flush()
		}
	}
	flush()
	for i := 0; i < workspaces; i++ {
		add(fsm.OpWorkspaceCreate, fsm.WorkspaceCreateArgs{Template: "kibotos-base", CPU: 1000, MemoryBytes: 1 << 30})
		es[len(es)-1].CommandID = fmt.Sprintf("create-%d", i)
		es[len(es)-1].CountPlacements = true
		if len(es) == 64 {
			flush()
		}
	}
	flush()
	return f
}
