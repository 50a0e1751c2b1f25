// Command nodelist registers many nodes in a running kibotos member through
// its HTTP API and measures what `kibo node list` of all of them costs,
// stage by stage:
//
//   - populate: POST /v1/enrollment/grants then POST /v1/join per node (the
//     real enrollment path: one grant entry and one consume entry in the Raft
//     log, two certificates signed), with -concurrency workers; every join
//     reuses one ECDSA key pair;
//   - http: GET /v1/nodes on a new TLS connection (as the CLI does), body
//     read (server list + encode + transfer), then the CLI's two-step decode;
//   - cli: `kibo node list` run in this process (cli.Main, output discarded):
//     credentials, TLS, GET, decode and table render without process start;
//   - fsm: fsm.ListNodes in-process on a state built directly with
//     fsm.Apply, with bare joined nodes (what the API path creates) and with
//     nodes that have a live session, a report and host usage (what a real
//     fleet has, which the API cannot create without running agents).
//
// Prints one JSON object per stage; nodelist.sh adds the end-to-end binary
// timing with hyperfine.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cli"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func main() {
	privsd.RunIfInit() // as the private systemd's PID 1, this never returns
	dataDir := flag.String("data-dir", "", "data directory of a running member (admin credentials)")
	count := flag.Int("count", 10000, "nodes the cluster should hold, the bootstrap member included")
	conc := flag.Int("concurrency", 16, "populate workers")
	runs := flag.Int("runs", 20, "timed repetitions of each measurement")
	skipPopulate := flag.Bool("skip-populate", false, "measure only")
	skipFSM := flag.Bool("skip-fsm", false, "skip the in-process fsm.ListNodes measurement")
	prefix := flag.String("prefix", "bn-", "node id prefix of the registered nodes")
	flag.Parse()
	if *dataDir == "" {
		fatalf("-data-dir is required")
	}
	d := datadir.Dir(*dataDir)
	id, err := d.LoadIdentity()
	if err != nil {
		fatalf("%v", err)
	}
	tlsConf, err := d.AdminClient()
	if err != nil {
		fatalf("%v", err)
	}
	ctx := context.Background()
	addr := id.Advertise

	if !*skipPopulate {
		populate(ctx, addr, tlsConf, *count, *conc, *prefix)
	}
	measureHTTP(ctx, addr, tlsConf, *runs)
	measureCLI(ctx, *dataDir, *runs)
	if !*skipFSM {
		n := countNodes(ctx, addr, tlsConf)
		measureFSM(n, *runs, false)
		measureFSM(n, *runs, true)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodelist: "+format+"\n", args...)
	os.Exit(1)
}

func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type stats struct {
	Stage   string  `json:"stage"`
	Nodes   int     `json:"nodes"`
	Runs    int     `json:"runs"`
	MinMs   float64 `json:"min_ms"`
	MedMs   float64 `json:"median_ms"`
	P95Ms   float64 `json:"p95_ms"`
	MaxMs   float64 `json:"max_ms"`
	Bytes   int     `json:"bytes,omitempty"`
	Comment string  `json:"comment,omitempty"`
}

