// Package generations runs one helper process of a node (the data plane,
// the egress process) as numbered systemd units that hand over to each
// other on upgrade: <prefix><scope>-<generation>.service, numbered by a
// counter file that never hands out a number twice. It owns the naming,
// the counter, finding the generations that run, starting the next one
// and waiting until it answers, and stopping one that ended or must end.
//
// It never speaks a process's control protocol: what "ready" means, how a
// generation is told to drain or to end and what it hands over belong to
// its caller, which passes them in as functions.
package generations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/vmm/units"
)

// MaxDraining is how many generations may drain next to the serving one:
// a switch while one still drains ends it first.
const MaxDraining = 1

// ReasonNewerDrains is the reason logged when a draining generation is
// ended at once because a switch would make it the third.
const ReasonNewerDrains = "a newer generation is about to drain"

// Series is the generations of one process of one node. Its methods are
// not safe for concurrent use: a caller that shares it serializes them.
type Series struct {
	Units *units.Manager
	// Prefix starts every unit name, e.g. "kibotos-dataplane-".
	Prefix string
	// Scope tells this node's units from other nodes' on the host.
	Scope string
	// Counter is the generation counter file; its directory is made
	// (0700) when missing.
	Counter string
	// EarlierCounters are the counter files of builds that kept it
	// elsewhere: read for the highest number handed out, never written.
	EarlierCounters []string
	// Who starts every error ("dataplane", "egress").
	Who string
	// StopTimeout bounds stopping a unit that did not exit by itself.
	StopTimeout time.Duration

	last uint64 // the highest generation number handed out
}

// Process is one running (or just started) generation.
type Process struct {
	Generation uint64
	Unit       string
	MainPID    uint32 // in the service manager's PID namespace
}

// UnitName is the unit of generation gen.
func (s *Series) UnitName(gen uint64) string { return units.GenerationUnit(s.Prefix, s.Scope, gen) }

// Generation parses a unit name of this series; ok is false for other
// units.
func (s *Series) Generation(unit string) (uint64, bool) {
	return units.ParseGenerationUnit(s.Prefix, s.Scope, unit)
}

// Last is the highest generation number handed out, as Running or Start
// last saw it.
func (s *Series) Last() uint64 { return s.last }

// Running lists the generations whose units are active, newest first, and
// learns the highest number handed out: the counters', or a listed unit's
// if higher (a counter lost with a reboot's /run never goes below what
// systemd still lists).
func (s *Series) Running(ctx context.Context) ([]Process, error) {
	listed, err := s.Units.List(ctx, units.GenerationPattern(s.Prefix, s.Scope))
	if err != nil {
		return nil, fmt.Errorf("%s: find running %s units: %w", s.Who, s.Who, err)
	}
	last := uint64(0)
	for _, path := range append([]string{s.Counter}, s.EarlierCounters...) {
		gen, err := units.ReadGenerationCounter(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Who, err)
		}
		last = max(last, gen)
	}
	var running []Process
	for _, u := range listed {
		gen, ok := s.Generation(u.Name)
		if !ok {
			continue
		}
		last = max(last, gen)
		if u.Active() {
			running = append(running, Process{Generation: gen, Unit: u.Name, MainPID: u.MainPID})
		}
	}
	s.last = max(s.last, last)
	slices.SortFunc(running, func(a, b Process) int { return cmp.Compare(b.Generation, a.Generation) })
	return running, nil
}

// Start starts the next generation as the unit spec describes for its
// number (Name is set here). The number is counted before the unit
// starts: a node that crashes right after never reuses it (a generation's
// control socket is found by its number).
func (s *Series) Start(ctx context.Context, spec func(gen uint64) units.Spec) (Process, error) {
	gen := s.last + 1
	dir := filepath.Dir(s.Counter)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Process{}, fmt.Errorf("%s: directory of the generation counter %s: %w", s.Who, dir, err)
	}
	if err := units.WriteGenerationCounter(s.Counter, gen); err != nil {
		return Process{}, fmt.Errorf("%s: %w", s.Who, err)
	}
	s.last = gen
	sp := spec(gen)
	sp.Name = s.UnitName(gen)
	u, err := s.Units.StartService(ctx, sp)
	if err != nil {
		return Process{}, fmt.Errorf("%s: start generation %d: %w", s.Who, gen, err)
	}
	return Process{Generation: gen, Unit: sp.Name, MainPID: u.MainPID}, nil
}

