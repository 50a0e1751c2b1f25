package dataplane

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"time"

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
	// Listen is the node's data-plane address.
	Listen string
	// Grace, when non-zero, is passed as --grace (tests); the process
	// defaults to DefaultGrace.
	Grace time.Duration
	// LogFormat, when set, is passed as --log-format (text or json).
	LogFormat string
	Logger    *slog.Logger
}

// PushTimeout is how long Push waits for the data plane's ack.
const PushTimeout = 5 * time.Second

// startTimeout bounds the wait for a new process to answer its control socket.
const startTimeout = 15 * time.Second

// ErrNotAcknowledged: the data-plane process did not confirm a push in
// time. The node replies to ctrl anyway and resends within 15 s.
var ErrNotAcknowledged = errors.New("data-plane process did not acknowledge the state")

// Handle is the node's data-plane process of this scope.
type Handle struct {
	Unit       string
	Generation uint64
	MainPID    uint32 // PID in the service manager's namespace
	// Adopted is true when Ensure found the process running and kept it.
	Adopted bool
	// Hello is the process's answer when Ensure returned.
	Hello Hello

	socketDir string
	log       *slog.Logger
}

// Address is where the process listens (HOST:PORT).
func (h *Handle) Address() string { return h.Hello.Address }

// Ensure makes sure one data-plane process of cfg.Scope runs this build with
// cfg.Listen. A running one that says so is adopted untouched, with its
// connections; otherwise running ones are stopped (their connections get
// the grace) and a new generation is started. The node calls it at start
// and whenever it finds the process gone; it never stops the unit when the
// node itself stops.
func Ensure(ctx context.Context, cfg SupervisorConfig) (*Handle, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := cfg.Units
	listed, err := m.List(ctx, unitPrefix+cfg.Scope+"-*.service")
	if err != nil {
		return nil, fmt.Errorf("dataplane: find running data-plane units: %w", err)
	}
	type genUnit struct {
		gen  uint64
		unit units.Unit
	}
	var running []genUnit
	maxGen, err := readGeneration(cfg.SocketDir)
	if err != nil {
		return nil, err
	}
	for _, u := range listed {
		gen, ok := unitGeneration(cfg.Scope, u.Name)
		if !ok {
			continue
		}
		maxGen = max(maxGen, gen)
		if u.Active() {
			running = append(running, genUnit{gen, u})
		}
	}
	slices.SortFunc(running, func(a, b genUnit) int { return cmp.Compare(b.gen, a.gen) })

	var adopt *Handle
	if len(running) > 0 {
		newest := running[0]
		hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		hello, herr := AskHello(hctx, cfg.SocketDir, newest.gen)
		cancel()
		switch {
		case herr != nil:
			log.Warn("data-plane process does not answer: replacing it", "unit", newest.unit.Name, "err", herr)
		case hello.Revision != buildinfo.SourceRevision():
			log.Info("data-plane process runs another build: replacing it", "unit", newest.unit.Name, "revision", hello.Revision, "want", buildinfo.SourceRevision())
		case hello.Listen != cfg.Listen:
			log.Info("data-plane process listens elsewhere: replacing it", "unit", newest.unit.Name, "listen", hello.Listen, "want", cfg.Listen)
		case hello.Generation != newest.gen:
			log.Warn("data-plane process answers with another generation: replacing it", "unit", newest.unit.Name, "generation", hello.Generation)
		default:
			adopt = &Handle{Unit: newest.unit.Name, Generation: newest.gen, MainPID: newest.unit.MainPID, Adopted: true,
				Hello: hello, socketDir: cfg.SocketDir, log: log}
			running = running[1:]
		}
	}
	// Whatever else runs is replaced. No listening socket is handed over
	// yet: a stopped process's connections get its grace, then end.
	for _, r := range running {
		log.Info("stopping data-plane process", "unit", r.unit.Name, "main_pid", r.unit.MainPID)
		if err := m.Stop(ctx, r.unit.Name); err != nil {
			return nil, fmt.Errorf("dataplane: stop the previous data-plane process: %w", err)
		}
	}
	if adopt != nil {
		log.Info("data-plane process adopted", "unit", adopt.Unit, "main_pid", adopt.MainPID, "address", adopt.Hello.Address)
		return adopt, nil
	}
	return start(ctx, cfg, maxGen+1, log)
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
	return nil
}

