package e2e

// The one-host Workspace lifecycle through the real CLI: `kibotos dev`
// (a one-voter cluster whose node runs QEMU micro-VMs under a private
// systemd) and `kibo workspace ...`. One Workspace serves every check but
// the last (a template from an OCI image needs a Workspace of its own), so
// the test boots three VMs in all (create, start, the OCI Workspace).

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
	"github.com/kibotos/kibotos/vmm/guestproto"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// wsDev is one `kibotos dev` cluster on this host and the CLI pointed at it.
type wsDev struct {
	t       *testing.T
	tmp     string // test directory: binaries, logs, scratch files
	bin     string
	dir     string // the dev data directory
	addr    string // --advertise
	cache   string // shared kernel package cache
	mu      sync.Mutex
	dev     *proc // current kibotos dev process
	runs    int
	started []*exec.Cmd // every other long-running CLI process, to reap
}

func TestWorkspace(t *testing.T) {
	runtimetest.RequireVMHost(t)
	t0 := time.Now()
	tmp := t.TempDir() // registered first: removed after the cleanup below
	d := &wsDev{t: t, tmp: tmp, dir: filepath.Join(tmp, "dev"), cache: filepath.Join(os.TempDir(), "kibotos-test-platform")}
	d.bin = buildBinary(t, filepath.Join(tmp, "bin"))
	d.addr = "127.0.0.1:" + strconv.Itoa(testenv.Ports(t, 4)) // API, gossip, data plane, metrics
	t.Cleanup(d.down)
	d.up()
	inc := d.waitReady(0)
	t.Logf("dev cluster ready in %s (node incarnation %d)", time.Since(t0).Round(time.Millisecond), inc)

	ws := d.testCreate()
	if t.Failed() {
		return
	}
	steps := []struct {
		name string
		f    func(string)
	}{
		{"Exec", d.testExec},
		{"Network", d.testNetwork},
		{"Metrics", d.testMetrics},
		{"Files", d.testFiles},
		{"PTY", d.testPTY},
		{"Credentials", d.testCredentials},
		{"PortForward", d.testPortForward},
		{"StopStart", d.testStopStart},
		{"PauseResume", d.testPauseResume},
		{"Reboot", d.testReboot},
		{"NodeKill", d.testNodeKill},
		{"DataPlaneKill", d.testDataPlaneKill},
		{"Upgrade", d.testUpgrade},
		{"GuestNotResponding", d.testGuestNotResponding},
		{"StopNotPrepared", d.testStopNotPrepared},
		{"OOMKill", d.testOOMKill},
		{"ForceStopDelete", d.testForceStopDelete},
		// Last: their own Workspaces, deleted again, so no step above
		// counts their Instances.
		{"Fork", d.testFork},
		{"Warm", d.testWarm},
		{"OCITemplate", d.testOCITemplate},
	}
	for _, s := range steps {
		if !d.step(s.name, func() { s.f(ws) }) {
			return
		}
	}
	t.Logf("lifecycle done in %s", time.Since(t0).Round(time.Millisecond))
}

func (d *wsDev) env() []string {
	return append(hostprobe.CleanEnv(), "KIBOTOS_DATA_DIR="+d.dir, "KIBOTOS_PLATFORM_CACHE="+d.cache)
}

// up starts `kibotos dev` in the background, output to a log file.
func (d *wsDev) up() {
	d.t.Helper()
	d.mu.Lock()
	d.runs++
	logPath := filepath.Join(d.tmp, fmt.Sprintf("dev-%d.log", d.runs))
	d.mu.Unlock()
	f, err := os.Create(logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(d.bin, "kibotos"), "dev", "--data-dir", d.dir, "--advertise", d.addr, "--no-demo", "--warm", warmTemplate+"=1")
	cmd.Env = d.env()
	p, err := startProc(cmd, f, logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	d.mu.Lock()
	d.dev = p
	d.mu.Unlock()
}

func (d *wsDev) devProc() *proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dev
}

// wsNode is the part of `kibo node get --json` readiness depends on.
type wsNode struct {
	Status  string `json:"status"`
	Session *struct {
		Incarnation uint64 `json:"incarnation"`
		Alive       bool   `json:"alive"`
	} `json:"session"`
	Report *struct {
		DataPlaneAddress string `json:"data_plane_address"`
	} `json:"report"`
	Overcommit *struct {
		Acknowledged bool `json:"acknowledged"`
	} `json:"overcommit"`
}

// waitReady polls until node dev is READY with a live session of an
// incarnation after `after`, reported and its overcommit acknowledged
// (ctrl places nothing on it before). It returns the incarnation.
func (d *wsDev) waitReady(after uint64) uint64 {
	d.t.Helper()
	var inc uint64
	testenv.WaitFor(d.t, 3*time.Minute, "node dev READY with its overcommit acknowledged", func() (bool, string) {
		if p := d.devProc(); p.exited() {
			d.t.Fatalf("kibotos dev exited with %d before the node was ready:\n%s", p.code, tail(p.log, 30))
		}
		r := d.kibo(10*time.Second, nil, "node", "get", "dev", "--json")
		if r.code != 0 {
			return false, r.String()
		}
		var n wsNode
		if err := decodeResult(r, &n); err != nil {
			return false, err.Error()
		}
		ok := n.Status == api.NodeReady && n.Session != nil && n.Session.Alive && n.Session.Incarnation > after &&
			n.Report != nil && n.Report.DataPlaneAddress != "" && n.Overcommit != nil && n.Overcommit.Acknowledged
		if n.Session != nil {
			inc = n.Session.Incarnation
		}
		if !ok {
			return false, trimTo(r.stdout, 400)
		}
		// kibotos dev gives its pool a capacity once the node is ready.
		var p api.StoragePool
		if r := d.kibo(10*time.Second, nil, "storage-pool", "get", "dev:default", "--json"); r.code != 0 || decodeResult(r, &p) != nil || p.CapacityBytes == nil {
			return false, "storage pool dev:default without a capacity: " + trimTo(r.String(), 400)
		}
		return true, ""
	})
	return inc
}

// kibo runs the CLI with KIBOTOS_DATA_DIR set to the dev directory.
func (d *wsDev) kibo(timeout time.Duration, stdin []byte, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "kibo"), args...)
	cmd.Env = d.env()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return runResult(ctx, timeout, cmd, args)
}

// must runs the CLI and fails the test unless it exits 0.
func (d *wsDev) must(args ...string) result {
	d.t.Helper()
	r := d.kibo(time.Minute, nil, args...)
	if r.code != 0 {
		d.t.Fatalf("%s", r)
	}
	return r
}

// expect runs the CLI and fails the test unless it exits with code.
func (d *wsDev) expect(code int, args ...string) result {
	d.t.Helper()
	r := d.kibo(time.Minute, nil, args...)
	if r.code != code {
		d.t.Fatalf("want exit %d: %s", code, r)
	}
	return r
}

// wsView is `kibo workspace get --json`.
type wsView struct {
	WorkspaceID     string `json:"workspace_id"`
	State           string `json:"state"`
	NodeID          string `json:"node_id"`
	InstanceID      string `json:"instance_id"`
	Version         uint64 `json:"version"`
	StopUnconfirmed bool   `json:"stop_unconfirmed"`
	// GuestNotResponding: see api.Workspace.
	GuestNotResponding bool `json:"guest_not_responding"`
	Snapshot           *struct {
		NodeID string `json:"node_id"`
	} `json:"snapshot"`
}

func (d *wsDev) get(id string) wsView {
	d.t.Helper()
	r := d.must("workspace", "get", id, "--json")
	var w wsView
	if err := decodeResult(r, &w); err != nil {
		d.t.Fatal(err)
	}
	return w
}

var wsIDRe = regexp.MustCompile(`^ws-[a-z0-9]+\n$`)

