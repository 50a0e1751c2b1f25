// Command loadgen drives the same closed-loop write load against a kibotos
// cluster or an etcd cluster and prints one JSON line with throughput and
// latency percentiles, so both systems are measured by one client.
//
//	loadgen -target kibotos -data-dir DIR -addrs a,b,c -clients 64 -duration 15s
//	loadgen -target etcd -endpoints http://a,http://b -clients 64 -duration 15s
//	loadgen -target create -data-dir DIR -addrs a,b,c -clients 64 -duration 15s
//
// Every client is one goroutine with its own connection that sends one write,
// waits for the answer and sends the next. Client i talks to address
// i mod len(addrs), as a round-robin client library would.
//
// kibotos: each write is POST /v1/nodes/<id>/overcommit {"cpu": "<v>"}, one
// Raft entry committed (fsync) on a majority and applied before the answer.
// etcd: each write is a put of a 256-byte value through etcd's HTTP/JSON
// gateway (POST /v3/kv/put, base64 key and value); the gateway is used
// instead of go.etcd.io/etcd/client/v3 so the kibotos module takes no gRPC
// dependency (see bench/README.md for its measured overhead).
//
// create: each op is a Workspace create as `kibo workspace create` does it:
// POST /v1/workspaces (one Raft entry whose apply places the Workspace, then
// the start goes over the chosen node's control session), then blocking
// reads GET /v1/workspaces/ID?wait_version=V until it is AVAILABLE (the
// node's answer, another Raft entry, applied on the member read). The
// latency is from the POST to the read that shows AVAILABLE; accept_* is
// the POST alone (placed, CREATING). A FAILED Workspace is an error.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