func start(ctx context.Context, cfg SupervisorConfig, gen uint64, log *slog.Logger) (*Handle, error) {
	// Counted before the start: a crash after it never reuses the number.
	if err := writeGeneration(cfg.SocketDir, gen); err != nil {
		return nil, err
	}
	name := UnitName(cfg.Scope, gen)
	argv := []string{cfg.Executable, "dataplane", "--socket-dir", cfg.SocketDir, "--listen", cfg.Listen,
		"--generation", strconv.FormatUint(gen, 10)}
	if cfg.Grace > 0 {
		argv = append(argv, "--grace", cfg.Grace.String())
	}
	if cfg.LogFormat != "" {
		argv = append(argv, "--log-format", cfg.LogFormat)
	}
	u, err := cfg.Units.StartService(ctx, units.Spec{
		Name:           name,
		Description:    "kibotos data plane (generation " + strconv.FormatUint(gen, 10) + ")",
		Argv:           argv,
		Slice:          units.DataPlaneSlice,
		OOMScoreAdjust: -900,
	})
	if err != nil {
		return nil, fmt.Errorf("dataplane: %w", err)
	}
	// Type=exec returns once the binary runs; it is ready when its control
	// socket answers.
	deadline := time.Now().Add(startTimeout)
	for {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		hello, herr := AskHello(hctx, cfg.SocketDir, gen)
		cancel()
		if herr == nil {
			log.Info("data-plane process started", "unit", name, "main_pid", u.MainPID, "address", hello.Address)
			return &Handle{Unit: name, Generation: gen, MainPID: u.MainPID, Hello: hello, socketDir: cfg.SocketDir, log: log}, nil
		}
		cur, gerr := cfg.Units.Get(ctx, name)
		if gerr != nil || !cur.Active() {
			state := "gone"
			if gerr == nil {
				state = fmt.Sprintf("%s/%s, result %s, exit status %d", cur.ActiveState, cur.SubState, cur.Result, cur.ExecMainStatus)
			}
			return nil, fmt.Errorf("dataplane: %s exited at start (%s): its log says why (journalctl -u %s); often the address %s is taken", name, state, name, cfg.Listen)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("dataplane: %s runs but its control socket does not answer after %v: %v (journalctl -u %s)", name, startTimeout, herr, name)
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// Push delivers st and waits for the process to apply it, at most
// PushTimeout. On failure it logs the warning operators look for and
// returns the error (ErrNotAcknowledged on timeout): the node replies to
// ctrl anyway and pushes again within 15 s.
func (h *Handle) Push(ctx context.Context, st State) error {
	pctx, cancel := context.WithTimeout(ctx, PushTimeout)
	defer cancel()
	err := PushState(pctx, h.socketDir, h.Generation, st)
	if err == nil {
		return nil
	}
	h.log.Warn("data-plane generation did not take the node's state before the reply", "generation", h.Generation, "unit", h.Unit, "err", err)
	if pctx.Err() != nil && ctx.Err() == nil {
		return fmt.Errorf("%w within %v: generation %d (%s)", ErrNotAcknowledged, PushTimeout, h.Generation, h.Unit)
	}
	return err
}

// Ping asks the process for its Hello; an error means it is gone or hung
// and the node should call Ensure again.
func (h *Handle) Ping(ctx context.Context) (Hello, error) {
	return AskHello(ctx, h.socketDir, h.Generation)
}

// StopScope stops every data-plane process of scope under m (their
// connections get the process's grace) and returns how many it stopped.
// The node never calls it; `kibotos dev down` does, since on a host
// systemd nothing else would end them.
func StopScope(ctx context.Context, m *units.Manager, scope string) (int, error) {
	listed, err := m.List(ctx, unitPrefix+scope+"-*.service")
	if err != nil {
		return 0, fmt.Errorf("dataplane: find data-plane units: %w", err)
	}
	n := 0
	for _, u := range listed {
		if _, ok := unitGeneration(scope, u.Name); !ok {
			continue
		}
		if err := m.Stop(ctx, u.Name); err != nil {
			return n, fmt.Errorf("dataplane: stop %s: %w", u.Name, err)
		}
		if u.Active() {
			n++
		}
	}
	return n, nil
}
