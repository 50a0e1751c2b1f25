package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/qemu"
)

// bootSample is one JSON line of -mode boot.
type bootSample struct {
	Kind string `json:"kind"` // raw or node
	Run  int    `json:"run"`
	// BootS: process (raw) / runtime.Start call (node) → GuestInfo answered.
	BootS float64 `json:"boot_s"`
	// HandshakeS: → guestproto.Dial returned (raw) / runtime.Start returned (node).
	HandshakeS float64 `json:"handshake_s"`
	// UnitStartedS (node): Start → StartVMM returned (runtime log unit_started_in).
	UnitStartedS float64 `json:"unit_started_s,omitempty"`
	// DialAttempts (raw): guest agent dials until one answered.
	DialAttempts int     `json:"dial_attempts,omitempty"`
	RSSKiB       int64   `json:"qemu_rss_kib"`
	StopS        float64 `json:"stop_s"` // raw: SIGKILL+wait; node: Delete
	Load         string  `json:"loadavg"`
}

func (e *benchEnv) boot(ctx context.Context) error {
	sink := &logSink{}
	root := filepath.Join(e.scratch, "s")
	rt, err := runtime.Open(ctx, runtime.Config{
		StorageRoot: root, NodeID: "bench", Units: e.m, Accel: qemu.AccelAuto, Logger: quietLogger(sink),
	})
	if err != nil {
		return err
	}
	e.cl.add("delete node VMs, close runtime", func() error {
		c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		var errs []error
		for _, s := range rt.List() {
			errs = append(errs, rt.Delete(c, s.ID))
		}
		errs = append(errs, rt.Close())
		return errors.Join(errs...)
	})
	// The backend the runtime resolved (binary, accel, TSC kHz): the raw
	// boot uses the same, through qemu.Config.Argv.
	backend, choice, err := runtime.NewQEMU("", qemu.AccelAuto)
	if err != nil {
		return err
	}
	logf("accel %s: %s", choice.Accel, choice.Reason)
	rawDir := filepath.Join(e.scratch, "raw")
	if err := os.MkdirAll(rawDir, 0o700); err != nil {
		return err
	}
	spec := runtime.Spec{Installation: e.inst, MemoryMiB: e.o.memMiB}

	var raw, node []bootSample
	for i := 0; i < e.o.runs; i++ {
		order := []string{"raw", "node"}
		if i%2 == 1 {
			order = []string{"node", "raw"}
		}
		for _, kind := range order {
			var s bootSample
			var err error
			if kind == "raw" {
				s, err = e.rawBoot(ctx, backend, spec, filepath.Join(rawDir, fmt.Sprint(i)), nil)
			} else {
				s, err = e.nodeBoot(ctx, rt, sink, spec, fmt.Sprintf("boot-%d", i))
			}
			if err != nil {
				return fmt.Errorf("run %d %s: %w", i, kind, err)
			}
			s.Run = i
			emit(s)
			logf("run %d %-4s boot %.3fs (handshake %.3fs) rss %d MiB stop %.3fs load %s", i, kind, s.BootS, s.HandshakeS, s.RSSKiB/1024, s.StopS, s.Load)
			if kind == "raw" {
				raw = append(raw, s)
			} else {
				node = append(node, s)
			}
		}
	}
	col := func(ss []bootSample, f func(bootSample) float64) []float64 {
		var out []float64
		for _, s := range ss {
			out = append(out, f(s))
		}
		return out
	}
	boot := func(s bootSample) float64 { return s.BootS }
	rss := func(s bootSample) float64 { return float64(s.RSSKiB) / 1024 }
	stop := func(s bootSample) float64 { return s.StopS }
	rb, nb := summarize(col(raw, boot)), summarize(col(node, boot))
	rr, nr := summarize(col(raw, rss)), summarize(col(node, rss))
	rs, ns := summarize(col(raw, stop)), summarize(col(node, stop))
	nu := summarize(col(node, func(s bootSample) float64 { return s.UnitStartedS }))
	sum := map[string]any{
		"summary": "boot", "runs": e.o.runs, "mem_mib": e.o.memMiB, "accel": choice.Accel,
		"raw_boot_s": rb, "node_boot_s": nb, "ratio_median": nb.Median / rb.Median, "ratio_p95": nb.P95 / rb.P95,
		"raw_rss_mib": rr, "node_rss_mib": nr, "node_unit_started_s": nu, "raw_stop_s": rs, "node_delete_s": ns,
		"loadavg_start": e.loadStart, "loadavg_end": loadavg(), "cpus": numCPU(),
	}
	emit(sum)
	fmt.Printf("\nboot, %d runs each (alternated), %d MiB guest, accel %s, %d CPUs, loadavg at start %s / end %s\n",
		e.o.runs, e.o.memMiB, choice.Accel, numCPU(), e.loadStart, loadavg())
	fmt.Printf("%-34s %8s %8s %8s %8s\n", "", "median", "p95", "min", "max")
	row := func(name string, s stats, unit string) {
		fmt.Printf("%-34s %7.3f%s %7.3f%s %7.3f%s %7.3f%s\n", name, s.Median, unit, s.P95, unit, s.Min, unit, s.Max, unit)
	}
	row("raw boot (exec → GuestInfo)", rb, "s")
	row("node boot (Start → GuestInfo)", nb, "s")
	row("  node: Start → unit started", nu, "s")
	fmt.Printf("%-34s %7.3f  %7.3f   (target ≤ 1.15)\n", "ratio node/raw", nb.Median/rb.Median, nb.P95/rb.P95)
	fmt.Printf("%-34s %7.0fM %7.0fM %7.0fM %7.0fM\n", "raw QEMU VmRSS", rr.Median, rr.P95, rr.Min, rr.Max)
	fmt.Printf("%-34s %7.0fM %7.0fM %7.0fM %7.0fM\n", "node QEMU VmRSS", nr.Median, nr.P95, nr.Min, nr.Max)
	row("raw stop (SIGKILL + wait)", rs, "s")
	row("node Delete (graceful stop)", ns, "s")
	return nil
}