// testCreate creates the Workspace every later step uses and checks get,
// list and their filters, the errors, and an idempotent retry.
func (d *wsDev) testCreate() string {
	t := d.t
	t.Helper()
	before := d.must("workspace", "list", "--all", "-q").stdout
	// The Workspace mounts a Volume at /data (StopStart and
	// ForceStopDelete check it).
	if r := d.must("volume", "create", "data", "--size", "64MiB"); !strings.Contains(r.stdout, "created: AVAILABLE, 64.0MiB in pool dev:default") {
		t.Fatalf("volume create: %s", r)
	}
	cmdID := "e2e-create-" + hex.EncodeToString(randBytes(t, 4))
	t0 := time.Now()
	r := d.kibo(3*time.Minute, nil, "workspace", "create", "--template", "kibotos-base", "--volume", "data:/data", "-q", "--command-id", cmdID)
	if r.code != 0 || !wsIDRe.MatchString(r.stdout) || r.stderr != "" {
		t.Fatalf("create -q must print only a Workspace id: %s (stdout %q)", r, r.stdout)
	}
	t.Logf("TIMING create (to AVAILABLE): %s", time.Since(t0).Round(time.Millisecond))
	id := strings.TrimSpace(r.stdout)

	w := d.get(id)
	if w.WorkspaceID != id || w.State != api.WorkspaceAvailable || w.NodeID != "dev" || !strings.HasPrefix(w.InstanceID, "inst-") || w.Version == 0 {
		t.Fatalf("get %s: %+v; want AVAILABLE on node dev with an instance and a version", id, w)
	}

	// The same command id again: the same Workspace, nothing new.
	r = d.must("workspace", "create", "--template", "kibotos-base", "--volume", "data:/data", "-q", "--command-id", cmdID)
	if strings.TrimSpace(r.stdout) != id {
		t.Errorf("create retried with --command-id %s: got %q, want %s", cmdID, r.stdout, id)
	}

	list := d.must("workspace", "list").stdout
	if !regexp.MustCompile(`(?m)^` + id + `\s+AVAILABLE\s+kibotos-base\s`).MatchString(list) {
		t.Errorf("workspace list lacks %s AVAILABLE:\n%s", id, list)
	}
	wide := strings.Split(strings.TrimSpace(d.must("workspace", "list", "--wide").stdout), "\n")
	header := strings.Fields(wide[0])
	col := func(name string) int {
		for i, h := range header {
			if h == name {
				return i
			}
		}
		t.Fatalf("list --wide header %v lacks %s", header, name)
		return -1
	}
	ci, cn := col("INSTANCE"), col("NODE")
	found := false
	for _, line := range wide[1:] {
		f := strings.Fields(line)
		if len(f) == len(header) && f[0] == id {
			found = true
			if f[ci] != w.InstanceID || f[cn] != "dev" {
				t.Errorf("list --wide row %q: INSTANCE %q NODE %q, want %s dev", line, f[ci], f[cn], w.InstanceID)
			}
		}
	}
	if !found {
		t.Errorf("list --wide lacks a row for %s:\n%s", id, strings.Join(wide, "\n"))
	}
	if out := d.must("workspace", "list", "--node", "dev").stdout; !strings.Contains(out, id) {
		t.Errorf("list --node dev lacks %s:\n%s", id, out)
	}
	if out := d.must("workspace", "list", "--instance", w.InstanceID, "-q").stdout; out != id+"\n" {
		t.Errorf("list --instance %s -q: %q, want %s", w.InstanceID, out, id)
	}
	d.expect(api.ExitUsage, "workspace", "list", "--node", "dev", "--state", "AVAILABLE")
	d.expect(api.ExitNotFound, "workspace", "list", "--node", "nosuch")
	if r := d.expect(api.ExitNotFound, "workspace", "get", "ws-nosuch"); !strings.Contains(r.stderr, "ws-nosuch") {
		t.Errorf("get ws-nosuch: the message does not name it: %s", r)
	}
	d.expect(api.ExitInvalidArgument, "workspace", "create", "--template", "NoSuch!")
	d.expect(api.ExitNotFound, "workspace", "create", "--template", "kibotos-base", "--node", "nosuch")
	after := d.must("workspace", "list", "--all", "-q").stdout
	if after != before+id+"\n" {
		t.Errorf("list --all -q: %q before, %q after; want only %s added (failed creates leave nothing)", before, after, id)
	}
	return id
}

func randBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// testExec: exit codes, separate stdout and stderr, signals, binary
// stdio; fetching with wget and nc.
func (d *wsDev) testExec(id string) {
	t := d.t
	t0 := time.Now()
	r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
	t.Logf("TIMING first exec: %s", time.Since(t0).Round(time.Millisecond))
	if r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exec exit 7: want code 7, stdout %q, stderr %q; got %s (stdout %q stderr %q)", "out\n", "err\n", r, r.stdout, r.stderr)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "kill -TERM $$"); r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("exec of a process killed by SIGTERM: want exit 143, got %s", r)
	}
	// A command that does not start exits as a shell says: 127 not
	// found, 126 cannot run (here: its working directory is missing).
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "no-such-command"); r.code != 127 || !strings.Contains(r.stderr, "workspace "+id+": no-such-command: command not found in PATH ") {
		t.Errorf("exec of a missing command: want exit 127 and the PATH searched: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-w", "/no-such-dir", id, "--", "pwd"); r.code != 126 || !strings.Contains(r.stderr, "workspace "+id+": working directory /no-such-dir: no such directory") {
		t.Errorf("exec in a missing working directory: want exit 126 naming it: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-e", "KIBOTOS_E2E_UNSET", id, "--", "true"); r.code != 2 || !strings.Contains(r.stderr, "-e KIBOTOS_E2E_UNSET: KIBOTOS_E2E_UNSET is not set here") {
		t.Errorf("exec -e of a variable not set: want exit 2: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", "-e", "KIBOTOS_DATA_DIR", id, "--", "sh", "-c", `echo "$KIBOTOS_DATA_DIR"`); r.code != 0 || r.stdout != d.dir+"\n" {
		t.Errorf("exec -e KEY passes kibo's value: %s (stdout %q)", r, r.stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "test -c /dev/null && test -r /proc/self/stat"); r.code != 0 {
		t.Errorf("the Workspace lacks /dev or /proc: %s", r)
	}
	// A template without an image config (not built from an OCI image):
	// the node's defaults, root, the top of the root.
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", `echo "$LANG $HOME $(id -u) $(pwd)"`); r.code != 0 || r.stdout != "C.UTF-8 /root 0 /\n" {
		t.Errorf("exec defaults without an image config: %s (stdout %q), want \"C.UTF-8 /root 0 /\"", r, r.stdout)
	}
	in := randBytes(t, 1<<20)
	t0 = time.Now()
	r = d.kibo(time.Minute, in, "workspace", "exec", id, "--", "cat")
	if r.code != 0 || r.stdout != string(in) {
		t.Errorf("1 MiB of random bytes through cat: exit %d, %d bytes back, equal %v: %s", r.code, len(r.stdout), r.stdout == string(in), trimTo(r.stderr, 300))
	}
	t.Logf("TIMING 1 MiB through exec cat: %s", time.Since(t0).Round(time.Millisecond))

	// A server started with nohup in the background outlives its exec,
	// as under docker exec or ssh (the busybox template has a nohup of
	// its own): the loop still writes once the exec that started it
	// ended.
	d.must("workspace", "exec", id, "--", "sh", "-c", `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/alive.new; mv -f /tmp/alive.new /tmp/alive; sleep 0.2; done' >/dev/null 2>&1 & echo $! > /tmp/alive.pid`)
	var seen string
	testenv.WaitFor(t, 30*time.Second, "the nohup loop to go on after its exec ended", func() (bool, string) {
		now := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "cat", "/tmp/alive").stdout
		if seen == "" || now == seen {
			seen = now
			return false, "count " + strings.TrimSpace(now)
		}
		return true, ""
	})
	d.must("workspace", "exec", id, "--", "sh", "-c", "kill $(cat /tmp/alive.pid)")

	// A new user's first move is to fetch something: wget -T (which
	// crashes busybox's wget), run directly and from sh, and nc; and
	// /etc/resolv.conf is the guest agent's.
	d.must("workspace", "exec", id, "--", "sh", "-c", "mkdir -p /tmp/www && echo fetched > /tmp/www/index.html && httpd -p 127.0.0.1:8081 -h /tmp/www")
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "wget", "-T", "5", "-q", "-O-", "http://127.0.0.1:8081/"); r.code != 0 || r.stdout != "fetched\n" {
		t.Errorf("exec wget -T 5 of the Workspace's own server: %s (stdout %q)", r, r.stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "wget -T 5 -q -O- http://localhost:8081/"); r.code != 0 || r.stdout != "fetched\n" {
		t.Errorf("sh -c 'wget -T 5' of localhost: %s (stdout %q)", r, r.stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 localhost 8081"); r.code != 0 || !strings.Contains(r.stdout, "fetched") {
		t.Errorf("nc localhost 8081: %s (stdout %q)", r, r.stdout)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "grep", "-c", " /etc/resolv.conf ", "/proc/self/mounts"); r.code != 0 || r.stdout != "1\n" {
		t.Errorf("/etc/resolv.conf of the Workspace is not the guest agent's bind mount: %s (stdout %q)", r, r.stdout)
	}
}

// testNetwork: the Workspace's policy through the CLI (none by default,
// changed to public on the running Workspace by the node) and, whatever
// the policy, the dev host's own addresses are out of the guest's reach.
func (d *wsDev) testNetwork(id string) {
	t := d.t
	var w struct {
		Network struct {
			Egress string `json:"egress"`
		} `json:"network"`
	}
	policy := func() string {
		t.Helper()
		if err := decodeResult(d.must("workspace", "get", id, "--json"), &w); err != nil {
			t.Fatal(err)
		}
		return w.Network.Egress
	}
	if got := policy(); got != "none" {
		t.Errorf("default egress %q, want none", got)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/etc/resolv.conf"); r.stdout != "nameserver 169.254.100.1\n" {
		t.Errorf("Workspace resolv.conf %q; want the namespace's address (DNATed to the deployment resolver)", r.stdout)
	}
	// A server on the dev host's own (non-loopback) address.
	hostAddr := hostIPv4(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(hostAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the host\n") }))
	url := "http://" + ln.Addr().String() + "/"
	unreachable := func(when string) {
		t.Helper()
		if r := d.kibo(time.Minute, nil, "workspace", "exec", id, "--", "wget", "-T", "3", "-t", "1", "-q", "-O-", url); r.code == 0 {
			t.Errorf("%s: the guest fetched %s from the host's own address: %q", when, url, r.stdout)
		}
	}
	unreachable("egress none")
	d.must("workspace", "set-network", id, "--egress", "public")
	if got := policy(); got != "public" {
		t.Errorf("egress after set-network %q, want public", got)
	}
	unreachable("egress public")
	// The dropped connects are counted, and get shows the node's count.
	testenv.WaitFor(t, time.Minute, "denied packets in workspace get", func() (bool, string) {
		var w struct {
			Denied *api.DeniedReport `json:"denied"`
		}
		if err := decodeResult(d.must("workspace", "get", id, "--json"), &w); err != nil {
			t.Fatal(err)
		}
		return w.Denied != nil && w.Denied.Packets > 0, fmt.Sprintf("denied %+v", w.Denied)
	})
	if out := d.must("workspace", "get", id).stdout; !regexp.MustCompile(`(?m)^Denied packets: +[1-9][0-9]* \(reported `).MatchString(out) {
		t.Errorf("workspace get does not show the denied packets:\n%s", out)
	}
	d.must("workspace", "set-network", id, "--egress", "none")
}

// testMetrics scrapes the dev member as Prometheus would, on its loopback
// listener (port+3) and on the API port with the admin certificate, and
// checks the figures against what the CLI shows: one running Instance,
// the Workspace AVAILABLE, this member the Raft leader.
func (d *wsDev) testMetrics(id string) {
	t := d.t
	families := d.scrape()
	value := func(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
		t.Helper()
		return metricValue(t, fams, name, labels...)
	}
	if v := value(families, "kibotos_node_instances", "state", "running"); v != 1 {
		t.Errorf("kibotos_node_instances{state=running} = %v, want 1 (the Workspace's Instance)", v)
	}
	if v := value(families, "kibotos_node_instances", "state", "stopped"); v != 0 {
		t.Errorf("kibotos_node_instances{state=stopped} = %v", v)
	}
	if v := value(families, "kibotos_workspaces", "state", "available"); v < 1 {
		t.Errorf("kibotos_workspaces{state=available} = %v, want at least 1", v)
	}
	if v := value(families, "kibotos_nodes", "status", "ready"); v != 1 {
		t.Errorf("kibotos_nodes{status=ready} = %v, want 1", v)
	}
	// kibotos dev gave its pool its file system's size; the Workspace's
	// layer is charged its template's image size.
	if v := value(families, "kibotos_storage_pool_capacity_bytes", "pool", "dev:default"); v < 1<<30 {
		t.Errorf("kibotos_storage_pool_capacity_bytes{pool=dev:default} = %v", v)
	}
	if v := value(families, "kibotos_storage_pool_used_bytes", "pool", "dev:default"); v < 1<<20 {
		t.Errorf("kibotos_storage_pool_used_bytes{pool=dev:default} = %v, want the layer's template size", v)
	}
	if v := value(families, "kibotos_raft_leader"); v != 1 {
		t.Errorf("kibotos_raft_leader = %v on the one voter", v)
	}
	// The execs so far went through the data plane.
	if v := value(families, "kibotos_node_dataplane_connections_total"); v < 1 {
		t.Errorf("kibotos_node_dataplane_connections_total = %v after the execs", v)
	}
	if v := value(families, "kibotos_node_dataplane_bytes_total", "direction", "out"); v < 1 {
		t.Errorf("kibotos_node_dataplane_bytes_total{direction=out} = %v after the execs", v)
	}
	if v := value(families, "kibotos_control_sessions"); v != 1 {
		t.Errorf("kibotos_control_sessions = %v, want the dev node's one", v)
	}
	if v := value(families, "kibotos_node_host", "item", "memory_total_bytes"); v <= 0 {
		t.Errorf("kibotos_node_host{item=memory_total_bytes} = %v", v)
	}
	// The node's step histograms: one boot (the Workspace's start), one
	// takeover (the runtime's open).
	for _, step := range []string{"boot", "takeover"} {
		n := uint64(0)
		if f := families["kibotos_node_step_seconds"]; f != nil {
			for _, m := range f.Metric {
				for _, l := range m.Label {
					if l.GetName() == "step" && l.GetValue() == step {
						n = m.Histogram.GetSampleCount()
					}
				}
			}
		}
		if n < 1 {
			t.Errorf("kibotos_node_step_seconds{step=%s} has %d samples, want at least 1", step, n)
		}
	}
	// What raft measures itself: the leader's commit time, a summary.
	if f := families["kibotos_raft_commitTime"]; f == nil || len(f.Metric) == 0 || f.Metric[0].Summary.GetSampleCount() == 0 {
		t.Errorf("no raft commit time in the scrape: %v", f)
	}
	var w api.Workspace
	if err := decodeResult(d.must("workspace", "get", id, "--json", "--wide"), &w); err != nil {
		t.Fatal(err)
	}
	// The denied packets of testNetwork, per Instance, never below what
	// ctrl was told.
	if v := value(families, "kibotos_node_guest_denied_packets_total", "instance_id", w.InstanceID); w.Denied != nil && v < float64(w.Denied.Packets) {
		t.Errorf("denied packets of %s: metrics %v, workspace get %d", w.InstanceID, v, w.Denied.Packets)
	}

	// The API port: an admin certificate only.
	dir := datadir.Dir(d.dir)
	tlsConf, err := dir.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	ident, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	want := trust.Want{Kind: trust.KindMember, NodeID: ident.NodeID}
	c := &http.Client{Transport: tlsConf.HTTPTransport(want, 10*time.Second), Timeout: 30 * time.Second}
	resp, err := c.Get("https://" + d.addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape the API port: %v", err)
	}
	if v := value(parseMetrics(t, resp), "kibotos_node_instances", "state", "running"); v != 1 {
		t.Errorf("API port: kibotos_node_instances{state=running} = %v", v)
	}
	anonymous := trust.Client{Pool: tlsConf.Pool, Cert: func() *tls.Certificate { return &tls.Certificate{} }}
	plain := &http.Client{Transport: anonymous.HTTPTransport(want, 10*time.Second), Timeout: 30 * time.Second}
	if resp, err := plain.Get("https://" + d.addr + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("the API port served /metrics without a client certificate")
		}
	}
}

// scrape reads the dev member's metrics listener (port+3).
func (d *wsDev) scrape() map[string]*dto.MetricFamily {
	t := d.t
	t.Helper()
	_, port, _ := net.SplitHostPort(d.addr)
	p, _ := strconv.Atoi(port)
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(p+3) + "/metrics")
	if err != nil {
		t.Fatalf("scrape the metrics listener: %v", err)
	}
	return parseMetrics(t, resp)
}

// metricValue is the value of the gauge or counter name whose labels
// include the given name/value pairs.
func metricValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s in the scrape", name)
	}
metric:
	for _, m := range f.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue metric
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
	}
	t.Fatalf("no %s%v in the scrape", name, labels)
	return 0
}

