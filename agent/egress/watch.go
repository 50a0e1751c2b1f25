package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/kibotos/kibotos/vmm/units"
)

const (
	// watchInterval is how often the generations are checked: a process
	// that died is replaced within about one interval plus its start.
	watchInterval = 500 * time.Millisecond
	// probeTimeout bounds one control check of a running process.
	probeTimeout = time.Second
	// maxMisses control checks failed in a row make a running process
	// count as dead: one slow answer does not.
	maxMisses = 3
	// maxBackoff bounds the wait between failed starts.
	maxBackoff = 30 * time.Second
)

// watch checks the generations every watchInterval until Close.
func (s *Supervisor) watch() {
	defer close(s.done)
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.check(s.ctx)
	}
}

// check forgets draining generations that ended, stops those past their
// deadline, and replaces a serving one that died with a new generation
// holding new sockets and the last config.
func (s *Supervisor) check(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	kept := s.draining[:0]
	for _, g := range s.draining {
		if gone, how := s.series.Gone(ctx, g.unit); gone {
			s.ended(g, slog.LevelInfo, "drained: "+how)
			continue
		}
		if time.Now().After(g.deadline.Add(drainSettle)) {
			s.end(ctx, g, "still running past its drain deadline")
			continue
		}
		kept = append(kept, g)
	}
	clear(s.draining[len(kept):])
	s.draining = kept

	if g := s.current; g != nil {
		err := s.probe(ctx, g)
		if err == nil {
			return
		}
		s.current = nil
		s.end(ctx, g, "exited unexpectedly: "+err.Error())
		s.backoff, s.retryAt = 0, time.Time{}
		if !s.known {
			s.log.Warn("egress generation not replaced: the node has not applied its config since it adopted it; its next Apply starts one", "generation", g.num)
		}
	}
	// Without a config of its own the node could only start a process
	// that refuses every guest: Apply starts one instead.
	if s.current != nil || !s.known || len(s.config.Routes) == 0 || time.Now().Before(s.retryAt) || ctx.Err() != nil {
		return
	}
	if err := s.startServing(ctx); err != nil {
		s.backoff = min(max(2*s.backoff, time.Second), maxBackoff)
		s.retryAt = time.Now().Add(s.backoff)
		s.log.Error("egress generation could not be started", "err", err, "retry_in", s.backoff)
		return
	}
	s.backoff, s.retryAt = 0, time.Time{}
	s.log.Warn("egress generation replaced the one that ended", "generation", s.current.num, "unit", s.current.unit, "main_pid", s.current.mainPID)
}

// probe says why g, which should serve, does not: its unit ended or runs
// another process, or its control socket failed maxMisses checks in a row.
// A service manager that does not answer is no verdict.
func (s *Supervisor) probe(ctx context.Context, g *generation) error {
	u, err := s.cfg.Units.Get(ctx, g.unit)
	switch {
	case errors.Is(err, units.ErrNotFound):
		return errors.New("its unit is gone")
	case err != nil:
		return nil
	case !u.Active():
		return fmt.Errorf("its unit is %s (result %s, exit status %d)", u.ActiveState, u.Result, u.ExecMainStatus)
	case u.MainPID != g.mainPID:
		return fmt.Errorf("its main process changed from PID %d to %d", g.mainPID, u.MainPID)
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	err = s.call(pctx, g, func(c *Client) error { _, err := c.Stats(pctx); return err })
	if err == nil {
		g.misses = 0
		return nil
	}
	if g.misses++; g.misses < maxMisses {
		s.log.Debug("egress control check failed", "generation", g.num, "misses", g.misses, "err", err)
		return nil
	}
	return fmt.Errorf("its control socket does not answer: %w", err)
}
