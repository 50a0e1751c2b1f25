package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/units"
)

// SupervisorConfig is how the node runs its data-plane process.
type SupervisorConfig struct {
	Units *units.Manager
	// Executable is the kibotos binary (absolute), normally os.Executable().
	Executable string
	// Scope tells this node's units from other nodes' on the host (ScopeFor).
	Scope string
	// SocketDir is the data plane's socket directory, e.g.
	// /run/kibotos/node/dataplane.
	SocketDir string
	// EarlierSocketDirs are where builds before this one put the control
	// sockets and the generation counter. A generation they started is
	// reached through a link in SocketDir (linkEarlier), so an upgrade
	// that moved the directory still adopts it or hands over from it with
	// its connections; its numbers are never handed out again. New
	// generations always use SocketDir.
	EarlierSocketDirs []string
	// Listen is the node's data-plane address.
	Listen string
	// TLS are the settings the process serves; the zero value is
	// DefaultTLS. A running process with other settings is replaced by a
	// generation that takes over its listening socket.
	TLS TLSSettings
	// Release and Revision are the node's build (buildinfo's when empty),
	// which Executable must be: a running process of the same revision is
	// this build; one whose release is on the same line hands over to a new
	// generation; any other is ended first.
	Release, Revision string
	// Grace, when non-zero, is passed as --grace (tests); the process
	// defaults to DefaultGrace.
	Grace time.Duration
	// LogFormat, when set, is passed as --log-format (text or json).
	LogFormat string
	Logger    *slog.Logger
}

// PushTimeout is how long Push waits for the data plane's ack.
const PushTimeout = 5 * time.Second

// drainingPushTimeout bounds a push to a draining generation: it only
// needs the withdrawals (a stop, a delete), and it may be gone.
const drainingPushTimeout = 2 * time.Second

// ErrNotAcknowledged: the data-plane process did not confirm a push in
// time. The node replies to ctrl anyway and resends within 15 s.
var ErrNotAcknowledged = errors.New("data-plane process did not acknowledge the state")

// Handle is the node's data-plane process of this scope: the generation
// that serves, and the one, if any, that drains after a switch.
type Handle struct {
	Unit       string
	Generation uint64
	MainPID    uint32 // PID in the service manager's namespace
	// Adopted is true when Ensure found the process running and kept it.
	Adopted bool
	// Switched is the reason Ensure handed over to a new generation, ""
	// when it did not.
	Switched string
	// Hello is the process's answer when Ensure returned.
	Hello Hello

	socketDir   string
	earlierDirs []string
	log         *slog.Logger

	mu       sync.Mutex
	draining []DrainingGeneration // oldest first; at most one
}

// DrainingGeneration is an older generation that no longer accepts and
// exits once its connections ended.
type DrainingGeneration struct {
	Unit       string
	Generation uint64
	MainPID    uint32
}

// Address is where the process listens (HOST:PORT).
func (h *Handle) Address() string { return h.Hello.Address }

// Draining lists the generations still draining, as last seen.
func (h *Handle) Draining() []DrainingGeneration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.draining)
}

func (cfg SupervisorConfig) validate() error {
	switch {
	case cfg.Units == nil:
		return errors.New("dataplane: no unit manager: the node runtime is needed to run the data plane")
	case !filepath.IsAbs(cfg.Executable):
		return fmt.Errorf("dataplane: executable %q is not an absolute path: pass os.Executable()", cfg.Executable)
	case cfg.Scope == "":
		return errors.New("dataplane: no scope: use ScopeFor(socket directory)")
	case !filepath.IsAbs(cfg.SocketDir):
		return fmt.Errorf("dataplane: socket directory %q is not an absolute path", cfg.SocketDir)
	case cfg.Listen == "":
		return errors.New("dataplane: no data-plane address: set the node's data-plane listen address")
	}
	return cfg.TLS.Validate()
}