// parseMetrics reads one scrape in the text exposition format.
func parseMetrics(t *testing.T, resp *http.Response) map[string]*dto.MetricFamily {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape is not in the exposition format: %v", err)
	}
	return fams
}

// hostIPv4 is an IPv4 address of this host that is not loopback.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Fatal("this host has no IPv4 address besides loopback")
	return ""
}

// testFiles: cp of 100 MiB in and out, and of a missing file.
func (d *wsDev) testFiles(id string) {
	t := d.t
	const size = 100 << 20
	local := filepath.Join(d.tmp, "big.in")
	data := randBytes(t, size)
	if err := os.WriteFile(local, data, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	data = nil

	t0 := time.Now()
	r := d.kibo(3*time.Minute, nil, "workspace", "cp", local, id+":/root/big")
	up := time.Since(t0)
	if r.code != 0 {
		t.Fatalf("cp in: %s", r)
	}
	if r := d.must("workspace", "exec", id, "--", "sha256sum", "/root/big"); !strings.HasPrefix(r.stdout, want+" ") {
		t.Errorf("sha256sum of the copied file in the Workspace: %q, want %s", r.stdout, want)
	}
	back := filepath.Join(d.tmp, "big.out")
	t0 = time.Now()
	r = d.kibo(3*time.Minute, nil, "workspace", "cp", id+":/root/big", back)
	down := time.Since(t0)
	if r.code != 0 {
		t.Fatalf("cp out: %s", r)
	}
	if note := fmt.Sprintf("%s:/root/big: %d bytes written to %s", id, size, back); !strings.Contains(r.stderr, note) {
		t.Errorf("cp out said %q; want %q", r.stderr, note)
	}
	if got := wsFileSHA256(t, back); got != want {
		t.Errorf("cp in and back out: sha256 %s, want %s", got, want)
	}
	mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	t.Logf("TIMING cp 100 MiB: in %s (%.1f MB/s), out %s (%.1f MB/s)", up.Round(time.Millisecond), mbps(up), down.Round(time.Millisecond), mbps(down))
	os.Remove(local)
	os.Remove(back)
	d.must("workspace", "exec", id, "--", "rm", "/root/big")

	missing := filepath.Join(d.tmp, "missing.out")
	r = d.kibo(time.Minute, nil, "workspace", "cp", id+":/root/nosuch", missing)
	if r.code != api.ExitNotFound || !strings.Contains(r.stderr, id+": /root/nosuch: no such file") {
		t.Errorf("cp of a missing file: want exit 12 and a message naming it: %s", r)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cp of a missing file left %s behind (%v)", missing, err)
	}

	// Into a directory that is not there: said in the Workspace's terms,
	// before anything is sent. Onto a directory: into it, as cp(1) does.
	// Out of a directory: refused with the way to do it.
	small := filepath.Join(d.tmp, "small.txt")
	os.WriteFile(small, []byte("small\n"), 0o600)
	r = d.kibo(time.Minute, nil, "workspace", "cp", small, id+":/nosuchdir/x")
	if r.code != api.ExitNotFound || !strings.Contains(r.stderr, "directory /nosuchdir does not exist: make it first (kibo workspace exec "+id+" -- mkdir -p /nosuchdir)") {
		t.Errorf("cp into a missing directory: want exit 12 naming it: %s", r)
	}
	if r := d.kibo(time.Minute, nil, "workspace", "cp", small, id+":/root"); r.code != 0 || !strings.Contains(r.stderr, id+":/root/small.txt") {
		t.Errorf("cp onto a directory: want it written in it: %s", r)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/small.txt"); r.stdout != "small\n" {
		t.Errorf("the file copied onto /root: %q", r.stdout)
	}
	r = d.kibo(time.Minute, nil, "workspace", "cp", id+":/root", filepath.Join(d.tmp, "rootdir"))
	if r.code != 2 || !strings.Contains(r.stderr, id+":/root is a directory; copy files one at a time (or tar them: kibo workspace exec "+id+" -- tar c -C /root . > dir.tar)") {
		t.Errorf("cp of a directory out: want exit 2 and the way to do it: %s", r)
	}
	d.must("workspace", "exec", id, "--", "rm", "/root/small.txt")
}

func wsFileSHA256(t *testing.T, path string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// lockedBuf collects a PTY's output for polling.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// credential asks ctrl for a data-plane credential for the Workspace, as
// the CLI does, and returns it with the cluster CA to check the node by.
func (d *wsDev) credential(ctx context.Context, id string) (api.DataPlaneCredential, *x509.CertPool) {
	t := d.t
	t.Helper()
	dir := datadir.Dir(d.dir)
	ident, err := dir.LoadIdentity()
	if err != nil {
		t.Fatal(err)
	}
	tlsConf, err := dir.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	roots, err := dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	var cred api.DataPlaneCredential
	if _, err := api.NewClient(ident.Advertise, tlsConf).Do(ctx, "POST", "/v1/workspaces/"+id+"/credentials", struct{}{}, &cred); err != nil {
		t.Fatalf("credential: %v", err)
	}
	return cred, roots
}

// testCredentials: the node's data plane refuses a credential signed by
// another key, one past its expiry and one naming another Workspace, and
// still accepts a good one; each refusal carries its code.
func (d *wsDev) testCredentials(id string) {
	t := d.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	good, roots := d.credential(ctx, id)
	caKey, err := os.ReadFile(datadir.Dir(d.dir).CAKey())
	if err != nil {
		t.Fatal(err)
	}
	ctrlKey, err := credential.KeyFromCA(caKey)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	valid := credential.Claims{WorkspaceID: good.WorkspaceID, InstanceID: good.InstanceID, NodeID: good.NodeID, IssuedAt: now, ExpiresAt: now.Add(time.Minute)}
	expired := valid
	expired.IssuedAt, expired.ExpiresAt = now.Add(-time.Hour), now.Add(-time.Minute)
	other := valid
	other.WorkspaceID = "ws-someoneelse"
	for _, c := range []struct {
		name, code string
		key        ed25519.PrivateKey
		claims     credential.Claims
	}{
		{"forged", dataplane.CodeForged, otherKey, valid},
		{"expired", dataplane.CodeExpired, ctrlKey, expired},
		{"wrong workspace", dataplane.CodeNoTarget, ctrlKey, other},
	} {
		tok, err := credential.Sign(c.key, c.claims)
		if err != nil {
			t.Fatal(err)
		}
		cred := good
		cred.Credential = tok
		cl, err := dataplane.Connect(ctx, cred, roots)
		var re *dataplane.RefusedError
		if err == nil {
			cl.Close()
			t.Errorf("%s credential accepted", c.name)
		} else if !errors.As(err, &re) || re.Code != c.code {
			t.Errorf("%s credential: %v, want a refusal with code %s", c.name, err, c.code)
		}
	}
	cl, err := dataplane.Connect(ctx, good, roots)
	if err != nil {
		t.Fatalf("the credential from ctrl: %v", err)
	}
	cl.Close()
}

// testDataPlaneKill: when the data-plane process dies, the node starts a
// new generation within seconds and exec works again.
func (d *wsDev) testDataPlaneKill(id string) {
	t := d.t
	// Where the process-model documentation puts it: dataplane/ in the
	// node's socket directory, mode 0700, and nothing in the state
	// directory.
	sockDir := member.DataPlaneSocketDir(datadir.Dir(d.dir), true)
	if st, err := os.Stat(sockDir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("data-plane socket directory %s: %v, %v; want mode 0700", sockDir, st, err)
	}
	if _, err := os.Stat(filepath.Join(datadir.Dir(d.dir).NodeDir(), "dataplane")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the node's state directory has a data-plane directory: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(sockDir, "generation"))
	if err != nil {
		t.Fatal(err)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The unit's main PID as the host sees it, from the dev cluster's own
	// private systemd (its PID namespace numbers differ): never by name.
	sd, err := privsd.Attach(ctx, filepath.Join(datadir.Dir(d.dir).NodeDir(), "systemd"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := units.Connect(ctx, sd.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	u, err := m.Get(ctx, dataplane.UnitName(member.NodeScope(datadir.Dir(d.dir)), gen))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := m.MainHostPID(u)
	if err != nil || pid <= 1 {
		t.Fatalf("host pid of %s: %d, %v", u.Name, pid, err)
	}
	counted := func() (conns, out float64) {
		fams := d.scrape()
		return metricValue(t, fams, "kibotos_node_dataplane_connections_total"), metricValue(t, fams, "kibotos_node_dataplane_bytes_total", "direction", "out")
	}
	connsBefore, outBefore := counted()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill data-plane pid %d: %v", pid, err)
	}
	testenv.WaitFor(t, 15*time.Second, "exec to work again after the data-plane process was killed", func() (bool, string) {
		r := d.kibo(30*time.Second, nil, "workspace", "exec", id, "--", "echo", "back")
		return r.code == 0 && r.stdout == "back\n", r.String()
	})
	if now, _ := os.ReadFile(filepath.Join(sockDir, "generation")); strings.TrimSpace(string(now)) == strings.TrimSpace(string(raw)) {
		t.Errorf("exec works but the data-plane generation is still %s", raw)
	}
	// The killed process's counts still count: nothing went down.
	if conns, out := counted(); conns <= connsBefore || out < outBefore {
		t.Errorf("data-plane counters after the kill: connections %v (before %v), bytes out %v (before %v); want them never lower", conns, connsBefore, out, outBefore)
	}
}

// testPTY opens the data plane as the CLI does (a credential from ctrl,
// the cluster CA) and runs a shell in a PTY: its size at start and after
// a resize.
func (d *wsDev) testPTY(id string) {
	t := d.t
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cred, roots := d.credential(ctx, id)
	c, err := dataplane.Connect(ctx, cred, roots)
	if err != nil {
		t.Fatalf("dataplane.Connect: %v", err)
	}
	defer c.Close()

	// One command with a PTY of a given size.
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"stty", "size"}, Root: agent.WorkspaceRoot,
		Env: []string{"PATH=/usr/bin:/bin", "TERM=xterm"}, PTY: &guestproto.WinSize{Rows: 33, Cols: 101}})
	if err != nil {
		t.Fatalf("exec stty size: %v", err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if ex, err := p.Wait(); err != nil || ex.ExitCode != 0 || strings.TrimSpace(string(out)) != "33 101" {
		t.Errorf("stty size in a 33x101 PTY: %q, exit %+v, err %v", out, ex, err)
	}

	// A shell: its size, a resize, its size again.
	sh, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sh"}, Root: agent.WorkspaceRoot, Stdin: true,
		Env: []string{"PATH=/usr/bin:/bin", "TERM=xterm"}, PTY: &guestproto.WinSize{Rows: 33, Cols: 101}})
	if err != nil {
		t.Fatalf("exec sh: %v", err)
	}
	var buf lockedBuf
	copied := make(chan struct{})
	go func() { io.Copy(&buf, sh.Stdout); close(copied) }()
	sizeRe := func(rows, cols int) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`(?m)^%d %d\r?$`, rows, cols))
	}
	io.WriteString(sh.Stdin, "stty size\n")
	testenv.WaitFor(t, 20*time.Second, "33 101 from stty size in the shell", func() (bool, string) {
		return sizeRe(33, 101).MatchString(buf.String()), fmt.Sprintf("%q", buf.String())
	})
	if err := sh.Resize(40, 120); err != nil {
		t.Fatalf("resize: %v", err)
	}
	// The resize travels beside stdin, not in it: ask until the shell's
	// terminal has the new size.
	asked := time.Time{}
	testenv.WaitFor(t, 20*time.Second, "40 120 from stty size after the resize", func() (bool, string) {
		if time.Since(asked) > 2*time.Second {
			io.WriteString(sh.Stdin, "stty size\n")
			asked = time.Now()
		}
		return sizeRe(40, 120).MatchString(buf.String()), fmt.Sprintf("%q", buf.String())
	})
	io.WriteString(sh.Stdin, "exit 3\n")
	ex, err := sh.Wait()
	<-copied
	if err != nil || ex.ExitCode != 3 {
		t.Errorf("shell in a PTY: exit %+v, err %v; output %q", ex, err, buf.String())
	}
}

