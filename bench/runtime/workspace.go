package main

// -mode workspace: the user-facing path (`kibotos dev`, `kibo workspace
// create/exec`, the data plane) against a raw QEMU boot of the same
// Platform, alternated in one run.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/hostprobe"

	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/qemu"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// wsSample is one JSON line of -mode workspace, phase create_exec.
type wsSample struct {
	Phase string `json:"phase"` // create_exec
	Kind  string `json:"kind"`  // workspace or raw
	Run   int    `json:"run"`
	// TotalS: create issued → first exec returned 0 (workspace); QEMU
	// process start → first exec returned 0 (raw).
	TotalS float64 `json:"total_s"`
	// CreateS (workspace): `kibo workspace create` (returns at AVAILABLE).
	CreateS float64 `json:"create_s,omitempty"`
	// BootS (raw): process start → GuestInfo answered.
	BootS float64 `json:"boot_s,omitempty"`
	// ExecS: the first exec alone (`kibo workspace exec WS -- true` / one
	// guestproto Exec of /bin/true over the raw VM's session).
	ExecS float64 `json:"exec_s"`
	// From ctrl's record (same host clock), read after the exec: issue →
	// created_at (CLI start, POST), created_at → updated_at (placement, node
	// start, guest ready: AVAILABLE), updated_at → create returned (the
	// CLI's polling of the state, process exit).
	ToCreatedS   float64 `json:"to_created_s,omitempty"`
	ToAvailableS float64 `json:"created_to_available_s,omitempty"`
	AfterAvailS  float64 `json:"available_to_return_s,omitempty"`
	// StopS: `kibo workspace delete` (workspace) / SIGKILL + wait (raw); not in TotalS.
	StopS     float64 `json:"stop_s"`
	Workspace string  `json:"workspace,omitempty"`
	Load      string  `json:"loadavg"`
}

// execSample is one JSON line of -mode workspace, phase exec.
type execSample struct {
	Phase string  `json:"phase"` // exec
	Kind  string  `json:"kind"`  // dataplane or raw
	I     int     `json:"i"`
	ExecS float64 `json:"exec_s"` // Exec → Wait returned exit 0
	Load  string  `json:"loadavg"`
}

// devCluster is one `kibotos dev` in the scratch directory.
type devCluster struct {
	bin, dir, addr, cache, log string
	cmd                        *exec.Cmd
	done                       chan struct{}
	releasePorts               func() // the reservation of addr's ports
}

