// Package clusterlab runs real Kibotos clusters for tests and the fault
// harness: a "lab" of hosts, each its own network namespace, wired by
// veth pairs to one bridge that lives in a dedicated switch namespace. The
// machine's own interfaces and routes are never touched, so partitioning a
// host is just taking its one link down inside its namespace. Every
// process, namespace and directory a lab makes is removed by its cleanup.
package clusterlab

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
	SubnetPrefix = "10.77.0." // only ever configured inside the lab's namespaces
	APIPort      = "7000"     // same port on every host: each has its own address
	HostIface    = "eth0"     // the host end of its veth pair
)

// Require skips the test (fails it under KIBOTOS_REQUIRE_ALL=1) unless
// it can build namespaces. The reason goes to stderr too.
func Require(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "needs root to create network namespaces")
	}
	testenv.LookPath(t, "ip", "iproute2")
}

// Lab owns every namespace, process and directory a test creates, and
// removes them all in t.Cleanup, also when the test fails.
type Lab struct {
	T      *testing.T
	Prefix string // kbt-<random>: names of the namespaces
	Dir    string // data dirs and logs
	Bin    string // directory holding kibotos and the kibo symlink

	mu    sync.Mutex
	nss   []string // created namespaces, switch first
	procs []*Proc  // every process ever started
	Hosts []*Host
}

// Host is one machine of the cluster: a namespace with one address and the
// data directory of the member that runs there.
type Host struct {
	Lab     *Lab
	NS      string
	IP      string
	NodeID  string
	Index   int // position in the lab
	Roles   string
	DataDir string
	// Creds, when set, is the operator credential its CLI uses (a
	// node-only host holds none of its own).
	Creds string
	// SystemdOutlives makes StartServeConfig's private systemd outlive
	// the member (serve --test-systemd-outlives): a killed member's VMs
	// run on and its next start takes them over, as under the host's
	// systemd. VMRoot's cleanup ends it.
	SystemdOutlives bool
	// bin, when set, holds the kibotos (and kibo) this host runs instead
	// of the lab's: another build, for upgrades.
	bin string

	mu    sync.Mutex
	serve *Proc // the current serve process; nil before the first start
	runs  int   // serve starts so far, for log file names
}

func (h *Host) Addr() string { return h.IP + ":" + APIPort }

// BinDir is the directory of the kibotos this host runs.
func (h *Host) BinDir() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bin != "" {
		return h.bin
	}
	return h.Lab.Bin
}

// SetBin makes the host run the kibotos in dir from its next start on.
func (h *Host) SetBin(dir string) {
	h.mu.Lock()
	h.bin = dir
	h.mu.Unlock()
}