// testPortForward forwards a local port to a busybox nc echo server in
// the Workspace.
func (d *wsDev) testPortForward(id string) {
	t := d.t
	d.must("workspace", "exec", id, "--", "sh", "-c", "nc -l -p 8000 -e /bin/cat </dev/null >/dev/null 2>&1 &")
	cmd := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "port-forward", id, "0:8000")
	cmd.Env = d.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(cmd)
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	fwdRe := regexp.MustCompile(`^Forwarding (127\.0\.0\.1:\d+) -> ` + id + `:8000`)
	var local string
	var seen []string
	timeout := time.After(30 * time.Second)
	for local == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				t.Fatalf("port-forward ended (%v) before it listened: %q", cmd.ProcessState, seen)
			}
			seen = append(seen, l)
			if m := fwdRe.FindStringSubmatch(l); m != nil {
				local = m[1]
			}
		case <-timeout:
			t.Fatalf("port-forward printed no Forwarding line in 30s: %q", seen)
		}
	}
	go func() {
		for l := range lines {
			t.Logf("port-forward: %s", l)
		}
	}()
	payload := randBytes(t, 256<<10)
	var got []byte
	// The nc in the guest may need a moment to listen: a refused first
	// connection shows as an immediate EOF, so retry on an empty answer.
	testenv.WaitFor(t, 20*time.Second, "an answer through the forwarded port "+local, func() (bool, string) {
		conn, err := net.DialTimeout("tcp", local, 5*time.Second)
		if err != nil {
			t.Fatalf("connect to the forwarded port %s: %v", local, err)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		werr := make(chan error, 1)
		go func() {
			_, err := conn.Write(payload)
			conn.(*net.TCPConn).CloseWrite()
			werr <- err
		}()
		got, err = io.ReadAll(conn)
		conn.Close()
		<-werr
		if len(got) > 0 && err != nil {
			t.Errorf("read from the forwarded port: %v", err)
		}
		return len(got) > 0, fmt.Sprintf("empty answer (read: %v)", err)
	})
	if !bytes.Equal(got, payload) {
		t.Errorf("port-forward echo: sent %d bytes, got %d back, equal %v", len(payload), len(got), bytes.Equal(got, payload))
	}
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("port-forward after Ctrl-C: %v (want exit 0)", err)
	}
}

func (d *wsDev) track(cmd *exec.Cmd) {
	d.mu.Lock()
	d.started = append(d.started, cmd)
	d.mu.Unlock()
}