// workspaceMode runs -mode workspace. It needs no Platform or private systemd
// of its own: `kibotos dev` builds both, and the raw boots use the dev
// cluster's Platform (the same kernel and initramfs its Workspaces boot).
func workspaceMode(ctx context.Context, o options, cl *cleaner, scratch, loadStart string) error {
	d, err := startDev(ctx, cl, scratch)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := d.waitReady(ctx, 5*time.Minute); err != nil {
		return err
	}
	logf("dev cluster READY in %v (log %s)", time.Since(t0).Round(time.Millisecond), d.log)
	insts, err := platform.List(datadir.Dir(d.dir).StorageRoot())
	if len(insts) == 0 {
		return fmt.Errorf("no Platform in the dev cluster's storage (%v)", err)
	}
	inst := insts[0] // newest: the one kibotos dev just built or found
	logf("raw boots use the dev Platform %s (kernel %s)", inst.ID[:19], inst.KernelVersion)
	backend, choice, err := runtime.NewQEMU("", qemu.AccelAuto)
	if err != nil {
		return err
	}
	logf("accel %s: %s", choice.Accel, choice.Reason)
	e := &benchEnv{o: o, scratch: scratch, inst: inst, cl: cl, loadStart: loadStart}
	rawDir := filepath.Join(scratch, "raw")
	if err := os.MkdirAll(rawDir, 0o700); err != nil {
		return err
	}
	spec := runtime.Spec{Installation: inst, MemoryMiB: o.memMiB}

	// 1. create → first exec, alternated with raw boot → first exec.
	var wss, raws []wsSample
	for i := 0; i < o.runs; i++ {
		order := []string{"raw", "workspace"}
		if i%2 == 1 {
			order = []string{"workspace", "raw"}
		}
		for _, kind := range order {
			var s wsSample
			var err error
			if kind == "raw" {
				s, err = e.rawCreateExec(ctx, backend, spec, filepath.Join(rawDir, fmt.Sprint(i)))
			} else {
				s, err = d.createExec(ctx, o.memMiB)
			}
			if err != nil {
				return fmt.Errorf("run %d %s: %w", i, kind, err)
			}
			s.Run = i
			emit(s)
			if kind == "raw" {
				logf("run %d raw       boot→exec %.3fs (boot %.3fs, exec %.3fs) stop %.3fs load %s", i, s.TotalS, s.BootS, s.ExecS, s.StopS, s.Load)
				raws = append(raws, s)
			} else {
				logf("run %d workspace create→exec %.3fs (create %.3fs [ctrl created→AVAILABLE %.3fs, then %.3fs until the CLI returned], exec %.3fs) delete %.3fs load %s",
					i, s.TotalS, s.CreateS, s.ToAvailableS, s.AfterAvailS, s.ExecS, s.StopS, s.Load)
				wss = append(wss, s)
			}
		}
	}

	// 2. exec round trip: one data-plane session vs. the raw VM's guest
	// session, execs alternated one by one while both VMs run.
	ws, err := d.create(ctx, o.memMiB)
	if err != nil {
		return err
	}
	logf("exec round trip: Workspace %s AVAILABLE; booting the raw VM", ws)
	var dps, rxs []execSample
	var connectS float64
	const warm = 3
	_, err = e.rawBoot(ctx, backend, spec, filepath.Join(rawDir, "exec"), func(raw *guestproto.Client, _ time.Time) error {
		t0 := time.Now()
		dp, err := d.connect(ctx, ws)
		if err != nil {
			return err
		}
		defer dp.Close()
		connectS = secs(time.Since(t0))
		logf("data-plane session open in %.3fs (credential + TLS + guest hello); %d warm-up execs each, then %d alternated", connectS, warm, o.execs)
		clients := map[string]*guestproto.Client{"dataplane": dp, "raw": raw}
		for j := -warm; j < o.execs; j++ {
			order := []string{"raw", "dataplane"}
			if j%2 != 0 {
				order = []string{"dataplane", "raw"}
			}
			for _, kind := range order {
				took, err := execTrueOver(ctx, clients[kind])
				if err != nil {
					return fmt.Errorf("exec %d over %s: %w", j, kind, err)
				}
				if j < 0 {
					continue
				}
				s := execSample{Phase: "exec", Kind: kind, I: j, ExecS: secs(took), Load: loadavg()}
				emit(s)
				if kind == "raw" {
					rxs = append(rxs, s)
				} else {
					dps = append(dps, s)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("exec round trip: %w", err)
	}
	if _, err := d.kibo(ctx, 3*time.Minute, "workspace", "delete", ws); err != nil {
		return err
	}

	// Summary.
	col := func(ss []wsSample, f func(wsSample) float64) stats {
		var out []float64
		for _, s := range ss {
			out = append(out, f(s))
		}
		return summarize(out)
	}
	ecol := func(ss []execSample) stats {
		var out []float64
		for _, s := range ss {
			out = append(out, s.ExecS)
		}
		return summarize(out)
	}
	total := func(s wsSample) float64 { return s.TotalS }
	wt, rt := col(wss, total), col(raws, total)
	wc := col(wss, func(s wsSample) float64 { return s.CreateS })
	rb := col(raws, func(s wsSample) float64 { return s.BootS })
	we, re := col(wss, func(s wsSample) float64 { return s.ExecS }), col(raws, func(s wsSample) float64 { return s.ExecS })
	wtc := col(wss, func(s wsSample) float64 { return s.ToCreatedS })
	wta := col(wss, func(s wsSample) float64 { return s.ToAvailableS })
	waa := col(wss, func(s wsSample) float64 { return s.AfterAvailS })
	wd, rs := col(wss, func(s wsSample) float64 { return s.StopS }), col(raws, func(s wsSample) float64 { return s.StopS })
	de, xe := ecol(dps), ecol(rxs)
	loadEnd := loadavg()
	emit(map[string]any{
		"summary": "workspace", "runs": o.runs, "execs": o.execs, "mem_mib": o.memMiB, "accel": choice.Accel, "platform": inst.ID,
		"ws_create_exec_s": wt, "raw_boot_exec_s": rt, "ratio_p50": wt.Median / rt.Median, "ratio_p95": wt.P95 / rt.P95,
		"ws_create_s": wc, "ws_to_created_s": wtc, "ws_created_to_available_s": wta, "ws_available_to_return_s": waa, "ws_first_exec_s": we, "ws_delete_s": wd, "raw_boot_s": rb, "raw_first_exec_s": re, "raw_stop_s": rs,
		"dp_exec_s": de, "raw_exec_s": xe, "exec_diff_p50_ms": (de.Median - xe.Median) * 1000, "exec_diff_p95_ms": (de.P95 - xe.P95) * 1000,
		"exec_ratio_p50": de.Median / xe.Median, "exec_ratio_p95": de.P95 / xe.P95, "dp_connect_s": connectS,
		"loadavg_start": loadStart, "loadavg_end": loadEnd, "cpus": numCPU(),
	})
	fmt.Printf("\nworkspace, %d runs each (alternated), %d MiB guest, 1 vCPU, accel %s, %d CPUs, loadavg at start %s / end %s\n",
		o.runs, o.memMiB, choice.Accel, numCPU(), loadStart, loadEnd)
	fmt.Printf("%-44s %8s %8s %8s %8s\n", "", "p50", "p95", "min", "max")
	row := func(name string, s stats) {
		fmt.Printf("%-44s %7.3fs %7.3fs %7.3fs %7.3fs\n", name, s.Median, s.P95, s.Min, s.Max)
	}
	row("workspace: create issued → exec `true` = 0", wt)
	row("  kibo workspace create (→ AVAILABLE)", wc)
	row("    issue → ctrl created_at", wtc)
	row("    created_at → updated_at (AVAILABLE)", wta)
	row("    updated_at → create returned (polling)", waa)
	row("  kibo workspace exec WS -- true", we)
	row("raw: QEMU start → exec `true` = 0", rt)
	row("  QEMU start → GuestInfo answered", rb)
	row("  first Exec /bin/true (guestproto)", re)
	fmt.Printf("%-44s %7.2f  %7.2f    (target ≤ 1.15)\n", "ratio workspace/raw", wt.Median/rt.Median, wt.P95/rt.P95)
	row("kibo workspace delete (not timed above)", wd)
	fmt.Printf("\nexec round trip, %d execs of /bin/true each (alternated, after %d warm-up), one session each\n", o.execs, warm)
	fmt.Printf("%-44s %8s %8s %8s %8s\n", "", "p50", "p95", "min", "max")
	msrow := func(name string, s stats) {
		fmt.Printf("%-44s %6.2fms %6.2fms %6.2fms %6.2fms\n", name, s.Median*1000, s.P95*1000, s.Min*1000, s.Max*1000)
	}
	msrow("data plane (TLS, relay) Exec → Wait", de)
	msrow("raw guest session Exec → Wait", xe)
	fmt.Printf("%-44s %+6.2fms %+6.2fms            (target < 5 ms)\n", "difference dataplane − raw", (de.Median-xe.Median)*1000, (de.P95-xe.P95)*1000)
	fmt.Printf("%-44s %7.2f  %7.2f\n", "ratio dataplane/raw", de.Median/xe.Median, de.P95/xe.P95)
	fmt.Printf("%-44s %7.3fs\n", "data-plane session open (credential+connect)", connectS)
	fmt.Printf("cp throughput: see bench/cp\n")
	return nil
}

// rawCreateExec is the raw reference of create → first exec: QEMU start →
// GuestInfo → one Exec of /bin/true over that session.
func (e *benchEnv) rawCreateExec(ctx context.Context, backend *runtime.QEMU, spec runtime.Spec, dir string) (wsSample, error) {
	s := wsSample{Phase: "create_exec", Kind: "raw", Load: loadavg()}
	b, err := e.rawBoot(ctx, backend, spec, dir, func(c *guestproto.Client, started time.Time) error {
		d, err := execTrueOver(ctx, c)
		if err != nil {
			return err
		}
		s.TotalS = secs(time.Since(started))
		s.ExecS = secs(d)
		return nil
	})
	s.BootS, s.StopS = b.BootS, b.StopS
	return s, err
}

// execTrueOver runs /bin/true (no Root: the raw VM has no /rootfs, so
// both sides run the initramfs's) and times Exec → Wait with exit 0.
func execTrueOver(ctx context.Context, c *guestproto.Client) (time.Duration, error) {
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	p, err := c.Exec(ectx, guestproto.ExecRequest{Argv: []string{"/bin/true"}})
	if err != nil {
		return 0, err
	}
	defer p.Close()
	errc := make(chan struct{})
	go func() { io.Copy(io.Discard, p.Stderr); close(errc) }()
	io.Copy(io.Discard, p.Stdout)
	<-errc
	exit, err := p.Wait()
	d := time.Since(t0)
	if err != nil {
		return d, err
	}
	if exit.ExitCode != 0 {
		return d, fmt.Errorf("/bin/true exited %+v", exit)
	}
	return d, nil
}

// startDev builds kibotos statically into scratch/bin and runs `kibotos dev`
// on a free port triple; the cleanup stops it (SIGINT), runs `kibotos dev
// down --purge` and checks that no process mentions the scratch directory.
func startDev(ctx context.Context, cl *cleaner, scratch string) (*devCluster, error) {
	binDir := filepath.Join(scratch, "bin")
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(binDir, "kibotos"), "github.com/kibotos/kibotos")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build kibotos: %v\n%s", err, out)
	}
	if err := os.Symlink("kibotos", filepath.Join(binDir, "kibo")); err != nil {
		return nil, err
	}
	logf("built kibotos (static) in %v", time.Since(t0).Round(time.Millisecond))
	port, release, err := hostprobe.ReservePorts(4) // API, gossip, data plane, metrics
	if err != nil {
		return nil, err
	}
	d := &devCluster{
		bin: binDir, dir: filepath.Join(scratch, "dev"), addr: "127.0.0.1:" + strconv.Itoa(port),
		cache: filepath.Join(os.TempDir(), "kibotos-test-platform"), log: filepath.Join(scratch, "dev.log"),
		done: make(chan struct{}), releasePorts: release,
	}
	f, err := os.Create(d.log)
	if err != nil {
		release()
		return nil, err
	}
	d.cmd = exec.Command(filepath.Join(binDir, "kibotos"), "dev", "--data-dir", d.dir, "--advertise", d.addr, "--no-demo", "--platform-cache-dir", d.cache)
	d.cmd.Stdout, d.cmd.Stderr, d.cmd.Env = f, f, hostprobe.CleanEnv()
	// Own process group: a terminal Ctrl-C reaches the benchmark, whose
	// cleanup stops kibotos dev in order (SIGINT, then dev down --purge).
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		f.Close()
		release()
		return nil, err
	}
	go func() { d.cmd.Wait(); f.Close(); close(d.done) }()
	logf("kibotos dev PID %d, data dir %s, advertise %s", d.cmd.Process.Pid, d.dir, d.addr)
	cl.add(fmt.Sprintf("stop kibotos dev PID %d, dev down --purge", d.cmd.Process.Pid), func() error { return d.down(scratch) })
	return d, nil
}

func (d *devCluster) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *devCluster) env() []string { return append(hostprobe.CleanEnv(), "KIBOTOS_DATA_DIR="+d.dir) }

