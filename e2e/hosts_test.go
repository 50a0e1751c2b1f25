package e2e

// The harness: a "lab" of hosts, each its own network namespace, wired by
// veth pairs to one bridge that lives in a dedicated switch namespace. The
// machine's own interfaces and routes are never touched, so partitioning a
// host is just taking its one link down inside its namespace.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kibotos/kibotos/internal/hostprobe"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
)

const (
	subnetPrefix = "10.77.0." // only ever configured inside the lab's namespaces
	apiPort      = "7000"     // same port on every host: each has its own address
	hostIface    = "eth0"     // the host end of its veth pair
)

// requireLab skips the test (fails it under KIBOTOS_REQUIRE_ALL=1) unless
// it can build namespaces. The reason goes to stderr too.
func requireLab(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root to create network namespaces")
	}
	testenv.LookPath(t, "ip", "iproute2")
}

// lab owns every namespace, process and directory a test creates, and
// removes them all in t.Cleanup, also when the test fails.
type lab struct {
	t      *testing.T
	prefix string // kbt-<random>: names of the namespaces
	dir    string // data dirs and logs
	bin    string // directory holding kibotos and the kibo symlink

	mu    sync.Mutex
	nss   []string // created namespaces, switch first
	procs []*proc  // every process ever started
	hosts []*host
}

// host is one machine of the cluster: a namespace with one address and the
// data directory of the member that runs there.
type host struct {
	lab     *lab
	ns      string
	ip      string
	nodeID  string
	index   int // position in the lab
	roles   string
	dataDir string
	// creds, when set, is the operator credential its CLI uses (a
	// node-only host holds none of its own).
	creds string
	// bin, when set, holds the kibotos (and kibo) this host runs instead
	// of the lab's: another build, for upgrades.
	bin string

	mu    sync.Mutex
	serve *proc // the current serve process; nil before the first start
	runs  int   // serve starts so far, for log file names
}

func (h *host) addr() string { return h.ip + ":" + apiPort }

// binDir is the directory of the kibotos this host runs.
func (h *host) binDir() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bin != "" {
		return h.bin
	}
	return h.lab.bin
}

// setBin makes the host run the kibotos in dir from its next start on.
func (h *host) setBin(dir string) {
	h.mu.Lock()
	h.bin = dir
	h.mu.Unlock()
}

