package egress

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// helperServe is `kibotos egress serve` without --allow-root: the same
// refusal of root and capabilities, the same process. The private systemd
// has no journal, so its log goes to serve-<generation>.log in the socket
// directory, the one place it may write.
func helperServe(args []string) int {
	fs := flag.NewFlagSet("egress serve", flag.ContinueOnError)
	dir := fs.String("socket-dir", "", "")
	gen := fs.Uint64("generation", 0, "")
	warm := fs.Int("warm-connections", 0, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := CheckUnprivileged(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	out := io.Writer(os.Stderr)
	if f, err := os.OpenFile(filepath.Join(*dir, fmt.Sprintf("serve-%d.log", *gen)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
		defer f.Close()
		out = f
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := RunProcess(context.Background(), Options{SocketDir: *dir, Generation: *gen, WarmConnections: *warm, Logger: log}, 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// supHarness is a private systemd, the directories a node would have, a
// SOCKS5 proxy that echoes, and the Supervisor's config; loopback stands
// for a guest (its connections to the listener keep themselves as the
// original destination).
type supHarness struct {
	sd    *privsd.Instance
	m     *units.Manager
	cfg   SupervisorConfig
	logs  *logBuffer
	socks *socksServer
}

func newSupHarness(t *testing.T) *supHarness {
	t.Helper()
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	testenv.LookPath(t, "useradd", "passwd")
	// The egress user must reach its socket directory and the binary: not
	// under t.TempDir, which is root's alone.
	base, err := os.MkdirTemp("", "kibotos-egress-sup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	sd, m := runtimetest.Systemd(t, filepath.Join(t.TempDir(), "sd"))
	h := &supHarness{sd: sd, m: m, logs: &logBuffer{}, socks: newSocksServer(t, "", "")}
	h.cfg = SupervisorConfig{
		Units:        m,
		Executable:   sharedExe(t),
		SocketDir:    filepath.Join(base, "run", "node-egress"),
		StateDir:     filepath.Join(base, "storage", "state"),
		Scope:        "suptest",
		TCPListen:    testenv.LoopbackAddr(t),
		DNSListen:    testenv.LoopbackAddr(t),
		DrainTimeout: 20 * time.Second,
		// What the node gives without egress_warm_connections.
		WarmConnections: DefaultWarmConnections,
		Logger:          slog.New(slog.NewTextHandler(io.MultiWriter(h.logs, &testWriter{t: t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, _ := os.ReadFile(sd.LogPath)
		t.Logf("private systemd console:\n%s", b)
		logs, _ := filepath.Glob(filepath.Join(h.cfg.SocketDir, "serve-*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", filepath.Base(l), b)
		}
	})
	return h
}

// open opens a Supervisor, closed (not its processes) by the cleanup.
func (h *supHarness) open(t *testing.T) *Supervisor {
	t.Helper()
	s, err := OpenSupervisor(ctxT(t), h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// routes sends loopback's TCP through the echoing proxy.
func (h *supHarness) routes(rev uint64) Config {
	return Config{Routes: []Route{{Guest: netip.MustParseAddr("127.0.0.1"),
		Egress: &Proxy{Name: "e1", Revision: rev, Address: h.socks.addr()}}}}
}

// connect opens a guest connection to the transparent listener and
// checks that it is carried.
func (h *supHarness) connect(t *testing.T, msg string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp4", h.cfg.TCPListen, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	echo(t, c, msg)
	return c
}

// serving is the Supervisor's serving generation; it fails without one.
func serving(t *testing.T, s *Supervisor) Generation {
	t.Helper()
	gs := s.Generations()
	if len(gs) == 0 || gs[len(gs)-1].Draining {
		t.Fatalf("no generation serves: %+v", gs)
	}
	return gs[len(gs)-1]
}

// hostPID is the host PID of g's main process.
func (h *supHarness) hostPID(t *testing.T, g Generation) int {
	t.Helper()
	u, err := h.m.Get(ctxT(t), g.Unit)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := h.m.MainHostPID(u)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// ended waits for g's unit to be gone.
func (h *supHarness) ended(t *testing.T, g Generation, timeout time.Duration) {
	t.Helper()
	testenv.WaitFor(t, timeout, g.Unit+" to end", func() (bool, string) {
		u, err := h.m.Get(ctxT(t), g.Unit)
		return err != nil || u.ActiveState == "inactive" || u.ActiveState == "failed", "unit " + u.ActiveState + "/" + u.SubState
	})
}

// closed waits for the far end to close c.
func closed(t *testing.T, c net.Conn, timeout time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	n, err := c.Read(make([]byte, 16))
	if n != 0 || err == nil || os.IsTimeout(err) {
		t.Fatalf("read on a connection that should be closed: %d bytes, %v", n, err)
	}
}

// logLine finds a log line with all of parts.
func (h *supHarness) logLine(parts ...string) bool {
	for _, l := range strings.Split(h.logs.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return true
		}
	}
	return false
}
