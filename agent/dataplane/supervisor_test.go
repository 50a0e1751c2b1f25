package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// testRevision is stamped into the binary under test and set in this test
// process, so the node side and the unit are "the same build".
const testRevision = "dataplane-supervisor-test"

// builds caches kibotos binaries by release and revision for the package's
// tests (TestMain removes them): linking one takes seconds.
var builds struct {
	sync.Mutex
	dir  string
	bins map[string]string
}

func TestMain(m *testing.M) {
	privsd.RunIfInit()
	code := m.Run()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	os.Exit(code)
}

// buildKibotos builds this tree as the build of testRevision.
func buildKibotos(t *testing.T, _ string) string { return buildRelease(t, "", testRevision) }

// buildRelease builds this tree stamped with release (empty: unreleased)
// and revision, as scripts/build.sh stamps a release.
func buildRelease(t *testing.T, release, revision string) string {
	t.Helper()
	builds.Lock()
	defer builds.Unlock()
	key := release + "@" + revision
	if bin, ok := builds.bins[key]; ok {
		return bin
	}
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "kibotos-dataplane-test-")
		if err != nil {
			t.Fatal(err)
		}
		builds.dir, builds.bins = dir, map[string]string{}
	}
	out := filepath.Join(builds.dir, fmt.Sprintf("kibotos-%d", len(builds.bins)))
	ldflags := "-X github.com/kibotos/kibotos/buildinfo.Revision=" + revision
	if release != "" {
		ldflags += " -X github.com/kibotos/kibotos/buildinfo.Release=" + release
	}
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, "github.com/kibotos/kibotos")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build kibotos %s: %v\n%s", key, err, b)
	}
	// The private systemd's units run it; the temporary directory's
	// parents must let root reach it, which they do.
	builds.bins[key] = out
	return out
}

func setRevision(t *testing.T, rev string) {
	old := buildinfo.Revision
	buildinfo.Revision = rev
	t.Cleanup(func() { buildinfo.Revision = old })
}