// testStopStart: a stop keeps the writable layer; a start is a new Instance.
func (d *wsDev) testStopStart(id string) {
	t := d.t
	before := d.get(id)
	var marker string
	var follow *logFollower
	d.step("LogsLive", func() { marker, follow = d.testLogsLive(id, before.InstanceID) })
	d.must("workspace", "exec", id, "--", "sh", "-c", "echo kept > /root/f; echo on-volume > /data/f; sync")
	t0 := time.Now()
	d.must("workspace", "stop", id)
	// Grown while stopped: the guest grows the filesystem when it mounts it.
	d.must("volume", "resize", "data", "--size", "128MiB")
	t.Logf("TIMING stop: %s", time.Since(t0).Round(time.Millisecond))
	if w := d.get(id); w.State != api.WorkspaceStopped || w.InstanceID != "" {
		t.Errorf("after stop: %+v, want STOPPED without an instance", w)
	}
	if out := d.must("workspace", "list").stdout; strings.Contains(out, id) {
		t.Errorf("list without --all shows the STOPPED %s:\n%s", id, out)
	}
	if out := d.must("workspace", "list", "--all").stdout; !regexp.MustCompile(`(?m)^` + id + `\s+STOPPED\s`).MatchString(out) {
		t.Errorf("list --all lacks %s STOPPED:\n%s", id, out)
	}
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "exec", id, "--", "true"); !strings.Contains(r.stderr, "STOPPED") || !strings.Contains(r.stderr, "workspace start "+id) {
		t.Errorf("exec on a STOPPED Workspace must say to start it: %s", r)
	}
	t0 = time.Now()
	d.must("workspace", "start", id)
	t.Logf("TIMING start (to AVAILABLE): %s", time.Since(t0).Round(time.Millisecond))
	after := d.get(id)
	if after.State != api.WorkspaceAvailable || after.NodeID != "dev" || after.InstanceID == "" || after.InstanceID == before.InstanceID {
		t.Errorf("after start: %+v; want AVAILABLE on dev with a new instance (was %s)", after, before.InstanceID)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/f", "/data/f"); r.stdout != "kept\non-volume\n" {
		t.Errorf("the files written before the stop: %q, want %q", r.stdout, "kept\non-volume\n")
	}
	if kib := dfKiB(t, d.must("workspace", "exec", id, "--", "df", "-k", "/data").stdout); kib < 100<<10 {
		t.Errorf("df -k /data after the Volume grew to 128MiB while stopped: %d KiB", kib)
	}
	if marker != "" {
		d.step("LogsEnded", func() { d.testLogsEnded(id, before.InstanceID, marker, follow) })
	}
}

// step runs f as a subtest of d.t, with d.t its t meanwhile.
func (d *wsDev) step(name string, f func()) bool {
	return d.t.Run(name, func(t *testing.T) {
		old := d.t
		d.t = t
		defer func() { d.t = old }()
		f()
	})
}

// machineLogView is `kibo workspace logs --json`.
type machineLogView struct {
	InstanceID string `json:"instance_id"`
	NodeID     string `json:"node_id"`
	Live       bool   `json:"live"`
	Console    string `json:"console"`
	VMM        string `json:"vmm"`
}

// logFollower is a `kibo workspace logs --follow` running meanwhile.
type logFollower struct {
	cmd            *exec.Cmd
	stdout, stderr lockedBuf
}

// testLogsLive: `kibo workspace logs` shows the running guest's console,
// from its boot (the guest agent's first session) to a line written to
// /dev/console now, bounded by --tail; --follow prints that line as it
// comes. It returns the line and the follower, still running.
func (d *wsDev) testLogsLive(id, inst string) (string, *logFollower) {
	t := d.t
	marker := "kibotos-logs-marker-" + inst
	f := &logFollower{cmd: exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "logs", id, "--follow", "--tail", "1")}
	f.cmd.Env = d.env()
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	f.cmd.Stdout, f.cmd.Stderr = &f.stdout, &f.stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(f.cmd)
	// It has read the console once (printed its last line) before the
	// line is written, so the line comes through the follow reads.
	testenv.WaitFor(t, 30*time.Second, "kibo workspace logs --follow printing the last line", func() (bool, string) {
		return strings.Count(f.stdout.String(), "\n") >= 1, f.stderr.String()
	})
	d.must("workspace", "exec", id, "--", "sh", "-c", "echo "+marker+" > /dev/console")
	var r result
	testenv.WaitFor(t, 30*time.Second, "the console line in kibo workspace logs", func() (bool, string) {
		r = d.kibo(time.Minute, nil, "workspace", "logs", id)
		return r.code == 0 && strings.Contains(r.stdout, marker), trimTo(r.String(), 600)
	})
	if !strings.Contains(r.stdout, "guest agent session started") {
		t.Errorf("workspace logs lacks the guest's boot output (guest agent session started):\n%s", trimTo(r.stdout, 2000))
	}
	if r := d.must("workspace", "logs", id, "--tail", "1"); strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stderr, "not shown") {
		t.Errorf("--tail 1: want one line and a note of what was cut: %s", r)
	}
	var l machineLogView
	if err := decodeResult(d.must("workspace", "logs", id, "--json"), &l); err != nil {
		t.Fatal(err)
	}
	if !l.Live || l.InstanceID != inst || l.NodeID != "dev" || !strings.Contains(l.Console, marker) {
		t.Errorf("--json: live %v instance %s node %s, console with the line %v; want live, %s, dev",
			l.Live, l.InstanceID, l.NodeID, strings.Contains(l.Console, marker), inst)
	}
	if r := d.expect(api.ExitNotFound, "workspace", "logs", id, "--instance", "inst-aaaaaaaaaaaaaaaaaaaaaaaaaa"); !strings.Contains(r.stderr, "has no instance") {
		t.Errorf("an Instance of no Workspace: %s", r)
	}
	if r := d.expect(api.ExitInvalidArgument, "workspace", "logs", id, "--instance", "../../../etc"); !strings.Contains(r.stderr, "not an Instance id") {
		t.Errorf("a path as the Instance: %s", r)
	}
	testenv.WaitFor(t, 30*time.Second, "the console line from kibo workspace logs --follow", func() (bool, string) {
		return strings.Contains(f.stdout.String(), marker), trimTo(f.stdout.String()+f.stderr.String(), 600)
	})
	return marker, f
}

// testLogsEnded: the follower of the stopped Instance ended by itself;
// after a stop and start, --instance shows the ended Instance's console
// tail the node kept, and the default is the new one.
func (d *wsDev) testLogsEnded(id, ended, marker string, f *logFollower) {
	t := d.t
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(f.stderr.String(), "instance "+ended+" no longer runs") {
			t.Errorf("kibo workspace logs --follow after the stop: %v, stderr %q; want exit 0 saying the Instance no longer runs", err, f.stderr.String())
		}
	case <-time.After(30 * time.Second):
		f.cmd.Process.Kill()
		<-done
		t.Errorf("kibo workspace logs --follow still runs 30 s after its Instance stopped; stderr %q", f.stderr.String())
	}
	r := d.must("workspace", "logs", id, "--instance", ended)
	if !strings.Contains(r.stdout, marker) || !strings.Contains(r.stderr, "instance "+ended+" has ended") {
		t.Errorf("--instance %s (ended): want its console with %q and a note that it ended: %s", ended, marker, trimTo(r.String(), 2000))
	}
	// The VMM's unit appended how it ended to its log.
	if r := d.must("workspace", "logs", id, "--instance", ended, "--vmm"); !strings.Contains(r.stdout, "kibotos: vmm exited") {
		t.Errorf("--instance %s --vmm: want the VMM log's last line: %s", ended, trimTo(r.String(), 2000))
	}
	testenv.WaitFor(t, 30*time.Second, "the new Instance's boot in kibo workspace logs", func() (bool, string) {
		r = d.kibo(time.Minute, nil, "workspace", "logs", id)
		return r.code == 0 && strings.Contains(r.stdout, "guest agent session started"), trimTo(r.String(), 600)
	})
	if strings.Contains(r.stdout, marker) || r.stderr != "" {
		t.Errorf("the new Instance's log shows the ended one's line, or a note: %s", trimTo(r.String(), 2000))
	}
}

// dfKiB is the size in KiB df -k reports for the one filesystem it was
// asked about.
func dfKiB(t *testing.T, out string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if f := strings.Fields(lines[len(lines)-1]); len(f) >= 2 {
		if n, err := strconv.Atoi(f[1]); err == nil {
			return n
		}
	}
	t.Fatalf("df -k: %q", out)
	return 0
}