func summarize(stage string, nodes int, ds []time.Duration) stats {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) time.Duration {
		i := int(float64(len(s))*p+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return stats{Stage: stage, Nodes: nodes, Runs: len(s), MinMs: msf(s[0]), MedMs: msf(at(0.5)), P95Ms: msf(at(0.95)), MaxMs: msf(s[len(s)-1])}
}

func countNodes(ctx context.Context, addr string, tlsConf trust.Client) int {
	var l api.NodeList
	if _, err := api.NewClient(addr, tlsConf).Do(ctx, "GET", "/v1/nodes", nil, &l); err != nil {
		fatalf("list nodes: %v", err)
	}
	return len(l.Nodes)
}

// populate grants and joins nodes until the cluster holds count nodes.
func populate(ctx context.Context, addr string, tlsConf trust.Client, count, conc int, prefix string) {
	have := countNodes(ctx, addr, tlsConf)
	todo := count - have
	if todo <= 0 {
		emit(map[string]any{"stage": "populate", "nodes": have, "added": 0})
		return
	}
	k1, _ := trust.NewKey()
	k2, _ := trust.NewKey()
	memberPub, adminPub := trust.PublicKeyPEM(&k1.PublicKey), trust.PublicKeyPEM(&k2.PublicKey)
	var next, done atomic.Int64
	var grantNS, joinNS atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	stop := make(chan struct{})
	go func() { // progress
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n := done.Load()
				fmt.Fprintf(os.Stderr, "nodelist: populated %d/%d (%.0f joins/s)\n", n, todo, float64(n)/time.Since(start).Seconds())
			}
		}
	}()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := api.NewClient(addr, tlsConf) // one connection per worker
			for {
				i := next.Add(1) - 1
				if i >= int64(todo) {
					return
				}
				nodeID := fmt.Sprintf("%s%05d", prefix, int64(have)+i)
				t0 := time.Now()
				var gr api.GrantResponse
				_, err := c.Do(ctx, "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: nodeID, Roles: []string{api.RoleNode}, TTL: "24h"}, &gr)
				t1 := time.Now()
				if err == nil {
					// The advertised address is only recorded; nothing dials it.
					_, err = c.Do(ctx, "POST", "/v1/join", api.JoinRequest{Token: gr.Token,
						Advertise: fmt.Sprintf("127.0.0.1:%d", 40000+i%20000), MemberKey: memberPub, AdminKey: adminPub}, nil)
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("node %s: %w", nodeID, err) })
					next.Store(int64(todo))
					return
				}
				grantNS.Add(int64(t1.Sub(t0)))
				joinNS.Add(int64(time.Since(t1)))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	el := time.Since(start)
	n := done.Load()
	out := map[string]any{"stage": "populate", "added": n, "nodes": have + int(n), "concurrency": conc,
		"seconds": el.Round(time.Millisecond).Seconds(), "joins_per_s": float64(int(float64(n)/el.Seconds()*10)) / 10}
	if n > 0 {
		out["grant_mean_ms"] = msf(time.Duration(grantNS.Load() / n))
		out["join_mean_ms"] = msf(time.Duration(joinNS.Load() / n))
	}
	if firstErr != nil {
		out["error"] = firstErr.Error()
	}
	emit(out)
	if firstErr != nil {
		fatalf("populate stopped: %v", firstErr)
	}
}

// measureHTTP times GET /v1/nodes on a fresh connection, split into the
// round trip with the body read and the decode the CLI does (api.Client.Do).
func measureHTTP(ctx context.Context, addr string, tlsConf trust.Client, runs int) {
	var rtt, dec, total []time.Duration
	size, nodes := 0, 0
	for r := 0; r < runs+1; r++ {
		hc := &http.Client{Transport: tlsConf.HTTPTransport(trust.Want{Kind: trust.KindMember}, 10*time.Second)}
		t0 := time.Now()
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/v1/nodes", nil)
		resp, err := hc.Do(req)
		if err != nil {
			fatalf("GET /v1/nodes: %v", err)
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			fatalf("GET /v1/nodes: %s %v", resp.Status, err)
		}
		t1 := time.Now()
		var rb struct {
			Result json.RawMessage `json:"result"`
		}
		var l api.NodeList
		if err := json.Unmarshal(raw, &rb); err != nil {
			fatalf("decode: %v", err)
		}
		if err := json.Unmarshal(rb.Result, &l); err != nil {
			fatalf("decode: %v", err)
		}
		t2 := time.Now()
		hc.CloseIdleConnections()
		if r == 0 {
			continue // warm-up
		}
		size, nodes = len(raw), len(l.Nodes)
		rtt, dec, total = append(rtt, t1.Sub(t0)), append(dec, t2.Sub(t1)), append(total, t2.Sub(t0))
	}
	s := summarize("http_get_body", nodes, rtt)
	s.Bytes, s.Comment = size, "new TLS connection + GET /v1/nodes + body read (server: ListNodes, JSON encode)"
	emit(s)
	s = summarize("client_decode", nodes, dec)
	s.Comment = "api.Client.Do decode: envelope then api.NodeList"
	emit(s)
	s = summarize("http_total", nodes, total)
	emit(s)
}

// measureCLI runs `kibo node list` in this process with output discarded.
func measureCLI(ctx context.Context, dir string, runs int) {
	var ds []time.Duration
	for r := 0; r < runs+1; r++ {
		t0 := time.Now()
		var errb errBuf
		if code := cli.Main(ctx, "kibo", []string{"--data-dir", dir, "node", "list"}, os.Stdin, io.Discard, &errb); code != 0 {
			fatalf("kibo node list exited %d: %s", code, errb.b)
		}
		if r > 0 {
			ds = append(ds, time.Since(t0))
		}
	}
	s := summarize("cli_in_process", -1, ds)
	s.Comment = "cli.Main node list: credentials, TLS, GET, decode, table render (no process start)"
	emit(s)
}

type errBuf struct{ b []byte }

func (e *errBuf) Write(p []byte) (int, error) { e.b = append(e.b, p...); return len(p), nil }