func TestSupervisorAdoptsAndStops(t *testing.T) {
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := buildKibotos(t, dir)
	_, m := runtimetest.Systemd(t, filepath.Join(dir, "sd"))
	setRevision(t, testRevision)
	logs := &testenv.Buffer{}
	const grace = 3 * time.Second
	cfg := SupervisorConfig{Units: m, Executable: bin, Scope: ScopeFor(filepath.Join(dir, "run")),
		SocketDir: filepath.Join(dir, "dp"), Listen: "127.0.0.1:0", Grace: grace,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", logs.String())
		}
	})

	// First start: generation 1 with the process-model unit properties.
	h1, err := Ensure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h1.Adopted || h1.Generation != 1 || h1.Unit != UnitName(cfg.Scope, 1) || h1.MainPID == 0 {
		t.Fatalf("first Ensure: %+v", h1)
	}
	u, err := m.Get(ctx, h1.Unit)
	if err != nil {
		t.Fatal(err)
	}
	if u.Slice != units.DataPlaneSlice || !u.Active() || u.OOMScoreAdjust != -900 {
		t.Fatalf("unit %+v: want active in %s with OOMScoreAdjust=-900", u, units.DataPlaneSlice)
	}
	hostPID, err := m.MainHostPID(u)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel value needs CAP_SYS_RESOURCE, which some test hosts (this
	// container) lack; systemd then leaves it and says nothing.
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", hostPID))
	if adj := strings.TrimSpace(string(b)); adj != "-900" {
		t.Logf("oom_score_adj of the data plane is %s: this host cannot lower it (no CAP_SYS_RESOURCE); the unit asks for -900", adj)
	}

	// State, then a connection through the unit to an in-process guest.
	p := newPKI(t, "node-a")
	sock := startGuest(t, dir, "inst-1")
	st := p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock})
	if err := h1.Push(ctx, st); err != nil {
		t.Fatal(err)
	}
	c := connect(t, p, p.cred(t, h1.Address(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c, nil, "echo", "gen1"); out != "gen1\n" {
		t.Fatalf("exec through generation 1: %q", out)
	}

	// A node restart finds the same build with the same address: adopted,
	// not restarted, and the open connection is unaffected.
	h1b, err := Ensure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !h1b.Adopted || h1b.Unit != h1.Unit || h1b.MainPID != h1.MainPID || h1b.Address() != h1.Address() || !h1b.Hello.StateApplied {
		t.Fatalf("second Ensure: %+v, want generation 1 adopted (%+v)", h1b, h1)
	}
	if err := h1b.Push(ctx, st); err != nil {
		t.Fatal(err)
	}
	if out, _, _ := run(t, c, nil, "echo", "adopted"); out != "adopted\n" {
		t.Fatalf("exec after adoption: %q", out)
	}

	// Stopping the unit: the open connection keeps working for the grace,
	// new connections are refused, then it is closed.
	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- m.Stop(ctx, h1.Unit) }()
	testenv.WaitFor(t, 20*time.Second, "the unit to be stopping", func() (bool, string) {
		u, err := m.Get(ctx, h1.Unit)
		return errors.Is(err, units.ErrNotFound) || (err == nil && u.ActiveState == "deactivating"), fmt.Sprintf("unit %s/%s, %v", u.ActiveState, u.SubState, err)
	})
	if out, _, _ := run(t, c, nil, "echo", "grace"); out != "grace\n" {
		t.Fatalf("exec during the grace: %q", out)
	}
	if _, err := Connect(ctx, p.cred(t, h1.Address(), "ws-a", "inst-1"), p.pool); err == nil {
		t.Fatal("a new connection was accepted by a stopping data plane")
	}
	waitClosed(t, c.Done(), grace+10*time.Second, "the connection to be closed after the grace")
	if el := time.Since(t0); el < grace {
		t.Fatalf("connection closed %v after the stop, before the grace of %v", el, grace)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}

	// Nothing runs: the next Ensure starts generation 2 (the counter
	// survived the unit being collected).
	h2, err := Ensure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Adopted || h2.Generation != 2 {
		t.Fatalf("Ensure after the stop: %+v, want a new generation 2", h2)
	}
	// A push times out against nothing: the warning is logged.
	gone := &Handle{Unit: "none", Generation: 99, socketDir: cfg.SocketDir, log: cfg.Logger}
	if err := gone.Push(ctx, st); err == nil || !strings.Contains(logs.String(), "data-plane generation did not take the node's state before the reply") {
		t.Fatalf("push to a missing generation: %v; log:\n%s", err, logs.String())
	}
	// A generation that is alive but does not answer (stopped here; a
	// stalled process on a loaded host) holds the node's reply to ctrl
	// for PushTimeout at most, then the push gives up.
	u2, err := m.Get(ctx, h2.Unit)
	if err != nil {
		t.Fatal(err)
	}
	pid2, err := m.MainHostPID(u2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid2, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := sync.OnceFunc(func() { syscall.Kill(pid2, syscall.SIGCONT) })
	t.Cleanup(continued)
	// kill returns before every thread has stopped: a push right after it
	// could still be answered (CI saw one).
	testenv.WaitFor(t, 20*time.Second, "every thread of the data plane to stop", func() (bool, string) { return allStopped(pid2), "" })
	if err := h2.Push(ctx, st); !errors.Is(err, ErrNotAcknowledged) {
		t.Fatalf("push to a stopped generation: %v; want ErrNotAcknowledged within PushTimeout", err)
	}
	continued()
	if err := h2.Push(ctx, st); err != nil {
		t.Fatalf("push once the generation runs again: %v", err)
	}

	// Another build, unreleased (on no release line): generation 2 is
	// ended, generation 3 started.
	setRevision(t, "another-build")
	h3, err := Ensure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h3.Adopted || h3.Generation != 3 {
		t.Fatalf("Ensure with another build: %+v, want generation 3", h3)
	}
	if u, err := m.Get(ctx, h2.Unit); err == nil && u.Active() {
		t.Fatalf("generation 2 still runs: %+v", u)
	}
	if err := h3.Push(ctx, st); err != nil {
		t.Fatal(err)
	}
	c3 := connect(t, p, p.cred(t, h3.Address(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c3, nil, "echo", "gen3"); out != "gen3\n" {
		t.Fatalf("exec through generation 3: %q", out)
	}
	c3.Close()
	if err := m.Stop(ctx, h3.Unit); err != nil {
		t.Fatal(err)
	}
}

// allStopped says whether every thread of pid is stopped (state T).
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name in parentheses.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
