package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units"
)

// Configuration of the node child process.
const (
	envRoot     = "KBRB_ROOT"
	envPlatform = "KBRB_PLATFORM"
	envStatus   = "KBRB_STATUS"
	envStart    = "KBRB_START" // number of VMs to start (first run only)
	envParallel = "KBRB_PARALLEL"
	envMem      = "KBRB_MEM"
)

// nodeStatus is what a node child reports once it serves. Times are Unix
// nanoseconds so that the parent can measure from before it exec'd the child.
type nodeStatus struct {
	PID int
	// MainAt: main() entered; ConnectedAt: units.Connect returned;
	// OpenAt: runtime.Open returned (takeover done); StartedAt: the N VMs
	// were started (first run only); ExecAt: `true` answered on every VM.
	MainAt, ConnectedAt, OpenCallAt, OpenAt, StartedAt, ExecAt int64
	Started                                                    bool
	Instances                                                  []nodeInstance
	// ExecS is, per VM, OpenAt → its exec answered.
	ExecS map[string]float64
}

type nodeInstance struct {
	ID, InvocationID string
	MainPID          uint32
	HostPID          int
	State            runtime.State
	Responding       bool
}

// runNode is the child "node process": connect to the private systemd,
// Open the runtime (which takes over), start VMs on the first run, exec
// `true` on every VM, report, serve until killed.
func runNode() int {
	mainAt := time.Now()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "bench node: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	m, err := units.ConnectFromEnv(ctx)
	if err != nil {
		return fail(err)
	}
	st := nodeStatus{PID: os.Getpid(), MainAt: mainAt.UnixNano(), ConnectedAt: time.Now().UnixNano(), ExecS: map[string]float64{}}
	st.OpenCallAt = time.Now().UnixNano()
	rt, err := runtime.Open(ctx, runtime.Config{
		StorageRoot: os.Getenv(envRoot), NodeID: "bench", Units: m, Accel: qemu.AccelAuto,
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		// The VMs run on the Platform the bench built: the node's own.
		OwnInstallation: filepath.Base(os.Getenv(envPlatform)),
	})
	if err != nil {
		return fail(err)
	}
	openAt := time.Now()
	st.OpenAt = openAt.UnixNano()
	if n, _ := strconv.Atoi(os.Getenv(envStart)); n > 0 && len(rt.List()) == 0 {
		st.Started = true
		inst, err := platform.Load(os.Getenv(envPlatform))
		if err != nil {
			return fail(err)
		}
		par, _ := strconv.Atoi(os.Getenv(envParallel))
		mem, _ := strconv.Atoi(os.Getenv(envMem))
		sem := make(chan struct{}, max(par, 1))
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				t0 := time.Now()
				id := fmt.Sprintf("vm-%02d", i)
				_, errs[i] = rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, MemoryMiB: mem})
				fmt.Fprintf(os.Stderr, "bench node: started %s in %v (err %v)\n", id, time.Since(t0).Round(time.Millisecond), errs[i])
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return fail(err)
		}
		st.StartedAt = time.Now().UnixNano()
	}
	list := rt.List()
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, len(list))
	for i, s := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			errs[i] = execTrue(ctx, rt, s.ID)
			mu.Lock()
			st.ExecS[s.ID] = secs(time.Since(t0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	st.ExecAt = time.Now().UnixNano()
	for _, s := range rt.List() {
		st.Instances = append(st.Instances, nodeInstance{ID: s.ID, InvocationID: s.InvocationID, MainPID: s.MainPID, HostPID: s.HostPID, State: s.State, Responding: s.GuestResponding})
	}
	b, _ := json.Marshal(st)
	if err := storagepool.WriteFile(os.Getenv(envStatus), b, 0o600, storagepool.Temp{Purpose: "status"}); err != nil {
		return fail(err)
	}
	for {
		time.Sleep(time.Hour) // serve until killed
	}
}

// execTrue runs /bin/true in the guest (waiting for the guest session
// the runtime reconnects after a takeover) and checks it exits 0.
func execTrue(ctx context.Context, rt *runtime.Runtime, id string) error {
	ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p, err := rt.Exec(ectx, id, guestproto.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil {
		return err
	}
	defer p.Close()
	go io.Copy(io.Discard, p.Stderr)
	io.Copy(io.Discard, p.Stdout)
	exit, err := p.Wait()
	if err != nil {
		return fmt.Errorf("%s: /bin/true: %w", id, err)
	}
	if exit.ExitCode != 0 {
		return fmt.Errorf("%s: /bin/true exited %+v", id, exit)
	}
	return nil
}

type child struct {
	cmd       *exec.Cmd
	exited    chan struct{}
	status    string
	log       string
	spawnedAt time.Time
}

func (e *benchEnv) startChild(n, start int) (*child, error) {
	root := filepath.Join(e.scratch, "s")
	c := &child{
		exited: make(chan struct{}),
		status: filepath.Join(e.scratch, fmt.Sprintf("status-%d.json", n)),
		log:    filepath.Join(e.scratch, fmt.Sprintf("node-%d.log", n)),
	}
	logf2, err := os.Create(c.log)
	if err != nil {
		return nil, err
	}
	defer logf2.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	tg := e.sd.Target()
	c.cmd = exec.Command(self)
	c.cmd.Env = append(os.Environ(), nodeEnv+"=1", envRoot+"="+root,
		envPlatform+"="+e.inst.Dir, envStatus+"="+c.status,
		envStart+"="+strconv.Itoa(start), envParallel+"="+strconv.Itoa(e.o.parallel), envMem+"="+strconv.Itoa(e.o.memMiB))
	c.cmd.Env = append(c.cmd.Env, tg.Env()...)
	c.cmd.Stdout, c.cmd.Stderr = logf2, logf2
	c.spawnedAt = time.Now()
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { c.cmd.Wait(); close(c.exited) }()
	// Only the process started here, by its PID.
	e.cl.add(fmt.Sprintf("kill node child PID %d", c.cmd.Process.Pid), func() error { c.kill(); return nil })
	return c, nil
}

func (c *child) kill() {
	select {
	case <-c.exited:
	default:
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	}
}

func (c *child) wait(ctx context.Context, d time.Duration) (nodeStatus, error) {
	deadline := time.After(d)
	for {
		if b, err := os.ReadFile(c.status); err == nil {
			var st nodeStatus
			return st, json.Unmarshal(b, &st)
		}
		select {
		case <-c.exited:
			b, _ := os.ReadFile(c.log)
			return nodeStatus{}, fmt.Errorf("node process exited (%v) before serving; its log:\n%s", c.cmd.ProcessState, tailS(b, 4000))
		case <-deadline:
			b, _ := os.ReadFile(c.log)
			return nodeStatus{}, fmt.Errorf("node process did not report within %v; its log:\n%s", d, tailS(b, 4000))
		case <-ctx.Done():
			return nodeStatus{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func tailS(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// takeoverRound is one JSON line of -mode takeover.
type takeoverRound struct {
	Round int `json:"round"`
	VMs   int `json:"vms"`
	// From the parent's exec of the new node process:
	ToMainS    float64 `json:"to_main_s"`     // exec → main() (process start, Go init)
	ToOpenS    float64 `json:"to_open_s"`     // exec → runtime.Open returned, all N taken over
	ToAllExecS float64 `json:"to_all_exec_s"` // exec → `true` answered on all N guests
	// Inside the node process:
	ConnectS     float64 `json:"connect_s"`      // units.Connect
	OpenS        float64 `json:"open_s"`         // runtime.Open call → return
	OpenToExecS  float64 `json:"open_to_exec_s"` // Open returned → all N execs answered
	ExecMaxS     float64 `json:"exec_max_s"`
	ExecMedianS  float64 `json:"exec_median_s"`
	Restarted    int     `json:"restarted"`     // VMs whose InvocationID/MainPID/HostPID changed
	GuestRetries int     `json:"guest_retries"` // failed guest reconnect attempts (runtime log retry_in)
	Load         string  `json:"loadavg"`
}

func (e *benchEnv) takeover(ctx context.Context) error {
	n := e.o.vms
	e.cl.add("delete node VMs", func() error { return e.deleteAll() })
	logf("starting %d VMs (%d at a time, %d MiB) in node process 0", n, e.o.parallel, e.o.memMiB)
	t0 := time.Now()
	c, err := e.startChild(0, n)
	if err != nil {
		return err
	}
	first, err := c.wait(ctx, time.Duration(n)*time.Minute)
	if err != nil {
		return err
	}
	if !first.Started || len(first.Instances) != n {
		return fmt.Errorf("first node run did not start %d VMs: %+v", n, first)
	}
	startS := secs(time.Since(t0))
	logf("%d VMs started and exec'd in %.1fs (Open on an empty root %.3fs)", n, startS, float64(first.OpenAt-first.OpenCallAt)/1e9)
	emit(map[string]any{"phase": "start", "vms": n, "parallel": e.o.parallel, "mem_mib": e.o.memMiB, "start_all_s": startS,
		"start_only_s": float64(first.StartedAt-first.OpenAt) / 1e9, "loadavg": loadavg()})
	key := func(i nodeInstance) string {
		return fmt.Sprintf("%s inv %s main %d host %d", i.ID, i.InvocationID, i.MainPID, i.HostPID)
	}
	want := map[string]string{}
	for _, i := range first.Instances {
		want[i.ID] = key(i)
	}
	var rounds []takeoverRound
	for r := 1; r <= e.o.rounds; r++ {
		c.kill()
		if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			return fmt.Errorf("node process %d ended with %v, not SIGKILL", r-1, c.cmd.ProcessState)
		}
		if c, err = e.startChild(r, 0); err != nil {
			return err
		}
		st, err := c.wait(ctx, 3*time.Minute)
		if err != nil {
			return err
		}
		if st.Started {
			return fmt.Errorf("round %d started new VMs instead of taking over", r)
		}
		spawn := c.spawnedAt.UnixNano()
		tr := takeoverRound{
			Round: r, VMs: len(st.Instances),
			ToMainS: float64(st.MainAt-spawn) / 1e9, ToOpenS: float64(st.OpenAt-spawn) / 1e9, ToAllExecS: float64(st.ExecAt-spawn) / 1e9,
			ConnectS: float64(st.ConnectedAt-st.MainAt) / 1e9, OpenS: float64(st.OpenAt-st.OpenCallAt) / 1e9, OpenToExecS: float64(st.ExecAt-st.OpenAt) / 1e9,
			Load: loadavg(),
		}
		var ex []float64
		for _, v := range st.ExecS {
			ex = append(ex, v)
		}
		es := summarize(ex)
		tr.ExecMaxS, tr.ExecMedianS = es.Max, es.Median
		var problems []string
		for _, i := range st.Instances {
			if want[i.ID] != key(i) {
				tr.Restarted++
				problems = append(problems, fmt.Sprintf("%s, was %s", key(i), want[i.ID]))
			}
			if i.State != runtime.StateRunning {
				problems = append(problems, fmt.Sprintf("%s is %s", i.ID, i.State))
			}
		}
		if len(st.Instances) != n {
			problems = append(problems, fmt.Sprintf("%d instances taken over, want %d", len(st.Instances), n))
		}
		active, err := e.activeVMMs(ctx)
		if err != nil {
			return err
		}
		if active != n {
			problems = append(problems, fmt.Sprintf("%d active kibotos-vmm units, want %d", active, n))
		}
		if b, err := os.ReadFile(c.log); err == nil {
			tr.GuestRetries = countLines(b, "retry_in")
		}
		emit(tr)
		logf("round %d: exec→main %.3fs, exec→Open returned %.3fs (Open %.3fs, connect %.3fs), exec→all %d execs %.3fs; restarted %d, guest retries %d, load %s",
			r, tr.ToMainS, tr.ToOpenS, tr.OpenS, tr.ConnectS, tr.VMs, tr.ToAllExecS, tr.Restarted, tr.GuestRetries, tr.Load)
		if len(problems) > 0 {
			return fmt.Errorf("round %d: %v", r, problems)
		}
		rounds = append(rounds, tr)
	}
	c.kill()
	lst, get := e.unitQueryCost(ctx)
	var nq []float64
	for range 5 {
		t0 := time.Now()
		if _, _, err := runtime.NewQEMU("", qemu.AccelAuto); err != nil {
			return err
		}
		nq = append(nq, secs(time.Since(t0)))
	}
	newQEMU := summarize(nq)
	// runtime.Open in this process (no process start, no exec), 3 times,
	// right after the units.List timings: how much of Open is List.
	var op []float64
	for range 3 {
		t0 := time.Now()
		rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: filepath.Join(e.scratch, "s"), NodeID: "bench", Units: e.m, Accel: qemu.AccelAuto})
		if err != nil {
			return err
		}
		op = append(op, secs(time.Since(t0)))
		rt.Close()
	}
	inProcOpen := summarize(op)

	col := func(f func(takeoverRound) float64) stats {
		var xs []float64
		for _, r := range rounds {
			xs = append(xs, f(r))
		}
		return summarize(xs)
	}
	toOpen, toExec := col(func(r takeoverRound) float64 { return r.ToOpenS }), col(func(r takeoverRound) float64 { return r.ToAllExecS })
	open, toMain := col(func(r takeoverRound) float64 { return r.OpenS }), col(func(r takeoverRound) float64 { return r.ToMainS })
	openToExec := col(func(r takeoverRound) float64 { return r.OpenToExecS })
	emit(map[string]any{"summary": "takeover", "vms": n, "rounds": len(rounds), "to_main_s": toMain, "to_open_s": toOpen, "open_s": open,
		"open_to_exec_s": openToExec, "to_all_exec_s": toExec, "units_list_s": lst, "units_get_s": get, "new_qemu_s": newQEMU, "in_process_open_s": inProcOpen, "restarted": 0, "loadavg_start": e.loadStart, "loadavg_end": loadavg(), "cpus": numCPU()})
	fmt.Printf("\ntakeover of %d running VMs after kill -9 of the node process, %d rounds, %d MiB guests, %d CPUs, loadavg at start %s / end %s\n",
		n, len(rounds), e.o.memMiB, numCPU(), e.loadStart, loadavg())
	fmt.Printf("%-46s %8s %8s %8s\n", "", "median", "min", "max")
	row := func(name string, s stats) { fmt.Printf("%-46s %7.3fs %7.3fs %7.3fs\n", name, s.Median, s.Min, s.Max) }
	row("exec of node process → main()", toMain)
	row("exec → Open returned, all taken over", toOpen)
	row("  runtime.Open call → return", open)
	row("Open returned → `true` answered on all VMs", openToExec)
	row("exec → `true` answered on all VMs", toExec)
	row(fmt.Sprintf("units.List(kibotos-vmm-*) of %d units (in Open)", n), lst)
	row("  one units.Get (2 D-Bus property reads)", get)
	row("runtime.NewQEMU (accel choice, TSC kHz; in Open)", newQEMU)
	row("runtime.Open in the benchmark process (3x)", inProcOpen)
	fmt.Printf("restarted VMs: 0 of %d in every round (InvocationID, MainPID, host PID unchanged); target: exec → Open < 1s\n", n)
	return nil
}

func (e *benchEnv) activeVMMs(ctx context.Context) (int, error) {
	l, err := e.m.List(ctx, runtime.UnitPrefix+"*")
	if err != nil {
		return 0, err
	}
	k := 0
	for _, u := range l {
		if u.Active() {
			k++
		}
	}
	return k, nil
}

// deleteAll takes over once more in this process and deletes every VM.
func (e *benchEnv) deleteAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(e.scratch, "s")); err != nil {
		return nil
	}
	rt, err := runtime.Open(ctx, runtime.Config{StorageRoot: filepath.Join(e.scratch, "s"), NodeID: "bench", Units: e.m, Accel: qemu.AccelAuto})
	if err != nil {
		return err
	}
	defer rt.Close()
	t0 := time.Now()
	// Instances taken over before their guest answered are STARTING (the
	// runtime waits for the guest) and Delete refuses them: wait a little.
	for time.Since(t0) < 30*time.Second {
		starting := false
		for _, s := range rt.List() {
			starting = starting || s.State == runtime.StateStarting
		}
		if !starting {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	list := rt.List()
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	errs := make([]error, len(list))
	for i, s := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = rt.Delete(ctx, s.ID)
		}()
	}
	wg.Wait()
	if len(list) > 0 {
		logf("deleted %d VMs in %v", len(list), time.Since(t0).Round(time.Millisecond))
	}
	return errors.Join(errs...)
}

func countLines(b []byte, s string) int {
	k := 0
	for _, l := range bytes.Split(b, []byte("\n")) {
		if bytes.Contains(l, []byte(s)) {
			k++
		}
	}
	return k
}

// unitQueryCost times units.List over the running VMM units (what Open's
// takeover does first) and a single units.Get, 5 times each.
func (e *benchEnv) unitQueryCost(ctx context.Context) (list, get stats) {
	var ls, gs []float64
	for range 5 {
		t0 := time.Now()
		l, err := e.m.List(ctx, runtime.UnitPrefix+"*")
		if err != nil || len(l) == 0 {
			return
		}
		ls = append(ls, secs(time.Since(t0)))
		t1 := time.Now()
		if _, err := e.m.Get(ctx, l[0].Name); err != nil {
			return
		}
		gs = append(gs, secs(time.Since(t1)))
	}
	return summarize(ls), summarize(gs)
}
