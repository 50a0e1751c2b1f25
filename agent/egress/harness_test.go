package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// The test binary doubles as the egress process (helperEnv=process) and as
// a control client of another uid (helperEnv=dial), so tests can run the
// real process under nsenter, as the nobody user, in a lab namespace; and
// as `kibotos egress serve` (helperServe), the command a Supervisor's
// units run.
const (
	helperEnv = "KIBOTOS_EGRESS_TEST_HELPER"
	nobody    = 65534
)

func TestMain(m *testing.M) {
	privsd.RunIfInit()
	if len(os.Args) > 2 && os.Args[1] == "egress" && os.Args[2] == "serve" {
		os.Exit(helperServe(os.Args[3:]))
	}
	switch os.Getenv(helperEnv) {
	case "process":
		os.Exit(helperProcess())
	case "dial":
		os.Exit(helperDial())
	}
	code := m.Run()
	if exeDir != "" {
		os.RemoveAll(exeDir)
	}
	os.Exit(code)
}

func helperProcess() int {
	if os.Getenv("EGRESS_CHECK_UNPRIVILEGED") == "1" {
		if err := CheckUnprivileged(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	gen, _ := strconv.ParseUint(os.Getenv("EGRESS_GENERATION"), 10, 64)
	grace, _ := time.ParseDuration(os.Getenv("EGRESS_GRACE"))
	// The process's warm pool is the product's, as `kibotos egress serve`
	// keeps; EGRESS_WARM (inherited from the go test environment) sets
	// another, e.g. 0 to measure BenchmarkConnect without one.
	warm := DefaultWarmConnections
	if v, ok := os.LookupEnv("EGRESS_WARM"); ok {
		warm, _ = strconv.Atoi(v)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := RunProcess(context.Background(), Options{SocketDir: os.Getenv("EGRESS_SOCKET_DIR"), Generation: gen, WarmConnections: warm, Logger: log}, grace); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// helperDial connects and prints what happened: "ok" or the error.
func helperDial() int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, os.Getenv("EGRESS_SOCKET"))
	if err != nil {
		fmt.Println(err)
		return 0
	}
	c.Close()
	fmt.Println("ok")
	return 0
}

// exeDir holds a copy of the test binary other users can run (go test's
// build directory is root's, mode 0700).
var (
	exeOnce sync.Once
	exeDir  string
	exeErr  error
)

func sharedExe(t testing.TB) string {
	t.Helper()
	exeOnce.Do(func() {
		exeDir, exeErr = os.MkdirTemp("", "kibotos-egress-test-")
		if exeErr != nil {
			return
		}
		if exeErr = os.Chmod(exeDir, 0o755); exeErr != nil {
			return
		}
		self, err := os.Executable()
		if err != nil {
			exeErr = err
			return
		}
		b, err := os.ReadFile(self)
		if err != nil {
			exeErr = err
			return
		}
		exeErr = os.WriteFile(filepath.Join(exeDir, "egress.test"), b, 0o755)
	})
	if exeErr != nil {
		t.Fatalf("copy the test binary for other users: %v", exeErr)
	}
	return filepath.Join(exeDir, "egress.test")
}

// socketDir makes a socket directory as the node would: owned by uid,
// mode 0700, under a directory uid can enter.
func socketDir(t testing.TB, uid int) string {
	t.Helper()
	sharedExe(t)
	dir, err := os.MkdirTemp(exeDir, "sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	return dir
}

// proc is an egress process the test started (and kills by its PID).
type proc struct {
	cmd     *exec.Cmd
	socket  string
	logPath string
	exited  chan struct{}
	waitErr error
}

// startProcess runs the egress process in the network namespace at nsPath
// ("" for this one) as uid (nobody: without capabilities, checked).
func startProcess(t testing.TB, nsPath string, uid int, gen uint64, grace time.Duration) *proc {
	t.Helper()
	exe := sharedExe(t)
	dir := socketDir(t, uid)
	var args []string
	if nsPath != "" {
		args = append(args, "--net="+nsPath)
	}
	if uid != 0 {
		args = append(args, "--setuid", strconv.Itoa(uid), "--setgid", strconv.Itoa(uid))
	}
	args = append(args, "--", exe, "-test.run=^$")
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), helperEnv+"=process", "EGRESS_SOCKET_DIR="+dir,
		"EGRESS_GENERATION="+strconv.FormatUint(gen, 10), "EGRESS_GRACE="+grace.String())
	if uid != 0 {
		cmd.Env = append(cmd.Env, "EGRESS_CHECK_UNPRIVILEGED=1")
	}
	logPath := filepath.Join(t.TempDir(), "egress.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start egress process: %v", err)
	}
	p := &proc{cmd: cmd, socket: ControlSocket(dir, gen), logPath: logPath, exited: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill() // nsenter execs the binary: this is its PID
			<-p.exited
		}
		if t.Failed() {
			t.Logf("egress process log:\n%s", p.log())
		}
	})
	testenv.WaitFor(t, 10*time.Second, "the egress control socket", func() (bool, string) {
		select {
		case <-p.exited:
			t.Fatalf("egress process exited: %v\n%s", p.waitErr, p.log())
		default:
		}
		// The file appears at bind, a moment before listen: dial it.
		c, err := net.Dial("unix", p.socket)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return p
}

func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// dial connects a Client to the process.
func (p *proc) dial(t testing.TB) *Client {
	t.Helper()
	c, err := Dial(ctxT(t), p.socket)
	if err != nil {
		t.Fatalf("dial egress: %v\n%s", err, p.log())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// wait waits for the process to exit and returns its exit error.
func (p *proc) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		t.Fatalf("egress process still running after %v\n%s", timeout, p.log())
		return nil
	}
}

// startServer runs a Server in this process (root, this namespace).
func startServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.SocketDir == "" {
		opts.SocketDir = t.TempDir()
		if err := os.Chmod(opts.SocketDir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Generation == 0 {
		opts.Generation = 1
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("egress server: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return s
}

func (s *Server) socket() string { return ControlSocket(s.opts.SocketDir, s.opts.Generation) }

// testLogger sends the server's log to the test log while the test runs.
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(b)))
	}
	return len(b), nil
}

// logBuffer collects a server's log for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