// ErrExited: a generation's unit ended before the generation answered.
// Its unit is gone or failed: there is nothing left to stop.
var ErrExited = errors.New("exited at start")

// probeTimeout bounds one readiness probe of a starting generation.
const probeTimeout = time.Second

// AwaitReady waits, for at most timeout, until ready (a request on p's
// control socket) succeeds: Type=exec returns once the binary runs, not
// once it answers. An error wraps ErrExited when p's unit ended; hint,
// when set, is added to that error (what often makes the process exit).
func (s *Series) AwaitReady(ctx context.Context, p Process, timeout time.Duration, hint string, ready func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := ready(pctx)
		cancel()
		if err == nil {
			return nil
		}
		cur, gerr := s.Units.Get(ctx, p.Unit)
		if gerr != nil || !cur.Active() {
			state := "gone"
			if gerr == nil {
				state = fmt.Sprintf("%s/%s, result %s, exit status %d", cur.ActiveState, cur.SubState, cur.Result, cur.ExecMainStatus)
			}
			if hint != "" {
				hint = "; " + hint
			}
			return fmt.Errorf("%s: generation %d (%s) %w (%s): its log says why (journalctl -u %s)%s", s.Who, p.Generation, p.Unit, ErrExited, state, p.Unit, hint)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: generation %d (%s) runs but its control socket does not answer after %v: %v (journalctl -u %s)", s.Who, p.Generation, p.Unit, timeout, err, p.Unit)
		}
		if serr := ctxsleep.Sleep(ctx, 20*time.Millisecond); serr != nil {
			return fmt.Errorf("%s: generation %d (%s): waiting for its control socket: %w", s.Who, p.Generation, p.Unit, serr)
		}
	}
}

// Stop makes sure unit no longer runs: it gets grace to exit by itself
// (a generation told to end or to drain at once), then its unit is
// stopped, which gives the process's connections its own grace.
func (s *Series) Stop(ctx context.Context, unit string, grace time.Duration) error {
	if grace > 0 && s.WaitGone(ctx, unit, grace) {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, s.StopTimeout)
	defer cancel()
	return s.Units.Stop(sctx, unit)
}

// WaitGone waits up to d for unit to have no running process.
func (s *Series) WaitGone(ctx context.Context, unit string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if gone, _ := s.Gone(ctx, unit); gone {
			return true
		}
		if time.Now().After(deadline) || ctxsleep.Sleep(ctx, 20*time.Millisecond) != nil {
			return false
		}
	}
}

// Gone reports whether unit has ended (collected, inactive or failed:
// "deactivating" may still have processes), and how when the manager
// still knows. An unanswered query is no verdict (false).
func (s *Series) Gone(ctx context.Context, unit string) (bool, string) {
	u, err := s.Units.Get(ctx, unit)
	switch {
	case errors.Is(err, units.ErrNotFound):
		return true, "its unit is gone"
	case err != nil:
		return false, ""
	case u.ActiveState == "inactive" || u.ActiveState == "failed":
		return true, fmt.Sprintf("its unit is %s (result %s, exit status %d)", u.ActiveState, u.Result, u.ExecMainStatus)
	}
	return false, ""
}

// StopAll stops every generation of the series (their connections get
// the process's grace) and returns how many were running. A node never
// calls it when it stops; `kibotos dev down` does, since on a host
// systemd nothing else would end them.
func (s *Series) StopAll(ctx context.Context) (int, error) {
	listed, err := s.Units.List(ctx, units.GenerationPattern(s.Prefix, s.Scope))
	if err != nil {
		return 0, fmt.Errorf("%s: find %s units: %w", s.Who, s.Who, err)
	}
	n := 0
	for _, u := range listed {
		if _, ok := s.Generation(u.Name); !ok {
			continue
		}
		if err := s.Units.Stop(ctx, u.Name); err != nil {
			return n, fmt.Errorf("%s: stop %s: %w", s.Who, u.Name, err)
		}
		if u.Active() {
			n++
		}
	}
	return n, nil
}