// newLab builds the kibotos binary and n hosts on one switch.
func newLab(t *testing.T, n int) *lab {
	t.Helper()
	requireLab(t)
	b := make([]byte, 3)
	rand.Read(b)
	// TempDir registers its removal first, so the cleanup below (kill the
	// processes that write into it) runs before the directory goes.
	l := &lab{t: t, prefix: "kbt-" + hex.EncodeToString(b), dir: t.TempDir()}
	t.Cleanup(l.cleanup)
	l.bin = buildBinary(t, filepath.Join(l.dir, "bin"))
	// The egress process runs this binary as kibotos-egress: its
	// directories must let that user through (the data directories stay
	// root's alone).
	for _, d := range []string{filepath.Dir(l.dir), l.dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	sw := l.prefix + "-sw"
	l.addNetns(sw)
	l.ip("-n", sw, "link", "add", "br0", "type", "bridge")
	l.ip("-n", sw, "link", "set", "br0", "up")
	for range n {
		l.addHost()
	}
	return l
}

// addHost plugs one more host into the lab's switch: a namespace with the
// next address.
func (l *lab) addHost() *host {
	i := len(l.hosts) + 1
	sw := l.prefix + "-sw"
	ns := fmt.Sprintf("%s-%d", l.prefix, i)
	port := fmt.Sprintf("p%d", i)
	l.addNetns(ns)
	// Created inside the switch namespace with the peer moved straight
	// into the host namespace: the root namespace never sees either end.
	l.ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", hostIface, "netns", ns)
	l.ip("-n", sw, "link", "set", port, "master", "br0")
	l.ip("-n", sw, "link", "set", port, "up")
	ip := fmt.Sprintf("%s%d", subnetPrefix, 10+i)
	l.ip("-n", ns, "addr", "add", ip+"/24", "dev", hostIface)
	l.ip("-n", ns, "link", "set", hostIface, "up")
	l.ip("-n", ns, "link", "set", "lo", "up")
	h := &host{lab: l, ns: ns, ip: ip, index: i, dataDir: filepath.Join(l.dir, fmt.Sprintf("host%d", i))}
	l.hosts = append(l.hosts, h)
	return h
}

// buildBinary builds kibotos into dir and adds the kibo symlink.
func buildBinary(t *testing.T, dir string) string { return buildRelease(t, dir, "") }

// buildRelease is buildBinary with a release stamped ("": unreleased), as
// scripts/build.sh does with KIBOTOS_RELEASE.
func buildRelease(t *testing.T, dir, release string) string {
	t.Helper()
	// Static, as scripts/build.sh builds it: kibotos dev ships this
	// executable as the guest agent of its Platform.
	args := []string{"build", "-o", filepath.Join(dir, "kibotos")}
	if release != "" {
		args = append(args, "-ldflags", "-X github.com/kibotos/kibotos/buildinfo.Release="+release)
	}
	cmd := exec.Command("go", append(args, "github.com/kibotos/kibotos")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build kibotos %s: %v\n%s", release, err, out)
	}
	if err := os.Symlink("kibotos", filepath.Join(dir, "kibo")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (l *lab) addNetns(name string) {
	l.ip("netns", "add", name)
	l.mu.Lock()
	l.nss = append(l.nss, name)
	l.mu.Unlock()
}

// listenIn opens a TCP listener on addr inside the namespace ns, for a
// server of the test process that the hosts reach (a socket stays in the
// namespace it was made in).
func (l *lab) listenIn(ns, addr string) net.Listener {
	l.t.Helper()
	var ln net.Listener
	err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		l.t.Fatalf("listen on %s in namespace %s: %v", addr, ns, err)
	}
	return ln
}

// inNetns runs f on a thread in the named namespace ns, which goes back
// to the test's namespace afterwards. The thread must not end: the hosts'
// processes are started with Pdeathsig, which the kernel sends when the
// thread that forked them ends, whichever goroutine ran on it since.
func inNetns(ns string, f func() error) error {
	h, err := netns.GetFromPath("/run/netns/" + ns)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer h.Close()
	return netpol.InNamespace(h, f)
}

// ip runs one iproute2 command and fails the test if it fails.
func (l *lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// cleanup kills and reaps every process, dumps the member logs of a failed
// test, and deletes the namespaces (which takes the veths and bridge along).
func (l *lab) cleanup() {
	l.mu.Lock()
	procs, nss := l.procs, l.nss
	l.mu.Unlock()
	for _, p := range procs {
		if !p.exited() {
			p.cmd.Process.Kill()
		}
		<-p.done
	}
	if l.t.Failed() {
		for _, p := range procs {
			l.t.Logf("---- last lines of %s ----\n%s", filepath.Base(p.log), tail(p.log, 25))
		}
	}
	for i := len(nss) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", nss[i]).CombinedOutput(); err != nil {
			l.t.Errorf("cleanup: ip netns del %s: %v %s", nss[i], err, out)
		}
	}
}

func tail(path string, n int) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// proc is one long-running process started in a namespace.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed once Wait returned
	code int           // exit code; -1 when killed by a signal; valid after done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitExit waits up to d for the process to exit and returns its code.
func (p *proc) waitExit(d time.Duration) (int, bool) {
	select {
	case <-p.done:
		return p.code, true
	case <-time.After(d):
		return 0, false
	}
}

// start runs kibotos with args inside the host's network namespace,
// output to a log file. nsenter execs in place, so the PID is the member's;
// it enters only the network namespace (`ip netns exec` would also give the
// process a fresh /sys without the host's cgroup2 mount, which a private
// systemd for the VMs needs).
func (h *host) start(logName string, args ...string) *proc {
	l := h.lab
	l.t.Helper()
	if err := os.MkdirAll(filepath.Join(l.dir, "logs"), 0o755); err != nil {
		l.t.Fatal(err)
	}
	logPath := filepath.Join(l.dir, "logs", logName)
	f, err := os.Create(logPath)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.ns, filepath.Join(h.binDir(), "kibotos")}, args...)...)
	cmd.Env = hostprobe.CleanEnv()
	p, err := startProc(cmd, f, logPath)
	if err != nil {
		l.t.Fatalf("start %v: %v", args, err)
	}
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	return p
}

// startProc starts cmd with its output to f (closed when it exits) and
// records its exit code in the returned proc. Should the test binary die
// without running its cleanups (go test -timeout), the kernel still kills
// the process.
func startProc(cmd *exec.Cmd, f *os.File, logPath string) (*proc, error) {
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.code = cmd.ProcessState.ExitCode()
		if err != nil && p.code == 0 {
			p.code = -1
		}
		close(p.done)
	}()
	return p, nil
}

// startServe starts this host's member with the test timings.
func (h *host) startServe() *proc {
	h.mu.Lock()
	h.runs++
	name := fmt.Sprintf("%s-serve-%d.log", h.nodeID, h.runs)
	h.mu.Unlock()
	p := h.start(name, "serve", "--data-dir", h.dataDir, "--test-timings")
	h.mu.Lock()
	h.serve = p
	h.mu.Unlock()
	return p
}

func (h *host) serveProc() *proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.serve
}

// crash kills the member with SIGKILL, as a power loss would, and reaps it.
func (h *host) crash() {
	h.lab.t.Helper()
	p := h.serveProc()
	p.cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := p.waitExit(10 * time.Second); !ok {
		h.lab.t.Fatalf("member %s (pid %d) did not die after SIGKILL", h.nodeID, p.cmd.Process.Pid)
	}
}