// testPauseResume pauses the Workspace with a process counting in it and
// an exec streaming: the exec ends with an error, the node's CPU and
// memory are free, exec is refused while PAUSED; resumed, the same process
// counts on from where it was, its open file and the Volume's mount are
// there, the guest's clock is right.
func (d *wsDev) testPauseResume(id string) {
	t := d.t
	// The count is renamed into place: a read between the shell's
	// truncate and its write would find the file empty.
	d.must("workspace", "exec", id, "--", "sh", "-c", "(i=0; exec 3>/tmp/held; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv -f /tmp/count.new /tmp/count; echo $i >&3; sleep 0.1; done) >/dev/null 2>&1 & echo $! > /tmp/counter.pid")
	pid := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/counter.pid").stdout)
	stream := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "exec", id, "--", "sh", "-c", "while :; do echo tick; sleep 0.2; done")
	stream.Env = d.env()
	stream.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var streamErr lockedBuf
	stream.Stderr = &streamErr
	out, err := stream.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(stream)
	bufio.NewReader(out).ReadString('\n') // the stream runs
	go io.Copy(io.Discard, out)

	// Where the counter was just before the pause: under TCG on a busy
	// machine it may have counted only once or twice by now, so "counts
	// on" is measured from here, not from a fixed number.
	before, err := strconv.Atoi(strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/count").stdout))
	if err != nil {
		t.Fatalf("the counter before the pause: %v", err)
	}
	t0 := time.Now()
	d.must("workspace", "pause", id)
	t.Logf("TIMING pause (CLI, to PAUSED): %s", time.Since(t0).Round(time.Millisecond))
	w := d.get(id)
	if w.State != api.WorkspacePaused || w.InstanceID != "" {
		t.Fatalf("after pause: %+v", w)
	}
	done := make(chan error, 1)
	go func() { done <- stream.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(streamErr.String(), "was paused while the command ran") {
			t.Errorf("the exec streaming across the pause: exit %v, stderr %q; want it to say the Workspace was paused", err, streamErr.String())
		}
		t.Logf("the exec streaming across the pause ended: %v: %s", err, strings.TrimSpace(streamErr.String()))
	case <-time.After(30 * time.Second):
		t.Errorf("the exec streaming across the pause still runs 30 s after it")
	}
	if got := d.must("workspace", "get", id).stdout; !strings.Contains(got, "Snapshot:") || !strings.Contains(got, "PAUSED") {
		t.Errorf("workspace get of a paused Workspace:\n%s", got)
	}
	if r := d.expect(api.ExitFailedPrecondition, "workspace", "exec", id, "--", "true"); !strings.Contains(r.stderr, "is PAUSED") || !strings.Contains(r.stderr, "kibo workspace resume "+id) {
		t.Errorf("exec on a paused Workspace: %s; want it to say PAUSED and how to resume it", r)
	}
	t0 = time.Now()
	d.must("workspace", "resume", id)
	tResume := time.Since(t0)
	got := d.must("workspace", "exec", id, "--", "sh", "-c", "cat /tmp/count; kill -0 $(cat /tmp/counter.pid) && echo alive; ls /proc/$(cat /tmp/counter.pid)/fd/3 >/dev/null && echo held; cat /data/f; date +%s")
	t.Logf("TIMING resume (CLI, to AVAILABLE): %s, to the first exec answer: %s", tResume.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 5 || lines[1] != "alive" || lines[2] != "held" || lines[3] != "on-volume" {
		t.Fatalf("after resume: %q; want the count, alive, held, the Volume's file, the date", got.stdout)
	}
	if count, _ := strconv.Atoi(lines[0]); count < before {
		t.Errorf("the counter after resume is %d, was %d before the pause: it started over", count, before)
	}
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("the counter to count on past %d after resume", before), func() (bool, string) {
		c := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/count").stdout)
		n, _ := strconv.Atoi(c)
		return n > before, "count " + c
	})
	if now, _ := strconv.ParseInt(lines[4], 10, 64); time.Now().Unix()-now > 3 || now-time.Now().Unix() > 3 {
		t.Errorf("the guest's clock after resume: %d, the host's %d", now, time.Now().Unix())
	}
	if again := strings.TrimSpace(d.must("workspace", "exec", id, "--", "cat", "/tmp/counter.pid").stdout); again != pid {
		t.Errorf("the counting process is %s after resume, was %s", again, pid)
	}
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.Snapshot != nil {
		t.Errorf("after resume: %+v", w)
	}
	d.must("workspace", "exec", id, "--", "sh", "-c", "kill $(cat /tmp/counter.pid)")
}

// testReboot reboots the guest from inside, right after a resume (so
// the configuration it is told again came through the snapshot): the VMM
// boots it again, and the node gives the new boot the launch-time
// configuration, its filesystem, pseudo filesystems, DNS, Volume and
// hostname. The Workspace stays AVAILABLE on the same Instance.
func (d *wsDev) testReboot(id string) {
	t := d.t
	before := d.get(id)
	const look = "cat /proc/sys/kernel/random/boot_id; hostname; cat /data/f /root/f; grep -c nameserver /etc/resolv.conf; ls /dev/null /proc/self/status"
	boot := func(r result) string { b, _, _ := strings.Cut(r.stdout, "\n"); return b }
	was := d.must("workspace", "exec", id, "--", "sh", "-c", look)
	t0 := time.Now()
	d.must("workspace", "exec", id, "--", "sh", "-c", "sync; (sleep 1; reboot -f) >/dev/null 2>&1 &")
	var after result
	testenv.WaitFor(t, 3*time.Minute, "an exec on the rebooted guest", func() (bool, string) {
		after = d.kibo(20*time.Second, nil, "workspace", "exec", id, "--", "sh", "-c", look)
		return after.code == 0 && boot(after) != boot(was), after.String()
	})
	t.Logf("TIMING reboot from inside to an exec on the new boot: %s", time.Since(t0).Round(time.Millisecond))
	if rest := strings.SplitN(after.stdout, "\n", 2)[1]; rest != strings.SplitN(was.stdout, "\n", 2)[1] {
		t.Errorf("after the reboot the Workspace shows\n%s\nbefore it\n%s", rest, strings.SplitN(was.stdout, "\n", 2)[1])
	}
	// ctrl hears of the responding guest with the node's next report.
	testenv.WaitFor(t, 30*time.Second, "get to show the guest responding", func() (bool, string) {
		w := d.get(id)
		return !w.GuestNotResponding, fmt.Sprintf("%+v", w)
	})
	if w := d.get(id); w.State != api.WorkspaceAvailable || w.InstanceID != before.InstanceID {
		t.Errorf("after the reboot: %+v; want AVAILABLE on instance %s", w, before.InstanceID)
	}
	if !d.devProc().logContains("instance guest restarted; reconfigured with the launch-time configuration") {
		t.Errorf("the node did not log the reconfigured restart")
	}
}

// testNodeKill kills the node process with SIGKILL while an exec streams:
// the exec goes on (the data plane and the VM outlive the node), and a new
// node process takes the VM over.
func (d *wsDev) testNodeKill(id string) {
	t := d.t
	before := d.get(id)
	var n wsNode
	if err := decodeResult(d.must("node", "get", "dev", "--json"), &n); err != nil || n.Session == nil {
		t.Fatalf("node get dev: %v %+v", err, n)
	}
	cmd := exec.Command(filepath.Join(d.bin, "kibo"), "workspace", "exec", id, "--", "sh", "-c", "for i in $(seq 1 30); do echo $i; sleep 0.2; done")
	cmd.Env = d.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.track(cmd)
	var got []string
	first := make(chan struct{})
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got = append(got, sc.Text())
			if len(got) == 1 {
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatalf("the streaming exec printed nothing in 30s; stderr %q", stderr.String())
	}
	p := d.devProc()
	t.Logf("killing kibotos dev (pid %d) with SIGKILL while the exec streams", p.cmd.Process.Pid)
	p.cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := p.waitExit(10 * time.Second); !ok {
		t.Fatalf("kibotos dev (pid %d) did not die after SIGKILL", p.cmd.Process.Pid)
	}
	<-readDone
	err = cmd.Wait()
	want := make([]string, 30)
	for i := range want {
		want[i] = strconv.Itoa(i + 1)
	}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("exec across kill -9 of the node: err %v, stdout %v, stderr %q; want 1..30 and exit 0", err, got, stderr.String())
	}

	t0 := time.Now()
	d.up()
	d.waitReady(n.Session.Incarnation)
	t.Logf("TIMING node restart to READY: %s", time.Since(t0).Round(time.Millisecond))
	if !d.devProc().logContains("instance taken over") {
		t.Errorf("the restarted node did not log the takeover of %s", before.InstanceID)
	}
	after := d.get(id)
	if after.State != api.WorkspaceAvailable || after.InstanceID != before.InstanceID {
		t.Errorf("after the node restart: %+v; want AVAILABLE with the same instance %s", after, before.InstanceID)
	}
	if r := d.must("workspace", "exec", id, "--", "cat", "/root/f"); r.stdout != "kept\n" {
		t.Errorf("the file after the node restart: %q, want %q", r.stdout, "kept\n")
	}
	if r := d.must("workspace", "exec", id, "--", "sh", "-c", "echo again"); r.stdout != "again\n" {
		t.Errorf("a new exec after the node restart: %q", r.stdout)
	}
}