// down stops kibotos dev (SIGINT as Ctrl-C, SIGKILL after 30s), then
// `kibotos dev down --purge` ends the VMs, the data-plane process and the
// private systemd and removes the data directory.
func (d *devCluster) down(scratch string) error {
	defer d.releasePorts()
	var errs []error
	if !d.exited() {
		d.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			errs = append(errs, fmt.Errorf("kibotos dev PID %d did not stop within 30s of SIGINT; killed", d.cmd.Process.Pid))
			d.cmd.Process.Kill()
			<-d.done
		}
	}
	if _, err := os.Stat(d.dir); err == nil {
		if err := d.devDown(); err != nil {
			errs = append(errs, err)
			// Last resort: the dev cluster's private systemd (the layout of
			// member/noderuntime.go DevSystemdDir); stopping it ends every VM
			// and the data-plane process in its PID namespace.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if sd, err := privsd.Attach(ctx, filepath.Join(datadir.Dir(d.dir).NodeDir(), "systemd")); err == nil {
				logf("stopping the dev cluster's private systemd (host PID %d) directly", sd.PID)
				if err := sd.Stop(); err != nil {
					errs = append(errs, err)
				}
			} else if !errors.Is(err, privsd.ErrNotRunning) {
				errs = append(errs, fmt.Errorf("attach to the dev private systemd: %w", err))
			}
		}
	}
	// Every process of the dev cluster mentions the scratch directory: the
	// VMMs (their disks), the data plane (its executable), the private
	// systemd's children.
	var left []string
	until := time.Now().Add(10 * time.Second)
	for {
		left = hostprobe.ProcsMentioning(scratch)
		if len(left) == 0 || time.Now().After(until) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes still run after dev down:\n%s", strings.Join(left, "\n")))
	}
	return errors.Join(errs...)
}