// measureFSM builds n nodes with fsm.Apply and times fsm.ListNodes.
func measureFSM(n, runs int, withReports bool) {
	dir, err := os.MkdirTemp("", "nodelist-fsm-")
	if err != nil {
		fatalf("%v", err)
	}
	defer os.RemoveAll(dir)
	f, err := fsm.Open(filepath.Join(dir, "fsm.db"))
	if err != nil {
		fatalf("%v", err)
	}
	defer f.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entry := func(op string, args any) fsm.Entry {
		raw, _ := json.Marshal(args)
		now = now.Add(time.Millisecond)
		return fsm.Entry{Op: op, Args: raw, IssuedAt: now, Actor: "bench"}
	}
	var es []fsm.Entry
	flush := func() {
		for i, r := range f.Apply(es) {
			if r.Error != nil {
				fatalf("build state: entry %d (%s): %v", i, es[i].Op, r.Error)
			}
		}
		es = es[:0]
	}
	f64 := func(v float64) *float64 { return &v }
	u64 := func(v uint64) *uint64 { return &v }
	report := api.Report{
		Capacity:  api.Resources{CPU: 64000, MemoryBytes: 256 << 30},
		Allocated: api.Resources{CPU: 12000, MemoryBytes: 48 << 30},
		Instances: 12, Volumes: 14, RetainedLayers: 3,
		Pools: []api.Pool{{PoolID: "nvme0", Path: "/srv/kibotos/nvme0", Available: true, CapacityBytes: 4 << 40, FreeBytes: 3 << 40}},
	}
	usage := &api.HostUsage{SampledAt: now, VMCPUCores: f64(9.5), VMMemoryBytes: u64(40 << 30), MemoryTotalBytes: u64(256 << 30),
		MemoryAvailableBytes: u64(180 << 30), CPUIdle: f64(0.7), CPUPressureSome: f64(0.01), MemoryPressureSome: f64(0)}
	ids := []string{"m1"}
	es = append(es, entry(fsm.OpBootstrap, fsm.BootstrapArgs{ClusterID: "kc-bench", NodeID: "m1", Roles: []string{"ctrl", "node"}, Address: "127.0.0.1:1"}))
	for i := 1; i < n; i++ {
		id := fmt.Sprintf("bn-%05d", i)
		ids = append(ids, id)
		es = append(es,
			entry(fsm.OpEnrollmentGrant, fsm.GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: "h-" + id, TTL: 24 * time.Hour}),
			entry(fsm.OpEnrollmentConsume, fsm.ConsumeArgs{NodeID: id, SecretHash: "h-" + id, Address: fmt.Sprintf("127.0.0.1:%d", 40000+i%20000)}))
		if len(es) >= 2000 {
			flush()
		}
	}
	flush()
	if withReports {
		for _, id := range ids {
			sid := "sess-" + id
			es = append(es,
				entry(fsm.OpSessionOpen, fsm.SessionOpenArgs{NodeID: id, SessionID: sid, Incarnation: 1, Release: "bench", Revision: "0123456789ab"}),
				entry(fsm.OpNodeReport, fsm.ReportArgs{NodeID: id, SessionID: sid, Report: report, HostUsage: usage,
					Clock: &fsm.ClockArgs{OffsetNS: 1_200_000, UncertaintyNS: 300_000, KernelSync: "synchronized"}}))
			if len(es) >= 2000 {
				flush()
			}
		}
		flush()
	}
	var ds, encs []time.Duration
	size := 0
	for r := 0; r < runs+1; r++ {
		var l *api.NodeList
		t0 := time.Now()
		if err := f.View(func(tx *bolt.Tx) (err error) { l, err = fsm.ListNodes(tx, 0, ""); return }); err != nil {
			fatalf("ListNodes: %v", err)
		}
		t1 := time.Now()
		b, _ := json.Marshal(api.ResultBody{Result: l})
		t2 := time.Now()
		if len(l.Nodes) != n {
			fatalf("ListNodes returned %d nodes, want %d", len(l.Nodes), n)
		}
		if r > 0 {
			ds, encs, size = append(ds, t1.Sub(t0)), append(encs, t2.Sub(t1)), len(b)
		}
	}
	kind := "bare"
	if withReports {
		kind = "with_reports"
	}
	s := summarize("fsm_listnodes_"+kind, n, ds)
	s.Comment = "fsm.ListNodes in one View, in-process"
	emit(s)
	s = summarize("json_encode_"+kind, n, encs)
	s.Bytes, s.Comment = size, "json.Marshal of the list body (what the handler encodes)"
	emit(s)
}