// testForceStopDelete: cleanup-status, stop --force, delete and the layer.
func (d *wsDev) testForceStopDelete(id string) {
	t := d.t
	out := d.must("workspace", "cleanup-status", id).stdout
	for _, item := range []string{"RUNTIME", "VOLUME_ATTACHMENT", "RESIDUAL"} {
		if !regexp.MustCompile(`(?m)^` + item + `\s+(HELD|RELEASED|PENDING|UNKNOWN)\s`).MatchString(out) {
			t.Errorf("cleanup-status lacks a %s row:\n%s", item, out)
		}
	}
	d.must("workspace", "stop", "--force", id)
	if w := d.get(id); w.State != api.WorkspaceStopped || !w.StopUnconfirmed {
		t.Errorf("after stop --force: %+v; want STOPPED with stop_unconfirmed", w)
	}
	layer := filepath.Join(datadir.Dir(d.dir).StorageRoot(), "pools", "default", "layers", id+".qcow2")
	if _, err := os.Stat(layer); err != nil {
		t.Errorf("the writable layer of a STOPPED Workspace: %v", err)
	}
	// The node's own observation of the release replaces ctrl's view once
	// ctrl stored it; the node then deletes its ended-Instance record.
	// ctrl checks a node's records once a minute.
	registry := filepath.Join(datadir.Dir(d.dir).StorageRoot(), "runtime", "registry")
	var st api.CleanupStatus
	testenv.WaitFor(t, fsm.EndedRoundInterval+30*time.Second, "cleanup-status from the node and its ended-Instance records deleted", func() (bool, string) {
		if err := decodeResult(d.must("workspace", "cleanup-status", id, "--json"), &st); err != nil {
			t.Fatal(err)
		}
		left, _ := filepath.Glob(filepath.Join(registry, "inst-*.json"))
		return len(st.Items) == 3 && st.Items[0].Source == "node" && len(left) == 0, fmt.Sprintf("records %v, status %+v", left, st)
	})
	// The records concluded and deleted: none is counted as destroyed.
	if v := metricValue(t, d.scrape(), "kibotos_node_instances", "state", "destroyed"); v != 0 {
		t.Errorf("kibotos_node_instances{state=destroyed} = %v after the node deleted its records, want 0", v)
	}
	for _, it := range st.Items {
		if it.State != api.CleanupReleased || it.ObservedAt == nil || it.Source != "node" {
			t.Errorf("after stop --force, cleanup item %+v: want RELEASED as observed by the node", it)
		}
	}
	d.must("workspace", "delete", id)
	if r := d.expect(api.ExitNotFound, "workspace", "get", id); !strings.Contains(r.stderr, id) {
		t.Errorf("get after delete: %s", r)
	}
	if _, err := os.Stat(layer); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the writable layer %s after delete: %v, want it gone", layer, err)
	}
	// The Volume outlived its Workspace; deleted, its file goes.
	var v api.Volume
	if err := decodeResult(d.must("volume", "get", "data", "--json"), &v); err != nil || v.WorkspaceID != "" || v.State != api.VolumeAvailable {
		t.Fatalf("the Volume after its Workspace was deleted: %+v %v", v, err)
	}
	d.must("volume", "delete", "data")
	if _, err := os.Stat(api.VolumeFilePath(filepath.Join(datadir.Dir(d.dir).StorageRoot(), "pools", "default"), v.VolumeID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Volume's file after volume delete: %v, want it gone", err)
	}
}

// down stops kibotos dev (SIGINT, as Ctrl-C), runs kibotos dev down
// --purge and checks that no process of this test is left: no VMM, no
// data-plane process, no private systemd.
func (d *wsDev) down() {
	t := d.t
	d.mu.Lock()
	others := d.started
	d.mu.Unlock()
	for _, c := range others {
		if c.ProcessState == nil {
			c.Process.Kill()
			c.Wait()
		}
	}
	if p := d.devProc(); p != nil {
		if !p.exited() {
			p.cmd.Process.Signal(syscall.SIGINT)
			if _, ok := p.waitExit(30 * time.Second); !ok {
				t.Errorf("kibotos dev (pid %d) did not stop within 30s of SIGINT; killing it", p.cmd.Process.Pid)
				p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			d.mu.Lock()
			for i := 1; i <= d.runs; i++ {
				log := filepath.Join(d.tmp, fmt.Sprintf("dev-%d.log", i))
				t.Logf("---- last lines of %s ----\n%s", filepath.Base(log), tail(log, 40))
			}
			d.mu.Unlock()
			for _, log := range unitLogs(datadir.Dir(d.dir)) {
				t.Logf("---- last lines of %s ----\n%s", filepath.Base(log), tail(log, 40))
			}
		}
	}
	if _, err := os.Stat(d.dir); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "kibotos"), "dev", "down", "--data-dir", d.dir, "--purge")
		cmd.Env = hostprobe.CleanEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("kibotos dev down --purge: %v\n%s", err, out)
		} else {
			t.Logf("kibotos dev down --purge: %s", strings.TrimSpace(string(out)))
			// The Workspace is deleted by then; the data-plane process
			// outlives the node by design, so dev down must end it.
			if !t.Failed() && !strings.Contains(string(out), "0 VM(s) ended, 1 data-plane process(es) stopped") {
				t.Errorf("dev down after the Workspace was deleted: %q, want 0 VM(s) ended, 1 data-plane process(es) stopped; last lines of dev-%d.log:\n%s",
					out, d.runs, tail(filepath.Join(d.tmp, fmt.Sprintf("dev-%d.log", d.runs)), 60))
			}
		}
		if _, err := os.Stat(d.dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dev down --purge left %s (%v)", d.dir, err)
		}
		// The node's own table and the routing of proxied guests go with
		// the last guest.
		if out, _ := exec.Command("nft", "list", "table", "inet", "kibotos").CombinedOutput(); !strings.Contains(string(out), "No such file") {
			t.Errorf("dev down left the node's nftables table: %s", trimTo(string(out), 300))
		}
		if out, _ := exec.Command("ip", "rule", "list", "fwmark", "0x6b62").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
			t.Errorf("dev down left the proxy policy rule: %s", out)
		}
	}
	// Every process of this test mentions its directory: the VMMs (their
	// disks), the data plane (its executable and socket directory), the
	// private systemd's children.
	var left []string
	if !testenv.Poll(t, 10*time.Second, func() bool { left = hostprobe.ProcsMentioning(d.tmp); return len(left) == 0 }) {
		t.Errorf("processes of this test still run after dev down:\n%s", strings.Join(left, "\n"))
	}
}

// unitLogs are the logs of a member's data-plane and egress processes:
// their units' files, since the private systemd has no journal.
func unitLogs(d datadir.Dir) []string {
	logs, _ := filepath.Glob(filepath.Join(d.NodeDir(), "systemd", "logs", "kibotos-[de]*.log"))
	return logs
}
