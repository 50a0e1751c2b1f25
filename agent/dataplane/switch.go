package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/units"
)

// Reasons logged with "data-plane generation ended".
const (
	// ReasonNewerDrains: a switch would make a draining generation the
	// third; it is ended at once and its connections are dropped.
	ReasonNewerDrains = generations.ReasonNewerDrains
	// ReasonTooMany: more than one generation drained when the node
	// started; only the newest goes on.
	ReasonTooMany = "at most two data-plane generations run"
)

// maxDraining is how many generations may drain next to the serving one.
const maxDraining = generations.MaxDraining

const (
	// startTimeout bounds the wait for a new process to answer its control
	// socket.
	startTimeout = 15 * time.Second
	// stepTimeout bounds one control request of a switch.
	stepTimeout = 5 * time.Second
	// endWait is how long a generation told to end gets to exit by itself
	// before its unit is stopped.
	endWait = 5 * time.Second
	// stopWait bounds stopping a unit.
	stopWait = 30 * time.Second
)

// supervisor is one Ensure's work.
type supervisor struct {
	cfg    SupervisorConfig
	log    *slog.Logger
	series *generations.Series
}

// plan is what Ensure does with the serving generation.
type plan int

const (
	planAdopt    plan = iota // keep it
	planHandOver             // a new generation takes over its listening socket
	planMove                 // a new generation binds the new address; it drains on the old
	planReplace              // end it, then start a new one
)

// decide reads the startup table for a serving process that said h. The
// reason says why it is not adopted.
//
// A process of the node's revision and release is the node's build (an
// unreleased build is on no release line, but it can hand over to
// itself); two releases stamped on one revision are two builds. A process
// without a release (a build before hand-overs) of another revision
// counts as another line.
func decide(h Hello, cfg SupervisorConfig) (plan, string) {
	sameBuild := h.Revision == cfg.Revision && (h.Release == "" || h.Release == cfg.Release)
	sameTLS := h.tlsOf().Equal(cfg.TLS)
	if sameBuild && h.Listen == cfg.Listen && sameTLS {
		return planAdopt, ""
	}
	running := fmt.Sprintf("it runs %s (revision %s), this node %s (revision %s)", orNone(h.Release), h.Revision, cfg.Release, cfg.Revision)
	switch {
	case !sameBuild && (h.Release == "" || !buildinfo.SameLine(h.Release, cfg.Release)):
		return planReplace, "another release line: " + running
	case h.Protocol < ControlProtocol:
		return planReplace, fmt.Sprintf("it cannot hand over its listening socket (control protocol %d): %s", h.Protocol, running)
	}
	var why []string
	if !sameBuild {
		why = append(why, "another build on the release line: "+running)
	}
	if !sameTLS {
		why = append(why, fmt.Sprintf("the TLS settings changed from %s to %s", h.tlsOf(), cfg.TLS))
	}
	if h.Listen != cfg.Listen {
		why = append(why, fmt.Sprintf("the listen address changed from %s to %s", h.Listen, cfg.Listen))
		return planMove, strings.Join(why, "; ")
	}
	return planHandOver, strings.Join(why, "; ")
}

func orNone(release string) string {
	if release == "" {
		return "a build without a release"
	}
	return release
}

// handOver starts the next generation in old's place. With sameAddress it
// takes old's listening socket; otherwise it binds the new address. It gets
// old's state before it accepts anything, and old drains only once it
// does, so no connection meets a closed port or a process without a
// certificate. A failed step ends the new generation; old keeps serving.
func (sv *supervisor) handOver(ctx context.Context, old *proc, sameAddress bool, reason string) (*Handle, error) {
	t0 := time.Now()
	dir := sv.cfg.SocketDir
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	st, hasState, err := ExportState(sctx, dir, old.gen)
	cancel()
	if err != nil {
		return nil, err
	}
	var ln *os.File
	if sameAddress {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		ln, err = TakeListener(sctx, dir, old.gen)
		cancel()
		if err != nil {
			return nil, err
		}
		defer ln.Close()
	}
	p, err := sv.launch(ctx, launchOptions{awaitListener: sameAddress, predecessor: old.gen})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Handle, error) {
		sv.end(ctx, p, "its start failed: "+err.Error())
		return nil, err
	}
	if hasState {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		err := PushState(sctx, dir, p.gen, st)
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	if sameAddress {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		err := SendListener(sctx, dir, p.gen, ln)
		cancel()
		if err != nil {
			return fail(err)
		}
	}
	// Both accept now; from here the old one only finishes.
	sctx, cancel = context.WithTimeout(ctx, stepTimeout)
	err = Drain(sctx, dir, old.gen)
	cancel()
	var draining []*proc
	if err != nil {
		sv.end(ctx, old, "its drain failed: "+err.Error())
	} else {
		draining = []*proc{old}
	}
	if hello, err := AskHello(ctx, dir, p.gen); err == nil {
		p.hello = &hello
	}
	h := sv.handle(p, draining)
	h.Switched = reason
	sv.log.Info("data-plane generation switched", "from", old.gen, "to", p.gen, "unit", p.unit, "main_pid", p.mainPID,
		"address", h.Address(), "socket_handed_over", sameAddress, "reason", reason, "took", time.Since(t0).Round(time.Millisecond))
	if err == nil {
		sv.log.Info("data-plane generation draining", "generation", old.gen, "unit", old.unit, "reason", "a newer generation took over")
	}
	return h, nil
}