type result struct {
	Target   string  `json:"target"`
	Clients  int     `json:"clients"`
	Ops      int     `json:"ops"`
	OpsPerS  float64 `json:"ops_per_s"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	MeanMs   float64 `json:"mean_ms"`
	MaxMs    float64 `json:"max_ms"`
	FirstErr string  `json:"first_error,omitempty"`
	// ClientCPU is this process's user+system CPU time over its whole run.
	ClientCPU float64 `json:"client_cpu_s"`
	// With -server-pids, CPU over the measured window alone (not the
	// setup before it, such as registering a node per client, or the
	// warm-up): the servers', this process's and the machine's busy and
	// total CPU time, in seconds (/proc, sampled at the window's start
	// and end).
	Window *windowCPU `json:"window,omitempty"`
	// AcceptP50ms and AcceptP99ms (create): the POST alone, of the ops
	// counted above.
	AcceptP50ms float64 `json:"accept_p50_ms,omitempty"`
	AcceptP99ms float64 `json:"accept_p99_ms,omitempty"`
	// StaleReads (create): reads right after a create that found no
	// Workspace because the member read had not applied the create yet;
	// the client reads again (the CLI would fail, see bench/README.md).
	StaleReads int64 `json:"stale_reads,omitempty"`
}

// op sends one write; seq is its number in the client's sequence. It
// returns how long its first stage took when it has stages (create: the
// POST), else 0.
type op func(ctx context.Context, seq int) (time.Duration, error)

func main() {
	target := flag.String("target", "", "kibotos or etcd")
	dataDir := flag.String("data-dir", "", "kibotos: data directory of a member (admin credentials)")
	addrs := flag.String("addrs", "", "kibotos: comma-separated API addresses (HOST:PORT); default: the member of -data-dir")
	nodes := flag.String("nodes", "", "kibotos: comma-separated node ids to write to; default: every node of GET /v1/nodes")
	endpoints := flag.String("endpoints", "", "etcd: comma-separated client URLs (http://HOST:PORT, or https:// with -etcd-tls)")
	etcdTLS := flag.String("etcd-tls", "", "etcd: directory with ca.pem, client.pem and client-key.pem; the client authenticates with that certificate")
	valueSize := flag.Int("value-size", 256, "etcd: bytes per value; kibotos, when given: each write carries a command id of this many bytes (see kibotosValueOps)")
	keys := flag.Int("keys", 10000, "etcd: size of each client's key space")
	template := flag.String("template", "bench", "create: template of the Workspaces")
	cpu := flag.Int("cpu", 1, "create: cores per Workspace")
	memMiB := flag.Int("memory-mib", 1024, "create: memory per Workspace, MiB")
	clients := flag.Int("clients", 1, "concurrent closed-loop clients")
	duration := flag.Duration("duration", 15*time.Second, "measured time")
	warmup := flag.Duration("warmup", time.Second, "unmeasured time before it (connections, leader caches)")
	keysFile := flag.String("keys-file", "", "create: a file of API key secrets, one a line; client i creates with key i mod their number through -api-addrs instead of the operator certificate")
	apiAddrs := flag.String("api-addrs", "", "create with -keys-file: comma-separated API listener addresses (HOST:PORT); client i talks to address i mod their number")
	serverPIDs := flag.String("server-pids", "", "comma-separated PIDs of the servers, whose CPU time over the measured window is reported")
	flag.Parse()
	var pids []int
	for _, p := range split(*serverPIDs) {
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 {
			fatalf("-server-pids: %q is not a PID", p)
		}
		pids = append(pids, pid)
	}
	if *clients < 1 {
		fatalf("-clients must be at least 1")
	}

	var makeOp func(i int) op
	switch *target {
	case "kibotos":
		makeOp = kibotosOps(*dataDir, *addrs, *nodes)
		flag.Visit(func(f *flag.Flag) {
			if f.Name == "value-size" && *valueSize > 0 {
				makeOp = kibotosValueOps(*dataDir, *addrs, *valueSize)
			}
		})
	case "etcd":
		makeOp = etcdOps(*endpoints, *etcdTLS, *valueSize, *keys)
	case "create":
		makeOp = createOps(createClients(*dataDir, *addrs, *keysFile, *apiAddrs), *template, *cpu, *memMiB)
	default:
		fatalf("-target must be kibotos, etcd or create")
	}

	ops := make([]op, *clients)
	for i := range ops {
		ops[i] = makeOp(i)
	}
	res := run(*target, ops, *warmup, *duration, pids)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		res.ClientCPU = round(time.Duration(ru.Utime.Nano()+ru.Stime.Nano()).Seconds(), 3)
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	if res.Ops == 0 {
		os.Exit(1)
	}
}

func run(target string, ops []op, warmup, duration time.Duration, pids []int) result {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	measureFrom := start.Add(warmup)
	end := measureFrom.Add(duration)
	window := make(chan *windowCPU, 1)
	if len(pids) > 0 {
		go func() { window <- measureWindow(pids, measureFrom, end) }()
	} else {
		window <- nil
	}
	lat := make([][]time.Duration, len(ops))
	stage := make([][]time.Duration, len(ops))
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for i := range ops {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l := make([]time.Duration, 0, 4096)
			var sl []time.Duration
			for seq := 0; ; seq++ {
				t0 := time.Now()
				if !t0.Before(end) {
					break
				}
				octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
				first, err := ops[i](octx, seq)
				ocancel()
				t1 := time.Now()
				if t0.Before(measureFrom) {
					continue
				}
				if err != nil {
					if errs.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				// Count only writes that started and finished in the window.
				if t1.Before(end) {
					l = append(l, t1.Sub(t0))
					if first > 0 {
						sl = append(sl, first)
					}
				}
			}
			lat[i], stage[i] = l, sl
		}(i)
	}
	wg.Wait()
	var all, firsts []time.Duration
	for i, l := range lat {
		all = append(all, l...)
		firsts = append(firsts, stage[i]...)
	}
	slices.Sort(all)
	slices.Sort(firsts)
	res := result{Target: target, Clients: len(ops), Ops: len(all), Errors: errs.Load(), Seconds: duration.Seconds(), Window: <-window}
	if s, ok := firstErr.Load().(string); ok {
		res.FirstErr = s
	}
	res.OpsPerS = round(float64(len(all))/duration.Seconds(), 1)
	if len(all) > 0 {
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		res.P50ms = ms(pct(all, 0.50))
		res.P99ms = ms(pct(all, 0.99))
		res.MeanMs = ms(sum / time.Duration(len(all)))
		res.MaxMs = ms(all[len(all)-1])
	}
	res.StaleReads = staleReads.Load()
	if len(firsts) > 0 {
		res.AcceptP50ms = ms(pct(firsts, 0.50))
		res.AcceptP99ms = ms(pct(firsts, 0.99))
	}
	return res
}

// windowCPU is CPU time over the measured window, in seconds.
type windowCPU struct {
	Servers      float64 `json:"server_cpu_s"`
	Client       float64 `json:"client_cpu_s"`
	MachineBusy  float64 `json:"machine_busy_s"`
	MachineTotal float64 `json:"machine_total_s"`
}

// cpuSample is one reading of the CPU counters windowCPU is made of.
type cpuSample struct{ servers, client, busy, total float64 }

// userHZ is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// measureWindow samples the counters at from and at end.
func measureWindow(pids []int, from, end time.Time) *windowCPU {
	time.Sleep(time.Until(from))
	a, err := sampleCPU(pids)
	if err != nil {
		fatalf("%v", err)
	}
	time.Sleep(time.Until(end))
	b, err := sampleCPU(pids)
	if err != nil {
		fatalf("%v", err)
	}
	return &windowCPU{Servers: round(b.servers-a.servers, 3), Client: round(b.client-a.client, 3),
		MachineBusy: round(b.busy-a.busy, 3), MachineTotal: round(b.total-a.total, 3)}
}

func sampleCPU(pids []int) (cpuSample, error) {
	var s cpuSample
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return s, fmt.Errorf("server %d: %w", pid, err)
		}
		// utime and stime are the 12th and 13th fields after the
		// command, which may hold spaces and ends at the last ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return s, fmt.Errorf("server %d: /proc/%d/stat has %d fields after the command", pid, pid, len(f))
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		k, _ := strconv.ParseFloat(f[12], 64)
		s.servers += (u + k) / userHZ
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, err
	}
	s.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	// cpu user nice system idle iowait irq softirq steal ...
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: first line %q", line)
	}
	for i := 1; i <= 8; i++ {
		v, _ := strconv.ParseFloat(f[i], 64)
		s.total += v / userHZ
		if i != 4 && i != 5 { // idle, iowait
			s.busy += v / userHZ
		}
	}
	return s, nil
}

// pct is the nearest-rank percentile of sorted durations.
func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted))*p+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

func round(f float64, places int) float64 {
	p := 1.0
	for range places {
		p *= 10
	}
	return float64(int64(f*p+0.5)) / p
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "loadgen: "+format+"\n", args...)
	os.Exit(2)
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// adminOf is the admin credentials of dataDir and the member addresses
// to talk to: addrList, or the data dir's member.
func adminOf(dataDir, addrList string) (trust.Client, []string) {
	d := datadir.Dir(dataDir)
	tlsConf, err := d.AdminClient()
	if err != nil {
		fatalf("admin credentials: %v", err)
	}
	as := split(addrList)
	if len(as) == 0 {
		id, err := d.LoadIdentity()
		if err != nil {
			fatalf("%v", err)
		}
		as = []string{id.Advertise}
	}
	return tlsConf, as
}

// kibotosOps: overcommit-set writes with the admin credentials of dataDir.
func kibotosOps(dataDir, addrList, nodeList string) func(int) op {
	if dataDir == "" {
		fatalf("-target kibotos needs -data-dir")
	}
	tlsConf, as := adminOf(dataDir, addrList)
	ids := split(nodeList)
	if len(ids) == 0 {
		var l api.NodeList
		if _, err := api.NewClient(as[0], tlsConf).Do(context.Background(), "GET", "/v1/nodes", nil, &l); err != nil {
			fatalf("list nodes: %v", err)
		}
		for _, n := range l.Nodes {
			if !n.Retired {
				ids = append(ids, n.NodeID)
			}
		}
		if len(ids) == 0 {
			fatalf("the cluster has no node to write to")
		}
	}
	return func(i int) op {
		// One client (one http.Transport, so one TLS connection) per worker.
		c := api.NewClient(as[i%len(as)], tlsConf)
		node := ids[i%len(ids)]
		path := "/v1/nodes/" + node + "/overcommit"
		return func(ctx context.Context, seq int) (time.Duration, error) {
			// Cycle through 0.001 … 16.000 (documented range 0–16, three places);
			// the worker index shifts the cycle so concurrent writes differ.
			m := 1 + (seq*7+i*131)%16000
			v := fmt.Sprintf("%d.%03d", m/1000, m%1000)
			_, err := c.Do(ctx, "POST", path, api.OvercommitSetRequest{CPU: &v}, nil)
			return 0, err
		}
	}
}

// kibotosValueOps: overcommit writes that carry size bytes each, for a
// comparison with etcd puts of values that size. The bytes are the write's
// command id: the leader replicates it in the entry and every member
// stores it with the write's result in its command log, as etcd stores a
// value. A write with a command id must name the version it expects and
// both multipliers (so a replay has the same inputs), so each client first
// registers a node of its own (grant + join, before the measured time) and
// is the one writer of it, counting its versions.
func kibotosValueOps(dataDir, addrList string, size int) func(int) op {
	tlsConf, as := adminOf(dataDir, addrList)
	run := time.Now().UnixNano() // ids differ from any run before on the cluster
	key, _ := trust.NewKey()
	pub := trust.PublicKeyPEM(&key.PublicKey)
	return func(i int) op {
		c := api.NewClient(as[i%len(as)], tlsConf)
		ctx := context.Background()
		node := fmt.Sprintf("load-%x-%d", run%(1<<32), i)
		var gr api.GrantResponse
		if _, err := c.Do(ctx, "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: node, Roles: []string{api.RoleNode}, TTL: "1h"}, &gr); err != nil {
			fatalf("grant %s: %v", node, err)
		}
		if _, err := c.Do(ctx, "POST", "/v1/join", api.JoinRequest{Token: gr.Token, Advertise: fmt.Sprintf("127.0.0.1:%d", 40000+i), MemberKey: pub, AdminKey: pub}, nil); err != nil {
			fatalf("join %s: %v", node, err)
		}
		var n api.Node
		if _, err := c.Do(ctx, "GET", "/v1/nodes/"+node, nil, &n); err != nil {
			fatalf("node %s: %v", node, err)
		}
		version := n.RegistrationVersion
		path := "/v1/nodes/" + node + "/overcommit"
		return func(ctx context.Context, seq int) (time.Duration, error) {
			m := 1 + (seq*7+i*131)%16000
			v := fmt.Sprintf("%d.%03d", m/1000, m%1000)
			id := fmt.Sprintf("load-%x-%d-%d-", run, i, seq)
			req := api.OvercommitSetRequest{CPU: &v, Memory: &v, WriteMeta: api.WriteMeta{
				CommandID: id + strings.Repeat("x", max(size-len(id), 0)), ExpectedVersion: &version}}
			var got api.Node
			if _, err := c.Do(ctx, "POST", path, req, &got); err != nil {
				return 0, err
			}
			version = got.RegistrationVersion
			return 0, nil
		}
	}
}

// etcdOps: puts of valueSize random bytes through the HTTP/JSON gateway,
// over TLS with a client certificate when tlsDir is given.
func etcdOps(endpointList, tlsDir string, valueSize, keys int) func(int) op {
	eps := split(endpointList)
	if len(eps) == 0 {
		fatalf("-target etcd needs -endpoints")
	}
	var tlsConf *tls.Config
	if tlsDir != "" {
		tlsConf = etcdClientTLS(tlsDir)
	}
	value := make([]byte, valueSize)
	rand.Read(value)
	val64 := base64.StdEncoding.EncodeToString(value)
	return func(i int) op {
		hc := &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 1,
			DisableCompression:  true,
			TLSClientConfig:     tlsConf,
		}}
		url := strings.TrimRight(eps[i%len(eps)], "/") + "/v3/kv/put"
		put := func(ctx context.Context, seq int) error {
			key := fmt.Sprintf("bench/%03d/%06d", i, seq%keys)
			body := `{"key":"` + base64.StdEncoding.EncodeToString([]byte(key)) + `","value":"` + val64 + `"}`
			req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader([]byte(body)))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			raw, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("etcd put: %s: %s", resp.Status, bytes.TrimSpace(raw))
			}
			if !bytes.Contains(raw, []byte(`"header"`)) {
				return errors.New("etcd put: answer has no header: " + string(raw))
			}
			return nil
		}
		return func(ctx context.Context, seq int) (time.Duration, error) { return 0, put(ctx, seq) }
	}
}

// etcdClientTLS is the client side of an etcd cluster run with TLS and
// client certificates: the cluster's CA and a certificate it trusts.
func etcdClientTLS(dir string) *tls.Config {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		fatalf("-etcd-tls: %v", err)
	}
	ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		fatalf("-etcd-tls: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		fatalf("-etcd-tls: %s/ca.pem holds no certificate", dir)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
}

// staleReads counts reads of a just-created Workspace that its member had
// not applied yet (create only).
var staleReads atomic.Int64

// createClients makes client i of a create run: with the admin
// credentials of dataDir on address i mod len(addrs), or, with keysFile,
// with key i mod the keys' number on API listener i mod len(apiAddrs) (an
// application's path: bearer key, its namespace, its quota checked).
func createClients(dataDir, addrList, keysFile, apiAddrList string) func(i int) *api.Client {
	if dataDir == "" {
		fatalf("-target create needs -data-dir")
	}
	tlsConf, as := adminOf(dataDir, addrList)
	if keysFile == "" {
		return func(i int) *api.Client { return api.NewClient(as[i%len(as)], tlsConf) }
	}
	raw, err := os.ReadFile(keysFile)
	if err != nil {
		fatalf("-keys-file: %v", err)
	}
	keys, apis := strings.Fields(string(raw)), split(apiAddrList)
	if len(keys) == 0 || len(apis) == 0 {
		fatalf("-keys-file needs keys in the file and -api-addrs")
	}
	return func(i int) *api.Client {
		c, err := api.NewTokenClient("https://"+apis[i%len(apis)], keys[i%len(keys)], tlsConf.Pool)
		if err != nil {
			fatalf("client %d: %v", i, err)
		}
		return c
	}
}

// createOps: Workspace creates, each waited for until AVAILABLE. Client i
// (clientOf) does both the create (a follower forwards it to the leader)
// and the reads.
func createOps(clientOf func(i int) *api.Client, template string, cpu, memMiB int) func(int) op {
	run := make([]byte, 4)
	rand.Read(run)
	runID := fmt.Sprintf("%x", run) // command ids differ between runs on one cluster
	return func(i int) op {
		c := clientOf(i)
		return func(ctx context.Context, seq int) (time.Duration, error) {
			t0 := time.Now()
			req := api.WorkspaceCreateRequest{
				WriteMeta: api.WriteMeta{CommandID: fmt.Sprintf("bench-%s-%d-%d", runID, i, seq), Generated: true},
				Template:  template, CPU: api.Milli(cpu * 1000), MemoryBytes: uint64(memMiB) << 20,
				Labels: map[string]string{"bench": runID},
			}
			var ws api.Workspace
			if _, err := c.Do(ctx, "POST", "/v1/workspaces", req, &ws); err != nil {
				return 0, err
			}
			accepted := time.Since(t0)
			for {
				switch ws.State {
				case api.WorkspaceAvailable:
					return accepted, nil
				case api.WorkspaceFailed:
					msg := "workspace " + ws.WorkspaceID + " FAILED"
					if f := ws.Failure; f != nil {
						msg += ": " + f.Message
					}
					return 0, errors.New(msg)
				}
				// As the CLI waits: a read that blocks until the version
				// passes the one seen.
				path := fmt.Sprintf("/v1/workspaces/%s?wait_version=%d&wait=30s", ws.WorkspaceID, ws.Version)
				var got api.Workspace
				_, err := c.Do(ctx, "GET", path, nil, &got)
				if api.CodeOf(err) == api.CodeNotFound && ws.State == api.WorkspaceCreating {
					// A follower answers the forwarded create before it
					// has applied it itself: read again once it has.
					staleReads.Add(1)
					time.Sleep(2 * time.Millisecond)
					continue
				}
				if err != nil {
					return 0, err
				}
				ws = got
			}
		}
	}
}