// devDown runs `kibotos dev down --purge` (a second time after 3s if it
// fails). It refuses an Instance that is still STARTING, e.g. when the
// benchmark was interrupted during a create: each dev down process takes
// the Instance over as STARTING again, so retrying does not help and the
// caller then stops the private systemd itself.
func (d *devCluster) devDown() error {
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if attempt > 0 {
			time.Sleep(3 * time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "kibotos"), "dev", "down", "--data-dir", d.dir, "--purge")
		cmd.Env = hostprobe.CleanEnv()
		var out []byte
		out, err = cmd.CombinedOutput()
		cancel()
		if err == nil {
			logf("kibotos dev down --purge: %s", strings.TrimSpace(string(out)))
			return nil
		}
		err = fmt.Errorf("kibotos dev down --purge: %v: %s", err, strings.TrimSpace(string(out)))
		logf("%v", err)
	}
	return err
}

// waitReady polls ctrl until node dev is READY, has reported a data-plane
// address and its overcommit is acknowledged (what kibotos dev itself
// waits for before announcing the cluster).
func (d *devCluster) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last string
	for {
		if d.exited() {
			return fmt.Errorf("kibotos dev exited (%v) before the node was ready:\n%s", d.cmd.ProcessState, tailFile(d.log, 3000))
		}
		if ok, why := d.ready(ctx); ok {
			return nil
		} else {
			last = why
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node dev not ready within %v (%s); log:\n%s", limit, last, tailFile(d.log, 3000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (d *devCluster) ready(ctx context.Context) (bool, string) {
	dir := datadir.Dir(d.dir)
	id, err := dir.LoadIdentity()
	if err != nil {
		return false, err.Error()
	}
	tlsConf, err := dir.AdminClient()
	if err != nil {
		return false, err.Error()
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n api.Node
	if _, err := api.NewClient(id.Advertise, tlsConf).Do(cctx, "GET", "/v1/nodes/"+id.NodeID, nil, &n); err != nil {
		return false, err.Error()
	}
	ok := n.Status == api.NodeReady && n.Session != nil && n.Session.Alive && n.Report != nil && n.Report.DataPlaneAddress != "" &&
		n.Overcommit != nil && n.Overcommit.Acknowledged
	return ok, "status " + n.Status
}

// kibo runs the CLI against the dev cluster; a non-zero exit is an error.
func (d *devCluster) kibo(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, filepath.Join(d.bin, "kibo"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr, cmd.Env = &stdout, &stderr, d.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kibo %s: %v: %s%s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()), trimS(stdout.String(), 300))
	}
	return stdout.String(), nil
}