// rawBoot starts QEMU directly with the argv the runtime's backend builds
// (same binary, accel, TSC, memory, channel and QMP layout) and dials the
// guest agent with the runtime's readiness policy (waitGuest: attempts of
// up to 15s, 50ms apart). If use is not nil it is called with the guest
// session and the process start time right after GuestInfo answered, before
// the VM is killed (-mode workspace execs over it).
func (e *benchEnv) rawBoot(ctx context.Context, backend *runtime.QEMU, spec runtime.Spec, dir string, use func(c *guestproto.Client, started time.Time) error) (bootSample, error) {
	s := bootSample{Kind: "raw", Load: loadavg()}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return s, err
	}
	defer os.RemoveAll(dir)
	p := runtime.Paths{
		Dir: dir, Console: filepath.Join(dir, "console.log"), VMMLog: filepath.Join(dir, "vmm.log"),
		AgentSocket: filepath.Join(dir, "agent.sock"), Control: filepath.Join(dir, "qmp.sock"),
	}
	cfg := qemu.Config{
		Binary: backend.Binary, Accel: backend.Accel, TSCKHz: backend.TSCKHz,
		MemoryMiB: spec.MemoryMiB, VCPUs: spec.VCPUs,
		Kernel: spec.Installation.Kernel(), Initrd: spec.Installation.Initrd(),
		ConsoleLog: p.Console,
		Channels:   []qemu.Channel{{Name: runtime.AgentPortName, Socket: p.AgentSocket}},
		QMPSocket:  p.Control,
	}
	argv, err := cfg.Argv()
	if err != nil {
		return s, err
	}
	// Must be the runtime's own argv for these paths.
	if want, err := backend.Argv(spec, p); err != nil || !slices.Equal(argv, want) {
		return s, fmt.Errorf("raw argv differs from the runtime backend's (%v):\n raw  %q\n node %q", err, argv, want)
	}
	logFile, err := os.Create(p.VMMLog)
	if err != nil {
		return s, err
	}
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return s, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	// Only the process started here, by its PID.
	kill := func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	}
	e.cl.add(fmt.Sprintf("kill raw qemu PID %d", cmd.Process.Pid), func() error { kill(); return nil })
	defer kill()

	gctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var c *guestproto.Client
	var last error
	for c == nil {
		s.DialAttempts++
		actx, acancel := context.WithTimeout(gctx, 15*time.Second)
		var d net.Dialer
		conn, err := d.DialContext(actx, "unix", p.AgentSocket)
		if err == nil {
			c, err = guestproto.Dial(actx, conn)
		}
		acancel()
		if err == nil {
			break
		}
		last = err
		select {
		case <-exited:
			b, _ := os.ReadFile(p.VMMLog)
			return s, fmt.Errorf("qemu exited before the guest answered (last %v): %s", last, b)
		case <-gctx.Done():
			return s, fmt.Errorf("guest agent did not answer: %w (last %v)", gctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	defer c.Close()
	s.HandshakeS = secs(time.Since(t0))
	if _, err := c.GuestInfo(gctx); err != nil {
		return s, fmt.Errorf("GuestInfo: %w", err)
	}
	s.BootS = secs(time.Since(t0))
	if use != nil {
		if err := use(c, t0); err != nil {
			return s, err
		}
	}
	s.RSSKiB = vmRSSKiB(cmd.Process.Pid)
	t1 := time.Now()
	c.Close()
	kill()
	s.StopS = secs(time.Since(t1))
	return s, nil
}

// nodeBoot is runtime.Start (unit start → guest agent answers), one
// GuestInfo call over the runtime's session, then Delete.
func (e *benchEnv) nodeBoot(ctx context.Context, rt *runtime.Runtime, sink *logSink, spec runtime.Spec, id string) (bootSample, error) {
	s := bootSample{Kind: "node", Load: loadavg()}
	spec.InstanceID = id
	sctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	t0 := time.Now()
	st, err := rt.Start(sctx, spec)
	if err != nil {
		return s, err
	}
	s.HandshakeS = secs(time.Since(t0))
	g, err := rt.Guest(id)
	if err != nil {
		return s, err
	}
	if _, err := g.GuestInfo(sctx); err != nil {
		return s, fmt.Errorf("GuestInfo: %w", err)
	}
	s.BootS = secs(time.Since(t0))
	s.RSSKiB = vmRSSKiB(st.HostPID)
	if rec := sink.find("instance started", id); rec != nil {
		if v, ok := rec["unit_started_in"].(float64); ok {
			s.UnitStartedS = v / 1e9
		}
	}
	t1 := time.Now()
	if err := rt.Delete(sctx, id); err != nil {
		return s, err
	}
	s.StopS = secs(time.Since(t1))
	return s, nil
}

func numCPU() int { return goruntime.NumCPU() }