func (cfg SupervisorConfig) withDefaults() SupervisorConfig {
	if cfg.Release == "" {
		cfg.Release = buildinfo.ReleaseName()
	}
	if cfg.Revision == "" {
		cfg.Revision = buildinfo.SourceRevision()
	}
	cfg.TLS = cfg.TLS.orDefault()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// Ensure makes sure a data-plane process of cfg.Scope serves with this
// build, cfg.Listen and cfg.TLS, deciding by what runs (the process-model
// seed's startup table):
//
//   - the same build with the same address and TLS settings is adopted,
//     with its connections;
//   - another build on the same release line, or other TLS settings: a
//     new generation takes over the listening socket, and the old one
//     stops accepting and exits once its connections ended; no connection
//     is refused on the way;
//   - the same line on another address: the new generation binds the new
//     address, and the old one drains on the old;
//   - another release line (or a process that cannot hand over): the old
//     one is ended, its connections cut, then a new one binds the address;
//   - nothing: a new one starts.
//
// At most one generation drains: a switch while one still does ends it
// first. A process that does not answer is stopped. The node calls Ensure
// at start and whenever it finds the process gone; it never stops the unit
// when the node itself stops.
func Ensure(ctx context.Context, cfg SupervisorConfig) (*Handle, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	sv := &supervisor{cfg: cfg, log: cfg.Logger, series: newSeries(cfg)}
	running, err := sv.running(ctx)
	if err != nil {
		return nil, err
	}

	// Who runs, newest first: the newest listening one serves, the newest
	// draining one may go on draining, the rest is ended.
	var serving *proc
	var draining []*proc // newest first
	for _, p := range running {
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		hello, herr := AskHello(hctx, cfg.SocketDir, p.gen)
		cancel()
		if herr == nil {
			p.hello = &hello
		}
		switch {
		case herr != nil:
			sv.end(ctx, p, "its control socket does not answer: "+herr.Error())
		case hello.Generation != p.gen:
			sv.end(ctx, p, fmt.Sprintf("its control socket answers as generation %d", hello.Generation))
		case hello.Draining:
			draining = append(draining, p)
		case !hello.listening():
			sv.end(ctx, p, "it never got its listening socket (a switch the node did not finish)")
		case serving == nil:
			serving = p
		default:
			// A switch the node did not finish: the newer one serves.
			if err := Drain(ctx, cfg.SocketDir, p.gen); err != nil {
				sv.end(ctx, p, "a newer generation serves, and its drain failed: "+err.Error())
				continue
			}
			sv.log.Info("data-plane generation draining", "generation", p.gen, "unit", p.unit, "reason", "a newer generation serves (a switch the node did not finish)")
			draining = append(draining, p)
		}
	}
	for len(draining) > maxDraining {
		sv.end(ctx, draining[len(draining)-1], ReasonTooMany)
		draining = draining[:len(draining)-1]
	}

	if serving == nil {
		// Nothing serves (first start, or the serving one died): a new one
		// binds the address. A draining one lends it the guest sessions it
		// holds, and its state until the node pushes.
		var pred *proc
		if len(draining) > 0 {
			pred = draining[0]
		}
		return sv.startFresh(ctx, pred)
	}

	plan, reason := decide(*serving.hello, cfg)
	switch plan {
	case planAdopt:
		h := sv.handle(serving, draining)
		h.Adopted = true
		sv.log.Info("data-plane process adopted", "unit", h.Unit, "main_pid", h.MainPID, "address", h.Address(), "draining", len(draining))
		return h, nil
	case planReplace:
		// Across release lines nothing is handed over: every generation
		// ends before the new one binds the address.
		for _, p := range draining {
			sv.end(ctx, p, reason)
		}
		sv.end(ctx, serving, reason)
		return sv.startFresh(ctx, nil)
	}
	for _, p := range draining {
		sv.end(ctx, p, ReasonNewerDrains)
	}
	h, err := sv.handOver(ctx, serving, plan == planHandOver, reason)
	if err != nil {
		// The old generation still serves, of a build this node can live
		// with (same line): better than none. The next Ensure tries again.
		sv.log.Error("data-plane generation switch failed; the old generation keeps serving", "generation", serving.gen, "unit", serving.unit, "err", err)
		h := sv.handle(serving, nil)
		h.Adopted = true
		return h, nil
	}
	return h, nil
}

// Push delivers st to the serving generation and waits for it to apply
// it, at most PushTimeout. On failure it logs the warning operators look
// for and returns the error (ErrNotAcknowledged on timeout): the node
// replies to ctrl anyway and pushes again within 15 s. A draining
// generation gets st too, so a withdrawn target (a stop, a delete) closes
// its connections there as well; one that is gone is forgotten.
func (h *Handle) Push(ctx context.Context, st State) error {
	// A draining generation gets it at the same time, so it adds nothing
	// to the reply unless it is slower (at most drainingPushTimeout).
	var wg sync.WaitGroup
	for _, d := range h.Draining() {
		wg.Go(func() {
			dctx, cancel := context.WithTimeout(ctx, drainingPushTimeout)
			err := PushState(dctx, h.socketDir, d.Generation, st)
			cancel()
			if err != nil {
				h.checkDraining(ctx, d, err)
			}
		})
	}
	pctx, cancel := context.WithTimeout(ctx, PushTimeout)
	err := PushState(pctx, h.socketDir, h.Generation, st)
	timedOut := pctx.Err() != nil && ctx.Err() == nil
	cancel()
	wg.Wait()
	if err == nil {
		return nil
	}
	h.log.Warn("data-plane generation did not take the node's state before the reply", "generation", h.Generation, "unit", h.Unit, "err", err)
	if timedOut {
		return fmt.Errorf("%w within %v: generation %d (%s)", ErrNotAcknowledged, PushTimeout, h.Generation, h.Unit)
	}
	return err
}

// checkDraining forgets a draining generation that does not answer
// because it finished (its control socket is gone with it).
func (h *Handle) checkDraining(ctx context.Context, d DrainingGeneration, err error) {
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	_, herr := AskHello(hctx, h.socketDir, d.Generation)
	cancel()
	if herr == nil {
		h.log.Warn("draining data-plane generation did not take the node's state", "generation", d.Generation, "unit", d.Unit, "err", err)
		return
	}
	h.mu.Lock()
	n := len(h.draining)
	h.draining = slices.DeleteFunc(h.draining, func(x DrainingGeneration) bool { return x.Generation == d.Generation })
	forgot := len(h.draining) < n
	h.mu.Unlock()
	if forgot {
		h.log.Info("data-plane generation ended", "generation", d.Generation, "unit", d.Unit, "main_pid", d.MainPID, "reason", "its connections ended")
		forgetEarlier(h.socketDir, h.earlierDirs, d.Generation)
	}
}

// Ping asks the serving process for its Hello; an error means it is gone
// or hung and the node should call Ensure again.
func (h *Handle) Ping(ctx context.Context) (Hello, error) {
	return AskHello(ctx, h.socketDir, h.Generation)
}

// Hellos asks every running generation, the serving one first, for its
// Hello (counters included). A draining one that is gone is forgotten; a
// serving one that does not answer is left out.
func (h *Handle) Hellos(ctx context.Context) []Hello {
	var out []Hello
	if hello, err := h.Ping(ctx); err == nil {
		out = append(out, hello)
	}
	for _, d := range h.Draining() {
		hello, err := AskHello(ctx, h.socketDir, d.Generation)
		if err != nil {
			h.checkDraining(ctx, d, err)
			continue
		}
		out = append(out, hello)
	}
	return out
}

// StopScope stops every data-plane process of scope under m (their
// connections get the process's grace) and returns how many it stopped.
// The node never calls it; `kibotos dev down` does, since on a host
// systemd nothing else would end them.
func StopScope(ctx context.Context, m *units.Manager, scope string) (int, error) {
	return (&generations.Series{Units: m, Prefix: unitPrefix, Scope: scope, Who: "dataplane"}).StopAll(ctx)
}

// proc is a running data-plane unit Ensure found or started.
type proc struct {
	gen     uint64
	unit    string
	mainPID uint32
	hello   *Hello // nil: it did not answer
}

// running lists this scope's active units, newest first, and learns the
// highest generation number handed out.
func (sv *supervisor) running(ctx context.Context) ([]*proc, error) {
	listed, err := sv.series.Running(ctx)
	if err != nil {
		return nil, err
	}
	var running []*proc
	for _, p := range listed {
		running = append(running, &proc{gen: p.Generation, unit: p.Unit, mainPID: p.MainPID})
	}
	if err := linkEarlier(sv.cfg.SocketDir, sv.cfg.EarlierSocketDirs, running, sv.log); err != nil {
		return nil, err
	}
	return running, nil
}

// handle is the Handle of serving p with draining d (newest first).
func (sv *supervisor) handle(p *proc, d []*proc) *Handle {
	h := &Handle{Unit: p.unit, Generation: p.gen, MainPID: p.mainPID, Hello: *p.hello, socketDir: sv.cfg.SocketDir, earlierDirs: sv.cfg.EarlierSocketDirs, log: sv.log}
	for i := len(d) - 1; i >= 0; i-- {
		h.draining = append(h.draining, DrainingGeneration{Unit: d[i].unit, Generation: d[i].gen, MainPID: d[i].mainPID})
	}
	return h
}