var wsIDRe = regexp.MustCompile(`^ws-[a-z0-9]+\n$`)

// create is `kibo workspace create --template kibotos-base --memory NMiB -q`
// (returns once the Workspace is AVAILABLE); it returns the Workspace id.
func (d *devCluster) create(ctx context.Context, memMiB int) (string, error) {
	out, err := d.kibo(ctx, 3*time.Minute, "workspace", "create", "--template", "kibotos-base", "--memory", fmt.Sprintf("%dMiB", memMiB), "-q")
	if err != nil {
		return "", err
	}
	if !wsIDRe.MatchString(out) {
		return "", fmt.Errorf("workspace create -q printed %q, want a Workspace id", out)
	}
	return strings.TrimSpace(out), nil
}

// createExec times create → `kibo workspace exec WS -- true`, then deletes
// the Workspace (timed apart).
func (d *devCluster) createExec(ctx context.Context, memMiB int) (wsSample, error) {
	s := wsSample{Phase: "create_exec", Kind: "workspace", Load: loadavg()}
	t0 := time.Now()
	ws, err := d.create(ctx, memMiB)
	if err != nil {
		return s, err
	}
	s.Workspace = ws
	t1 := time.Now()
	s.CreateS = secs(t1.Sub(t0))
	if _, err := d.kibo(ctx, time.Minute, "workspace", "exec", ws, "--", "true"); err != nil {
		return s, err
	}
	s.ExecS = secs(time.Since(t1))
	s.TotalS = secs(time.Since(t0))
	if w, err := d.get(ctx, ws); err == nil && w.State == api.WorkspaceAvailable {
		s.ToCreatedS = secs(w.CreatedAt.Sub(t0))
		s.ToAvailableS = secs(w.UpdatedAt.Sub(w.CreatedAt))
		s.AfterAvailS = secs(t1.Sub(w.UpdatedAt))
	}
	t2 := time.Now()
	if _, err := d.kibo(ctx, 3*time.Minute, "workspace", "delete", ws); err != nil {
		return s, err
	}
	s.StopS = secs(time.Since(t2))
	return s, nil
}