// startFresh starts a generation that binds the address itself. pred, a
// draining generation, lends it guest sessions and its state.
func (sv *supervisor) startFresh(ctx context.Context, pred *proc) (*Handle, error) {
	opts := launchOptions{}
	var st State
	hasState := false
	if pred != nil {
		opts.predecessor = pred.gen
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		st, hasState, _ = ExportState(sctx, sv.cfg.SocketDir, pred.gen)
		cancel()
	}
	p, err := sv.launch(ctx, opts)
	if err != nil {
		return nil, err
	}
	if hasState {
		sctx, cancel := context.WithTimeout(ctx, stepTimeout)
		if err := PushState(sctx, sv.cfg.SocketDir, p.gen, st); err != nil {
			sv.log.Warn("the draining generation's state did not reach the new one; the node's next push brings it", "generation", p.gen, "err", err)
		}
		cancel()
	}
	var draining []*proc
	if pred != nil {
		draining = []*proc{pred}
	}
	sv.log.Info("data-plane process started", "unit", p.unit, "main_pid", p.mainPID, "address", p.hello.Address)
	return sv.handle(p, draining), nil
}

type launchOptions struct {
	awaitListener bool
	predecessor   uint64
}

// launch starts the next generation's unit and waits for its control
// socket. A process that does not get there is ended.
func (sv *supervisor) launch(ctx context.Context, o launchOptions) (*proc, error) {
	cfg := sv.cfg
	started, err := sv.series.Start(ctx, func(gen uint64) units.Spec {
		argv := []string{cfg.Executable, "dataplane", "--socket-dir", cfg.SocketDir, "--listen", cfg.Listen,
			"--generation", strconv.FormatUint(gen, 10)}
		argv = append(argv, cfg.TLS.Args()...)
		if o.awaitListener {
			argv = append(argv, "--await-listener")
		}
		if o.predecessor != 0 {
			argv = append(argv, "--predecessor", strconv.FormatUint(o.predecessor, 10))
		}
		if cfg.Grace > 0 {
			argv = append(argv, "--grace", cfg.Grace.String())
		}
		if cfg.LogFormat != "" {
			argv = append(argv, "--log-format", cfg.LogFormat)
		}
		return units.Spec{
			Description:    "kibotos data plane (generation " + strconv.FormatUint(gen, 10) + ")",
			Argv:           argv,
			Slice:          units.DataPlaneSlice,
			OOMScoreAdjust: -900,
		}
	})
	if err != nil {
		return nil, err
	}
	p := &proc{gen: started.Generation, unit: started.Unit, mainPID: started.MainPID}
	err = sv.series.AwaitReady(ctx, started, startTimeout, "often the address "+cfg.Listen+" is taken", func(ctx context.Context) error {
		hello, err := AskHello(ctx, cfg.SocketDir, p.gen)
		if err == nil {
			p.hello = &hello
		}
		return err
	})
	if err != nil {
		if !errors.Is(err, generations.ErrExited) {
			sv.end(ctx, p, "its control socket did not answer at start")
		}
		return nil, err
	}
	return p, nil
}

// end ends p now: a process that speaks the hand-over protocol closes its
// connections and exits; otherwise (or if it does not exit in endWait)
// its unit is stopped, which gives its connections the process's grace.
func (sv *supervisor) end(ctx context.Context, p *proc, reason string) {
	told := false
	if p.hello != nil && p.hello.Protocol >= ControlProtocol {
		ectx, cancel := context.WithTimeout(ctx, time.Second)
		told = End(ectx, sv.cfg.SocketDir, p.gen) == nil
		cancel()
	}
	grace := time.Duration(0)
	if told {
		grace = endWait
	}
	stopErr := sv.series.Stop(ctx, p.unit, grace)
	attrs := []any{"generation", p.gen, "unit", p.unit, "main_pid", p.mainPID, "reason", reason}
	if stopErr != nil {
		sv.log.Error("data-plane generation ended", append(attrs, "err", stopErr)...)
		return
	}
	// A process that did not exit cleanly left its control socket (and,
	// for an earlier build's, the link to it): no later generation has
	// its number, so both are only litter.
	os.Remove(ControlSocket(sv.cfg.SocketDir, p.gen))
	for _, dir := range sv.cfg.EarlierSocketDirs {
		os.Remove(ControlSocket(dir, p.gen))
	}
	tidyEarlier(sv.cfg.EarlierSocketDirs)
	sv.log.Warn("data-plane generation ended", attrs...)
}
