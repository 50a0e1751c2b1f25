package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/netpol/netlab"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

func TestMain(m *testing.M) {
	privsd.RunIfInit()
	if os.Getenv(nodeEnv) != "" {
		os.Exit(runNode())
	}
	if mode := os.Getenv(maintenanceNodeEnv); mode != "" {
		os.Exit(runMaintenanceNode(mode))
	}
	code := m.Run()
	runtimetest.Cleanup()
	os.Exit(code)
}

func requireVMHost(t testing.TB) { runtimetest.RequireVMHost(t) }

func platformFixture(t testing.TB) *platform.Installation { return runtimetest.Platform(t) }

// harness is a private systemd, a Manager connected to it and a short
// storage root (unix socket paths must stay under 108 bytes).
type harness struct {
	root    string // storage root
	sd      *privsd.Instance
	m       *units.Manager
	logs    *logBuffer
	scratch string
	keep    []string // installations Open keeps although no record uses them
	// lab holds the node's network namespace (nodeNS), where the runtime
	// routes guest traffic, so no test touches the host's own network.
	lab     *netlab.Lab
	nodeNS  string
	network netpol.Config
}

// The lab's addresses (documentation ranges): the node's uplink up0 to an
// "internet" namespace, and mg0 to a management network guests must never
// reach; each in IPv6 too (withIPv6 gives the node an ipv6_pool).
const (
	labPool       = "10.213.0.0/24"
	labUplinkNode = "198.51.100.1"
	labInternet   = "198.51.100.2"
	labMgmtNode   = "203.0.113.1"
	labMgmtHost   = "203.0.113.2"

	labPool6       = "fd6b:6b00:213::/64"
	labUplinkNode6 = "2001:db8:100::1"
	labInternet6   = "2001:db8:100::2"
	labMgmtNode6   = "2001:db8:203::1"
	labMgmtHost6   = "2001:db8:203::2"
	labMgmtNet6    = "2001:db8:203::/64"
)

func newHarness(t testing.TB) *harness {
	t.Helper()
	requireVMHost(t)
	scratch, err := os.MkdirTemp("/tmp", "kbr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	sd, m := runtimetest.Systemd(t, filepath.Join(scratch, "sd"))
	h := &harness{root: filepath.Join(scratch, "s"), sd: sd, m: m, logs: &logBuffer{}, scratch: scratch}
	// The lab's namespaces live in the private systemd's /run/netns, so
	// a unit may join them (the egress process joins "node").
	h.lab = netlab.New(t, sd.NetNSDir)
	h.nodeNS = h.lab.Namespace("node")
	network, err := netpol.ParseConfig(labPool, "", []string{labMgmtNode + "/24"}, []string{labInternet}, "up0")
	if err != nil {
		t.Fatal(err)
	}
	h.network = network
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runtime log:\n%s", h.logs.String())
		}
	})
	return h
}

// withIPv6 gives the node an ipv6_pool (labPool6) and the lab's IPv6
// management network as a management range, before the runtime opens.
func (h *harness) withIPv6(t testing.TB) {
	t.Helper()
	network, err := netpol.ParseConfig(labPool, labPool6, []string{labMgmtNode + "/24", labMgmtNet6}, []string{labInternet}, "up0")
	if err != nil {
		t.Fatal(err)
	}
	h.network = network
}

// wireInternet adds the lab's "internet": namespace inet on the node's
// uplink up0, labInternet and labInternet6 its addresses.
func (h *harness) wireInternet() {
	h.lab.Namespace("inet")
	h.lab.Wire("node", "up0", labUplinkNode+"/24", "inet", "eth0", labInternet+"/24")
	h.lab.Addr("node", "up0", labUplinkNode6+"/64")
	h.lab.Addr("inet", "eth0", labInternet6+"/64")
}

func (h *harness) open(t testing.TB) (*runtime.Runtime, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return runtime.Open(ctx, h.config())
}

// config is the runtime configuration of the harness: its systemd, storage
// root and the lab's node namespace for Instance networks.
func (h *harness) config() runtime.Config {
	return runtime.Config{
		StorageRoot: h.root,
		NodeID:      "node-a",
		Units:       h.m,
		Accel:       qemu.AccelAuto,
		Logger:      slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),

		KeepInstallations: h.keep,
		OwnInstallation:   runtimetest.PlatformID(),
		Network:           &h.network,
		HostNetNS:         h.nodeNS,
		DeniedInterval:    200 * time.Millisecond,
	}
}

func (h *harness) mustOpen(t testing.TB) *runtime.Runtime {
	t.Helper()
	rt, err := h.open(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// activeVMMs lists the active kibotos-vmm units.
func (h *harness) activeVMMs(t *testing.T) []units.Unit {
	t.Helper()
	l, err := h.m.List(context.Background(), runtime.UnitPrefix+"*")
	if err != nil {
		t.Fatal(err)
	}
	var out []units.Unit
	for _, u := range l {
		if u.Active() {
			out = append(out, u)
		}
	}
	return out
}

// logBuffer collects the runtime's JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// entries returns the log records with the given message.
func (l *logBuffer) entries(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == msg {
			out = append(out, e)
		}
	}
	return out
}

type result struct {
	stdout, stderr string
	exit           guestproto.ExecExit
}

// run execs argv in the guest, feeding stdin if not nil.
func run(ctx context.Context, rt *runtime.Runtime, id string, req guestproto.ExecRequest, stdin *string) (result, error) {
	req.Stdin = stdin != nil
	p, err := rt.Exec(ctx, id, req)
	if err != nil {
		return result{}, err
	}
	return finish(p, stdin)
}

// runOn is run over a guest agent session of the test's own.
func runOn(ctx context.Context, c *guestproto.Client, req guestproto.ExecRequest, stdin *string) (result, error) {
	req.Stdin = stdin != nil
	p, err := c.Exec(ctx, req)
	if err != nil {
		return result{}, err
	}
	return finish(p, stdin)
}

// finish feeds stdin, collects the output and waits for the exit.
func finish(p *guestproto.Process, stdin *string) (result, error) {
	defer p.Close()
	if stdin != nil {
		go func() {
			io.WriteString(p.Stdin, *stdin)
			p.Stdin.Close()
		}()
	}
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(&out, p.Stdout)
	}()
	if p.Stderr != nil {
		io.Copy(&errOut, p.Stderr)
	}
	wg.Wait()
	exit, err := p.Wait()
	return result{out.String(), errOut.String(), exit}, err
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