// New builds the kibotos binary and n hosts on one switch.
func New(t *testing.T, n int) *Lab {
	t.Helper()
	Require(t)
	b := make([]byte, 3)
	rand.Read(b)
	// TempDir registers its removal first, so the cleanup below (kill the
	// processes that write into it) runs before the directory goes.
	l := &Lab{T: t, Prefix: "kbt-" + hex.EncodeToString(b), Dir: t.TempDir()}
	t.Cleanup(l.cleanup)
	l.Bin = BuildBinary(t, filepath.Join(l.Dir, "bin"))
	// The egress process runs this binary as kibotos-egress: its
	// directories must let that user through (the data directories stay
	// root's alone).
	for _, d := range []string{filepath.Dir(l.Dir), l.Dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	sw := l.Prefix + "-sw"
	l.AddNetns(sw)
	l.IP("-n", sw, "link", "add", "br0", "type", "bridge")
	l.IP("-n", sw, "link", "set", "br0", "up")
	for range n {
		l.AddHost()
	}
	return l
}

// AddHost plugs one more host into the lab's switch: a namespace with the
// next address.
func (l *Lab) AddHost() *Host {
	i := len(l.Hosts) + 1
	sw := l.Prefix + "-sw"
	ns := fmt.Sprintf("%s-%d", l.Prefix, i)
	port := fmt.Sprintf("p%d", i)
	l.AddNetns(ns)
	// Created inside the switch namespace with the peer moved straight
	// into the host namespace: the root namespace never sees either end.
	l.IP("-n", sw, "link", "add", port, "type", "veth", "peer", "name", HostIface, "netns", ns)
	l.IP("-n", sw, "link", "set", port, "master", "br0")
	l.IP("-n", sw, "link", "set", port, "up")
	ip := fmt.Sprintf("%s%d", SubnetPrefix, 10+i)
	l.IP("-n", ns, "addr", "add", ip+"/24", "dev", HostIface)
	l.IP("-n", ns, "link", "set", HostIface, "up")
	l.IP("-n", ns, "link", "set", "lo", "up")
	h := &Host{Lab: l, NS: ns, IP: ip, Index: i, DataDir: filepath.Join(l.Dir, fmt.Sprintf("host%d", i))}
	l.Hosts = append(l.Hosts, h)
	return h
}

// BuildBinary builds kibotos into dir and adds the kibo symlink.
func BuildBinary(t *testing.T, dir string) string { return BuildRelease(t, dir, "") }

// BuildRelease is buildBinary with a release stamped ("": unreleased), as
// scripts/build.sh does with KIBOTOS_RELEASE.
func BuildRelease(t *testing.T, dir, release string) string {
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

func (l *Lab) AddNetns(name string) {
	l.IP("netns", "add", name)
	l.mu.Lock()
	l.nss = append(l.nss, name)
	l.mu.Unlock()
}

// ListenIn opens a TCP listener on addr inside the namespace ns, for a
// server of the test process that the hosts reach (a socket stays in the
// namespace it was made in).
func (l *Lab) ListenIn(ns, addr string) net.Listener {
	l.T.Helper()
	var ln net.Listener
	err := InNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		l.T.Fatalf("listen on %s in namespace %s: %v", addr, ns, err)
	}
	return ln
}

// InNetns runs f on a thread in the named namespace ns, which goes back
// to the test's namespace afterwards. The thread must not end: the hosts'
// processes are started with Pdeathsig, which the kernel sends when the
// thread that forked them ends, whichever goroutine ran on it since.
func InNetns(ns string, f func() error) error {
	h, err := netns.GetFromPath("/run/netns/" + ns)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	defer h.Close()
	return netpol.InNamespace(h, f)
}

// IP runs one iproute2 command and fails the test if it fails.
func (l *Lab) IP(args ...string) {
	l.T.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.T.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// cleanup kills and reaps every process, dumps the member logs of a failed
// test, and deletes the namespaces (which takes the veths and bridge along).
func (l *Lab) cleanup() {
	l.mu.Lock()
	procs, nss := l.procs, l.nss
	l.mu.Unlock()
	for _, p := range procs {
		if !p.Exited() {
			p.Cmd.Process.Kill()
		}
		<-p.done
	}
	if l.T.Failed() {
		for _, p := range procs {
			l.T.Logf("---- last lines of %s ----\n%s", filepath.Base(p.Log), Tail(p.Log, 25))
		}
	}
	for i := len(nss) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", nss[i]).CombinedOutput(); err != nil {
			l.T.Errorf("cleanup: ip netns del %s: %v %s", nss[i], err, out)
		}
	}
}

func Tail(path string, n int) string {
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

// Proc is one long-running process started in a namespace.
type Proc struct {
	Cmd  *exec.Cmd
	Log  string
	done chan struct{} // closed once Wait returned
	Code int           // exit code; -1 when killed by a signal; valid after done
}

func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// WaitExit waits up to d for the process to exit and returns its code.
func (p *Proc) WaitExit(d time.Duration) (int, bool) {
	select {
	case <-p.done:
		return p.Code, true
	case <-time.After(d):
		return 0, false
	}
}

// Start runs kibotos with args inside the host's network namespace,
// output to a log file. nsenter execs in place, so the PID is the member's;
// it enters only the network namespace (`ip netns exec` would also give the
// process a fresh /sys without the host's cgroup2 mount, which a private
// systemd for the VMs needs).
func (h *Host) Start(logName string, args ...string) *Proc {
	l := h.Lab
	l.T.Helper()
	if err := os.MkdirAll(filepath.Join(l.Dir, "logs"), 0o755); err != nil {
		l.T.Fatal(err)
	}
	logPath := filepath.Join(l.Dir, "logs", logName)
	f, err := os.Create(logPath)
	if err != nil {
		l.T.Fatal(err)
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.NS, filepath.Join(h.BinDir(), "kibotos")}, args...)...)
	cmd.Env = hostprobe.CleanEnv()
	p, err := StartProc(cmd, f, logPath)
	if err != nil {
		l.T.Fatalf("start %v: %v", args, err)
	}
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	return p
}

// StartProc starts cmd with its output to f (closed when it exits) and
// records its exit code in the returned proc. Should the test binary die
// without running its cleanups (go test -timeout), the kernel still kills
// the process.
func StartProc(cmd *exec.Cmd, f *os.File, logPath string) (*Proc, error) {
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	p := &Proc{Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		f.Close()
		p.Code = cmd.ProcessState.ExitCode()
		if err != nil && p.Code == 0 {
			p.Code = -1
		}
		close(p.done)
	}()
	return p, nil
}

// StartServe starts this host's member with the test timings.
func (h *Host) StartServe() *Proc {
	h.mu.Lock()
	h.runs++
	name := fmt.Sprintf("%s-serve-%d.log", h.NodeID, h.runs)
	h.mu.Unlock()
	p := h.Start(name, "serve", "--data-dir", h.DataDir, "--test-timings")
	h.mu.Lock()
	h.serve = p
	h.mu.Unlock()
	return p
}

