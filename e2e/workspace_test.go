package e2e

// The one-host Workspace lifecycle through the real CLI: `kibotos dev`
// (a one-voter cluster whose node runs QEMU micro-VMs under a private
// systemd) and `kibo workspace ...`. One Workspace serves every check but
// the last (a template from an OCI image needs a Workspace of its own), so
// the test boots three VMs in all (create, start, the OCI Workspace).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
)

// wsDev is one `kibotos dev` cluster on this host and the CLI pointed at it.
type wsDev struct {
	t       *testing.T
	tmp     string // test directory: binaries, logs, scratch files
	bin     string
	dir     string // the dev data directory
	addr    string // --advertise
	apiAddr string // --api-listen: the API for applications
	e2bAddr string // --e2b-listen: the E2B API
	cache   string // shared kernel package cache
	mu      sync.Mutex
	dev     *clusterlab.Proc // current kibotos dev process
	runs    int
	started []*exec.Cmd // every other long-running CLI process, to reap
}

func TestWorkspace(t *testing.T) {
	runtimetest.RequireVMHost(t)
	t0 := time.Now()
	tmp := t.TempDir() // registered first: removed after the cleanup below
	d := &wsDev{t: t, tmp: tmp, dir: filepath.Join(tmp, "dev"), cache: filepath.Join(os.TempDir(), "kibotos-test-platform")}
	d.bin = clusterlab.BuildBinary(t, filepath.Join(tmp, "bin"))
	ports := testenv.Ports(t, 6) // API, gossip, data plane, metrics, the API for applications, the E2B API
	d.addr = "127.0.0.1:" + strconv.Itoa(ports)
	d.apiAddr = "127.0.0.1:" + strconv.Itoa(ports+4)
	d.e2bAddr = "127.0.0.1:" + strconv.Itoa(ports+5)
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
		{"DataDirModes", d.testDataDirModes},
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
		{"Tenants", d.testTenants},
		{"E2B", d.testE2B},
		{"IdleResume", d.testIdleResume},
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
	cmd := exec.Command(filepath.Join(d.bin, "kibotos"), "dev", "--data-dir", d.dir, "--advertise", d.addr, "--api-listen", d.apiAddr, "--e2b-listen", d.e2bAddr, "--e2b-template", e2bTemplate, "--no-demo", "--warm", warmTemplate+"=1")
	cmd.Env = d.env()
	p, err := clusterlab.StartProc(cmd, f, logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	d.mu.Lock()
	d.dev = p
	d.mu.Unlock()
}

func (d *wsDev) devProc() *clusterlab.Proc {
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
		if p := d.devProc(); p.Exited() {
			d.t.Fatalf("kibotos dev exited with %d before the node was ready:\n%s", p.Code, clusterlab.Tail(p.Log, 30))
		}
		r := d.kibo(10*time.Second, nil, "node", "get", "dev", "--json")
		if r.Code != 0 {
			return false, r.String()
		}
		var n wsNode
		if err := clusterlab.DecodeResult(r, &n); err != nil {
			return false, err.Error()
		}
		ok := n.Status == api.NodeReady && n.Session != nil && n.Session.Alive && n.Session.Incarnation > after &&
			n.Report != nil && n.Report.DataPlaneAddress != "" && n.Overcommit != nil && n.Overcommit.Acknowledged
		if n.Session != nil {
			inc = n.Session.Incarnation
		}
		if !ok {
			return false, clusterlab.TrimTo(r.Stdout, 400)
		}
		// kibotos dev gives its pool a capacity once the node is ready.
		var p api.StoragePool
		if r := d.kibo(10*time.Second, nil, "storage-pool", "get", "dev:default", "--json"); r.Code != 0 || clusterlab.DecodeResult(r, &p) != nil || p.CapacityBytes == nil {
			return false, "storage pool dev:default without a capacity: " + clusterlab.TrimTo(r.String(), 400)
		}
		return true, ""
	})
	return inc
}

// kibo runs the CLI with KIBOTOS_DATA_DIR set to the dev directory.
func (d *wsDev) kibo(timeout time.Duration, stdin []byte, args ...string) clusterlab.Result {
	return d.kiboWith(d.env(), timeout, stdin, args...)
}

// kiboEnv runs the CLI with environment env, for at most a minute.
func (d *wsDev) kiboEnv(env []string, args ...string) clusterlab.Result {
	return d.kiboWith(env, time.Minute, nil, args...)
}

func (d *wsDev) kiboWith(env []string, timeout time.Duration, stdin []byte, args ...string) clusterlab.Result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "kibo"), args...)
	cmd.Env = env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	return clusterlab.RunResult(ctx, timeout, cmd, args)
}

// must runs the CLI and fails the test unless it exits 0.
func (d *wsDev) must(args ...string) clusterlab.Result {
	d.t.Helper()
	r := d.kibo(time.Minute, nil, args...)
	if r.Code != 0 {
		d.t.Fatalf("%s", r)
	}
	return r
}

// expect runs the CLI and fails the test unless it exits with code.
func (d *wsDev) expect(code int, args ...string) clusterlab.Result {
	d.t.Helper()
	r := d.kibo(time.Minute, nil, args...)
	if r.Code != code {
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
	if err := clusterlab.DecodeResult(r, &w); err != nil {
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
	before := d.must("workspace", "list", "--all", "-q").Stdout
	// The Workspace mounts a Volume at /data (StopStart and
	// ForceStopDelete check it).
	if r := d.must("volume", "create", "data", "--size", "64MiB"); !strings.Contains(r.Stdout, "created: AVAILABLE, 64.0MiB in pool dev:default") {
		t.Fatalf("volume create: %s", r)
	}
	cmdID := "e2e-create-" + hex.EncodeToString(randBytes(t, 4))
	t0 := time.Now()
	r := d.kibo(3*time.Minute, nil, "workspace", "create", "--template", "kibotos-base", "--volume", "data:/data", "-q", "--command-id", cmdID)
	if r.Code != 0 || !wsIDRe.MatchString(r.Stdout) || r.Stderr != "" {
		t.Fatalf("create -q must print only a Workspace id: %s (stdout %q)", r, r.Stdout)
	}
	t.Logf("TIMING create (to AVAILABLE): %s", time.Since(t0).Round(time.Millisecond))
	id := strings.TrimSpace(r.Stdout)

	w := d.get(id)
	if w.WorkspaceID != id || w.State != api.WorkspaceAvailable || w.NodeID != "dev" || !strings.HasPrefix(w.InstanceID, "inst-") || w.Version == 0 {
		t.Fatalf("get %s: %+v; want AVAILABLE on node dev with an instance and a version", id, w)
	}

	// The same command id again: the same Workspace, nothing new.
	r = d.must("workspace", "create", "--template", "kibotos-base", "--volume", "data:/data", "-q", "--command-id", cmdID)
	if strings.TrimSpace(r.Stdout) != id {
		t.Errorf("create retried with --command-id %s: got %q, want %s", cmdID, r.Stdout, id)
	}

	list := d.must("workspace", "list").Stdout
	if !regexp.MustCompile(`(?m)^` + id + `\s+AVAILABLE\s+kibotos-base\s`).MatchString(list) {
		t.Errorf("workspace list lacks %s AVAILABLE:\n%s", id, list)
	}
	wide := strings.Split(strings.TrimSpace(d.must("workspace", "list", "--wide").Stdout), "\n")
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
	if out := d.must("workspace", "list", "--node", "dev").Stdout; !strings.Contains(out, id) {
		t.Errorf("list --node dev lacks %s:\n%s", id, out)
	}
	if out := d.must("workspace", "list", "--instance", w.InstanceID, "-q").Stdout; out != id+"\n" {
		t.Errorf("list --instance %s -q: %q, want %s", w.InstanceID, out, id)
	}
	d.expect(api.ExitUsage, "workspace", "list", "--node", "dev", "--state", "AVAILABLE")
	d.expect(api.ExitNotFound, "workspace", "list", "--node", "nosuch")
	if r := d.expect(api.ExitNotFound, "workspace", "get", "ws-nosuch"); !strings.Contains(r.Stderr, "ws-nosuch") {
		t.Errorf("get ws-nosuch: the message does not name it: %s", r)
	}
	d.expect(api.ExitInvalidArgument, "workspace", "create", "--template", "NoSuch!")
	d.expect(api.ExitNotFound, "workspace", "create", "--template", "kibotos-base", "--node", "nosuch")
	after := d.must("workspace", "list", "--all", "-q").Stdout
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

func (d *wsDev) track(cmd *exec.Cmd) {
	d.mu.Lock()
	d.started = append(d.started, cmd)
	d.mu.Unlock()
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
		if !p.Exited() {
			p.Cmd.Process.Signal(syscall.SIGINT)
			if _, ok := p.WaitExit(30 * time.Second); !ok {
				t.Errorf("kibotos dev (pid %d) did not stop within 30s of SIGINT; killing it", p.Cmd.Process.Pid)
				p.Cmd.Process.Kill()
				<-p.Done()
			}
		}
		if t.Failed() {
			d.mu.Lock()
			for i := 1; i <= d.runs; i++ {
				log := filepath.Join(d.tmp, fmt.Sprintf("dev-%d.log", i))
				t.Logf("---- last lines of %s ----\n%s", filepath.Base(log), clusterlab.Tail(log, 40))
			}
			d.mu.Unlock()
			for _, log := range clusterlab.UnitLogs(datadir.Dir(d.dir)) {
				t.Logf("---- last lines of %s ----\n%s", filepath.Base(log), clusterlab.Tail(log, 40))
			}
			// The guest agents' side of a failed call.
			for _, log := range clusterlab.RecentConsoleLogs(datadir.Dir(d.dir), 4) {
				t.Logf("---- last lines of the console of %s ----\n%s", filepath.Base(filepath.Dir(log)), clusterlab.Tail(log, 30))
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
					out, d.runs, clusterlab.Tail(filepath.Join(d.tmp, fmt.Sprintf("dev-%d.log", d.runs)), 60))
			}
		}
		if _, err := os.Stat(d.dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("dev down --purge left %s (%v)", d.dir, err)
		}
		// The node's own table and the routing of proxied guests go with
		// the last guest.
		if out, _ := exec.Command("nft", "list", "table", "inet", "kibotos").CombinedOutput(); !strings.Contains(string(out), "No such file") {
			t.Errorf("dev down left the node's nftables table: %s", clusterlab.TrimTo(string(out), 300))
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
