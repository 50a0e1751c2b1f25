// Command runtime benchmarks agent/runtime against raw QEMU: boot latency
// (node Start vs. qemu-system-x86_64 started directly with the same argv)
// and takeover of running VMs by a restarted (kill -9) node process.
//
//	go run ./bench/runtime -mode boot -runs 10
//	go run ./bench/runtime -mode takeover -vms 20
//	go run ./bench/runtime -mode workspace -runs 10 -execs 200
//
// It needs root, qemu-system-x86_64, systemd (a private systemd is started
// through vmm/units/privsd) and dpkg (Platform build). Results are JSON
// lines on stdout followed by a table; progress goes to stderr.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// nodeEnv marks the re-executed takeover child ("node process").
const nodeEnv = "KIBOTOS_BENCH_RUNTIME_NODE"

type options struct {
	mode        string
	runs        int
	execs       int
	vms         int
	parallel    int
	rounds      int
	memMiB      int
	platformDir string
	keep        bool
}

func main() {
	privsd.RunIfInit() // as the private systemd's PID 1, this never returns
	if os.Getenv(nodeEnv) != "" {
		os.Exit(runNode())
	}
	var o options
	flag.StringVar(&o.mode, "mode", "boot", "boot, takeover or workspace")
	flag.IntVar(&o.runs, "runs", 10, "boot, workspace: samples of each kind (raw and node/workspace), alternated")
	flag.IntVar(&o.execs, "execs", 200, "workspace: execs of /bin/true over the data plane and over the raw guest session, alternated")
	flag.IntVar(&o.vms, "vms", 20, "takeover: VMs to start and take over")
	flag.IntVar(&o.parallel, "parallel", 2, "takeover: VMs started at a time")
	flag.IntVar(&o.rounds, "rounds", 3, "takeover: kill -9 + restart rounds")
	flag.IntVar(&o.memMiB, "mem", 256, "guest memory (MiB)")
	flag.StringVar(&o.platformDir, "platform", "", "existing Platform installation directory (default: build one, kernel cached in $TMPDIR/kibotos-test-platform)")
	flag.BoolVar(&o.keep, "keep", false, "keep the scratch directory (logs) at the end")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := &cleaner{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, cl) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		logf("interrupted: cleaning up")
		select {
		case err = <-done:
		case <-time.After(45 * time.Second):
			err = errors.New("interrupted; the benchmark did not stop within 45s")
		}
		if err == nil {
			err = ctx.Err()
		}
	}
	if cerr := cl.run(); cerr != nil {
		logf("cleanup: %v", cerr)
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		logf("error: %v", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, cl *cleaner) error {
	if err := preflight(); err != nil {
		return err
	}
	load := loadavg()
	scratch, err := os.MkdirTemp("/tmp", "kbrb-")
	if err != nil {
		return err
	}
	cl.add("remove "+scratch, func() error {
		if o.keep {
			logf("kept %s", scratch)
			return nil
		}
		return os.RemoveAll(scratch)
	})
	if o.mode == "workspace" {
		// kibotos dev brings its own Platform and private systemd.
		return workspaceMode(ctx, o, cl, scratch, load)
	}
	inst, err := loadPlatform(ctx, o, scratch)
	if err != nil {
		return err
	}
	sd, err := privsd.Start(ctx, filepath.Join(scratch, "sd"))
	if err != nil {
		return err
	}
	cl.add("stop private systemd", sd.Stop)
	logf("private systemd host PID %d up in %v", sd.PID, sd.BootTime.Round(time.Millisecond))
	m, err := units.Connect(ctx, sd.Target())
	if err != nil {
		return err
	}
	cl.add("close units connection", func() error { m.Close(); return nil })
	env := benchEnv{o: o, scratch: scratch, inst: inst, sd: sd, m: m, cl: cl, loadStart: load}
	switch o.mode {
	case "boot":
		return env.boot(ctx)
	case "takeover":
		return env.takeover(ctx)
	}
	return fmt.Errorf("-mode %q: want boot, takeover or workspace", o.mode)
}

type benchEnv struct {
	o         options
	scratch   string
	inst      *platform.Installation
	sd        *privsd.Instance
	m         *units.Manager
	cl        *cleaner
	loadStart string
}

func preflight() error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"qemu-system-x86_64", "dpkg", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if err := privsd.Available(); err != nil {
		missing = append(missing, err.Error())
	}
	if len(missing) > 0 {
		return fmt.Errorf("cannot run here: missing %s", strings.Join(missing, ", "))
	}
	return nil
}

// loadPlatform loads -platform or builds one the way the runtime tests do.
func loadPlatform(ctx context.Context, o options, scratch string) (*platform.Installation, error) {
	if o.platformDir != "" {
		return platform.Load(o.platformDir)
	}
	t0 := time.Now()
	bin := filepath.Join(scratch, "kibotos")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "github.com/kibotos/kibotos")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build kibotos: %v\n%s", err, out)
	}
	inst, err := platform.Build(ctx, platform.Options{
		StorageRoot: filepath.Join(scratch, "platform"),
		CacheDir:    filepath.Join(os.TempDir(), "kibotos-test-platform"),
		AgentBinary: bin,
	})
	if err != nil {
		return nil, err
	}
	logf("platform %s (kernel %s) ready in %v", inst.ID, inst.KernelVersion, time.Since(t0).Round(time.Millisecond))
	return inst, nil
}

// cleaner runs registered cleanups once, last registered first.
type cleaner struct {
	mu   sync.Mutex
	fns  []func() error
	what []string
	done bool
}

func (c *cleaner) add(what string, fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
	c.what = append(c.what, what)
}

func (c *cleaner) run() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return nil
	}
	c.done = true
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		if err := c.fns[i](); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.what[i], err))
		}
	}
	return errors.Join(errs...)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// emit prints one JSON line on stdout.
func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// vmRSSKiB is VmRSS of pid.
func vmRSSKiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return -1
}

type stats struct {
	N                     int
	Min, Median, P95, Max float64
}

func summarize(xs []float64) stats {
	if len(xs) == 0 {
		return stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return stats{N: len(s), Min: s[0], Median: quantile(s, 0.5), P95: quantile(s, 0.95), Max: s[len(s)-1]}
}

// quantile interpolates linearly between closest ranks of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	pos := q * float64(len(s)-1)
	lo := int(pos)
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	frac := pos - float64(lo)
	return s[lo] + frac*(s[lo+1]-s[lo])
}

func secs(d time.Duration) float64 { return float64(d.Microseconds()) / 1e6 }

func quietLogger(w *logSink) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logSink collects the runtime's JSON log lines.
type logSink struct {
	mu    sync.Mutex
	lines []string
	part  string
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.part + string(p)
	parts := strings.Split(s, "\n")
	l.part = parts[len(parts)-1]
	l.lines = append(l.lines, parts[:len(parts)-1]...)
	return len(p), nil
}

// find returns the last log record with msg and instance_id.
func (l *logSink) find(msg, id string) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.lines) - 1; i >= 0; i-- {
		var e map[string]any
		if json.Unmarshal([]byte(l.lines[i]), &e) == nil && e["msg"] == msg && (id == "" || e["instance_id"] == id) {
			return e
		}
	}
	return nil
}