func (h *Host) ServeProc() *Proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.serve
}

// Crash kills the member with SIGKILL, as a power loss would, and reaps it.
func (h *Host) Crash() {
	h.Lab.T.Helper()
	p := h.ServeProc()
	p.Cmd.Process.Signal(syscall.SIGKILL)
	if _, ok := p.WaitExit(10 * time.Second); !ok {
		h.Lab.T.Fatalf("member %s (pid %d) did not die after SIGKILL", h.NodeID, p.Cmd.Process.Pid)
	}
}

// Stop ends the member with SIGTERM, as stopping its service would, and
// reaps it.
func (h *Host) Stop() {
	h.Lab.T.Helper()
	p := h.ServeProc()
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := p.WaitExit(30 * time.Second); !ok {
		h.Lab.T.Fatalf("member %s (pid %d) did not stop within 30s of SIGTERM", h.NodeID, p.Cmd.Process.Pid)
	}
}

// Partition cuts the host off the switch; heal reconnects it. Addresses
// stay configured, so the member's sockets survive the cut.
func (h *Host) Partition() { h.mustSetLink(false) }
func (h *Host) Heal()      { h.mustSetLink(true) }

func (h *Host) mustSetLink(up bool) {
	h.Lab.T.Helper()
	if err := h.SetLink(up); err != nil {
		h.Lab.T.Fatal(err)
	}
}

// SetLink is Partition (up false) or Heal (up true) for a caller that
// is not the test's goroutine: it returns the failure.
func (h *Host) SetLink(up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	if out, err := exec.Command("ip", "-n", h.NS, "link", "set", HostIface, state).CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s link set %s %s: %v: %s", h.NS, HostIface, state, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// impairTable is the nftables table of a host's link faults, in its
// namespace beside the member's own tables.
const impairTable = "kblab_impair"

// CutOneWay drops what the host sends on its link (outbound) or what it
// receives there: an asymmetric partition, in which the host still hears
// the others and they do not hear it, or the reverse. Forwarded traffic
// (its VMs') is cut too. Unimpair ends it.
func (h *Host) CutOneWay(outbound bool) error {
	dir := "iifname"
	if outbound {
		dir = "oifname"
	}
	return h.nft(fmt.Sprintf(`%s %q drop`, dir, HostIface))
}

// Flaky makes the host's link lose lossPct percent of its packets each way
// at random and send at most rateKbit: a lossy, slow link (the kernel here
// has no netem; the rate limit's queue is the delay). Unimpair ends it.
func (h *Host) Flaky(lossPct, rateKbit int) error {
	if err := h.nft(fmt.Sprintf(`iifname %q numgen random mod 100 < %d drop`, HostIface, lossPct),
		fmt.Sprintf(`oifname %q numgen random mod 100 < %d drop`, HostIface, lossPct)); err != nil {
		return err
	}
	return h.tc("qdisc", "replace", "dev", HostIface, "root", "tbf", "rate", fmt.Sprintf("%dkbit", rateKbit), "burst", "16kb", "latency", "400ms")
}

// Unimpair ends CutOneWay and Flaky; a host not impaired is left as it is.
func (h *Host) Unimpair() error {
	var errs []error
	if out, err := exec.Command("ip", "netns", "exec", h.NS, "nft", "list", "table", "inet", impairTable).CombinedOutput(); err == nil {
		errs = append(errs, h.nftRun("delete table inet "+impairTable))
	} else if !strings.Contains(string(out), "No such file") {
		errs = append(errs, fmt.Errorf("host %s: nft list table: %v: %s", h.NodeID, err, out))
	}
	if out, err := exec.Command("tc", "-n", h.NS, "qdisc", "show", "dev", HostIface, "root").CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("host %s: tc qdisc show: %v: %s", h.NodeID, err, out))
	} else if strings.HasPrefix(string(out), "qdisc tbf") {
		errs = append(errs, h.tc("qdisc", "del", "dev", HostIface, "root"))
	}
	return errors.Join(errs...)
}

// nft puts rules in the host's impairment table, on input, output and
// forward, making the table if it is not there.
func (h *Host) nft(rules ...string) error {
	script := fmt.Sprintf("table inet %s {\n", impairTable)
	for _, hook := range []string{"input", "output", "forward"} {
		script += fmt.Sprintf("  chain %s { type filter hook %s priority -10; policy accept; %s; }\n", hook, hook, strings.Join(rules, "; "))
	}
	return h.nftRun(script + "}\n")
}

func (h *Host) nftRun(script string) error {
	cmd := exec.Command("ip", "netns", "exec", h.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("host %s: nft: %v: %s", h.NodeID, err, out)
	}
	return nil
}