// stop ends the member with SIGTERM, as stopping its service would, and
// reaps it.
func (h *host) stop() {
	h.lab.t.Helper()
	p := h.serveProc()
	p.cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := p.waitExit(30 * time.Second); !ok {
		h.lab.t.Fatalf("member %s (pid %d) did not stop within 30s of SIGTERM", h.nodeID, p.cmd.Process.Pid)
	}
}

// partition cuts the host off the switch; heal reconnects it. Addresses
// stay configured, so the member's sockets survive the cut.
func (h *host) partition() { h.lab.ip("-n", h.ns, "link", "set", hostIface, "down") }
func (h *host) heal()      { h.lab.ip("-n", h.ns, "link", "set", hostIface, "up") }

// result is one finished CLI invocation.
type result struct {
	args           []string
	code           int // -1: did not finish (timeout) or could not run
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("kibo %s: exit %d: %s%s", strings.Join(r.args, " "), r.code, strings.TrimSpace(r.stderr), trimTo(r.stdout, 300))
}

func trimTo(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

const cliTimeout = 15 * time.Second

// kibo runs the CLI inside the host namespace with the host's data dir, so
// it talks to that member with that member's operator credential, or
// with the host's issued one (creds) where the member holds none.
func (h *host) kibo(args ...string) result { return h.kiboTimeout(cliTimeout, args...) }

func (h *host) kiboTimeout(timeout time.Duration, args ...string) result {
	return h.run(timeout, "kibo", h.kiboArgs(args)...)
}

// kiboArgs are args with the data directory and credentials kibo uses.
func (h *host) kiboArgs(args []string) []string {
	pre := []string{"--data-dir", h.dataDir}
	if h.creds != "" {
		pre = append(pre, "--credentials", h.creds)
	}
	return append(pre, args...)
}

// kibotos runs a host-local command (init, join) inside the namespace.
func (h *host) kibotos(args ...string) result {
	return h.run(cliTimeout, "kibotos", args...)
}

func (h *host) run(timeout time.Duration, name string, args ...string) result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return runResult(ctx, timeout, h.command(ctx, name, args...), args)
}

// command is the host's executable name (kibo, kibotos) with args, to
// run inside the namespace; it is killed when ctx ends.
func (h *host) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.ns, filepath.Join(h.binDir(), name)}, args...)...)
	cmd.Env = hostprobe.CleanEnv()
	return cmd
}

// runResult runs cmd (made with ctx, which ends after timeout) to the end
// and returns its output and exit code; it dies with the test process.
func runResult(ctx context.Context, timeout time.Duration, cmd *exec.Cmd, args []string) result {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	r := result{args: args, stdout: stdout.String(), stderr: stderr.String(), code: -1}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.code = 0
	case ctx.Err() != nil:
		r.stderr += fmt.Sprintf(" [killed by the test after %s]", timeout)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		r.stderr += " [" + err.Error() + "]"
	}
	return r
}

// kiboJSON runs the CLI with --json and decodes .result into out; a non-zero
// exit or undecodable output is an error carrying the whole invocation.
func (h *host) kiboJSON(out any, args ...string) error {
	r := h.kibo(append(args, "--json")...)
	if r.code != 0 {
		return errors.New(r.String())
	}
	return decodeResult(r, out)
}

func decodeResult(r result, out any) error {
	var body struct {
		Result   json.RawMessage `json:"result"`
		Replayed bool            `json:"replayed"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &body); err != nil {
		return fmt.Errorf("%s: output is not JSON: %v", r, err)
	}
	if err := json.Unmarshal(body.Result, out); err != nil {
		return fmt.Errorf("%s: .result does not decode: %v", r, err)
	}
	return nil
}

// mustKiboJSON is kiboJSON that fails the test.
func (h *host) mustKiboJSON(out any, args ...string) {
	h.lab.t.Helper()
	if err := h.kiboJSON(out, args...); err != nil {
		h.lab.t.Fatal(err)
	}
}

// anyLine reports whether a line of the log at path satisfies match.
func anyLine(path string, match func(line string) bool) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if match(sc.Text()) {
			return true
		}
	}
	return false
}

// logHasJSON reports whether the log at path has a JSON object line (as
// slog's JSON handler writes, perhaps after a prefix) whose msg is msg.
func logHasJSON(path, msg string) bool {
	return anyLine(path, func(line string) bool {
		i := strings.Index(line, "{")
		if i < 0 {
			return false
		}
		var rec struct {
			Msg   string `json:"msg"`
			Level string `json:"level"`
			Time  string `json:"time"`
		}
		return json.Unmarshal([]byte(line[i:]), &rec) == nil && rec.Msg == msg && rec.Level != "" && rec.Time != ""
	})
}

// logContains reports whether the process log has a line with s.
func (p *proc) logContains(s string) bool {
	return anyLine(p.log, func(line string) bool { return strings.Contains(line, s) })
}