// client is an API client with the dev member's admin credentials.
func (d *devCluster) client() (*api.Client, error) {
	dir := datadir.Dir(d.dir)
	id, err := dir.LoadIdentity()
	if err != nil {
		return nil, err
	}
	tlsConf, err := dir.AdminClient()
	if err != nil {
		return nil, err
	}
	return api.NewClient(id.Advertise, tlsConf), nil
}

// get reads the Workspace from ctrl.
func (d *devCluster) get(ctx context.Context, ws string) (*api.Workspace, error) {
	cl, err := d.client()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var w api.Workspace
	if _, err := cl.Do(cctx, "GET", "/v1/workspaces/"+ws, nil, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// connect opens one data-plane session to ws as the CLI does: a
// credential from ctrl, then dataplane.Connect with the cluster CA.
func (d *devCluster) connect(ctx context.Context, ws string) (*guestproto.Client, error) {
	cl, err := d.client()
	if err != nil {
		return nil, err
	}
	roots, err := datadir.Dir(d.dir).CAPool()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var cred api.DataPlaneCredential
	if _, err := cl.Do(cctx, "POST", "/v1/workspaces/"+ws+"/credentials", struct{}{}, &cred); err != nil {
		return nil, fmt.Errorf("data-plane credential for %s: %w", ws, err)
	}
	return dataplane.Connect(cctx, cred, roots)
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tailS(b, n)
}

func trimS(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