func (h *Host) tc(args ...string) error {
	if out, err := exec.Command("tc", append([]string{"-n", h.NS}, args...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("host %s: tc %s: %v: %s", h.NodeID, strings.Join(args, " "), err, out)
	}
	return nil
}

// Result is one finished CLI invocation.
type Result struct {
	Args           []string
	Code           int // -1: did not finish (timeout) or could not run
	Stdout, Stderr string
}

func (r Result) String() string {
	return fmt.Sprintf("kibo %s: exit %d: %s%s", strings.Join(r.Args, " "), r.Code, strings.TrimSpace(r.Stderr), TrimTo(r.Stdout, 300))
}

func TrimTo(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

const CLITimeout = 15 * time.Second

// Kibo runs the CLI inside the host namespace with the host's data dir, so
// it talks to that member with that member's operator credential, or
// with the host's issued one (creds) where the member holds none.
func (h *Host) Kibo(args ...string) Result { return h.KiboTimeout(CLITimeout, args...) }

func (h *Host) KiboTimeout(timeout time.Duration, args ...string) Result {
	return h.Run(timeout, "kibo", h.KiboArgs(args)...)
}

// KiboArgs are args with the data directory and credentials kibo uses.
func (h *Host) KiboArgs(args []string) []string {
	pre := []string{"--data-dir", h.DataDir}
	if h.Creds != "" {
		pre = append(pre, "--credentials", h.Creds)
	}
	return append(pre, args...)
}

// Kibotos runs a host-local command (init, join) inside the namespace.
func (h *Host) Kibotos(args ...string) Result {
	return h.Run(CLITimeout, "kibotos", args...)
}

func (h *Host) Run(timeout time.Duration, name string, args ...string) Result {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return RunResult(ctx, timeout, h.Command(ctx, name, args...), args)
}

// Command is the host's executable name (kibo, kibotos) with args, to
// run inside the namespace; it is killed when ctx ends.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.NS, filepath.Join(h.BinDir(), name)}, args...)...)
	cmd.Env = hostprobe.CleanEnv()
	return cmd
}

// RunResult runs cmd (made with ctx, which ends after timeout) to the end
// and returns its output and exit code; it dies with the test process.
func RunResult(ctx context.Context, timeout time.Duration, cmd *exec.Cmd, args []string) Result {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	r := Result{Args: args, Stdout: stdout.String(), Stderr: stderr.String(), Code: -1}
	var ee *exec.ExitError
	switch {
	case err == nil:
		r.Code = 0
	case ctx.Err() != nil:
		r.Stderr += fmt.Sprintf(" [killed by the test after %s]", timeout)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	default:
		r.Stderr += " [" + err.Error() + "]"
	}
	return r
}

// KiboJSON runs the CLI with --json and decodes .result into out; a non-zero
// exit or undecodable output is an error carrying the whole invocation.
func (h *Host) KiboJSON(out any, args ...string) error {
	r := h.Kibo(append(args, "--json")...)
	if r.Code != 0 {
		return errors.New(r.String())
	}
	return DecodeResult(r, out)
}

func DecodeResult(r Result, out any) error {
	var body struct {
		Result   json.RawMessage `json:"result"`
		Replayed bool            `json:"replayed"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &body); err != nil {
		return fmt.Errorf("%s: output is not JSON: %v", r, err)
	}
	if err := json.Unmarshal(body.Result, out); err != nil {
		return fmt.Errorf("%s: .result does not decode: %v", r, err)
	}
	return nil
}

// MustKiboJSON is kiboJSON that fails the test.
func (h *Host) MustKiboJSON(out any, args ...string) {
	h.Lab.T.Helper()
	if err := h.KiboJSON(out, args...); err != nil {
		h.Lab.T.Fatal(err)
	}
}

// AnyLine reports whether a line of the log at path satisfies match.
func AnyLine(path string, match func(line string) bool) bool {
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

// LogHasJSON reports whether the log at path has a JSON object line (as
// slog's JSON handler writes, perhaps after a prefix) whose msg is msg.
func LogHasJSON(path, msg string) bool {
	return AnyLine(path, func(line string) bool {
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

// LogContains reports whether the process log has a line with s.
func (p *Proc) LogContains(s string) bool {
	return AnyLine(p.Log, func(line string) bool { return strings.Contains(line, s) })
}

// Namespaces are the network namespaces the lab created, switch first.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.nss...)
}

// StartIn runs argv in namespace ns (ip netns exec execs it: the PID is
// its own), output to a log file of the lab, killed by that PID at
// cleanup.
func (l *Lab) StartIn(t *testing.T, ns, name string, argv ...string) string {
	t.Helper()
	logPath := filepath.Join(l.Dir, fmt.Sprintf("%s-%s.log", ns, name))
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s in %s: %v", name, ns, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		f.Close()
	})
	return logPath
}

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }
