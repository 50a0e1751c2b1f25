package egress

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
)

const (
	// endWait is how long a generation told to close everything gets to
	// exit by itself (queries already read may still be answered) before
	// its unit is stopped.
	endWait = 5 * time.Second
	// stopWait bounds stopping a unit that did not exit by itself.
	stopWait = 20 * time.Second
	// drainSettle is how long past its drain deadline a generation may
	// still run before its unit is stopped.
	drainSettle = 5 * time.Second
)

// maxGenerations is how many egress processes of a node run at once: one
// serving and one draining.
const maxGenerations = 1 + generations.MaxDraining

// drain makes g stop serving and finish its connections by DrainTimeout;
// it exits by itself, and the watch loop sees it go (mu held, g no longer
// current).
func (s *Supervisor) drain(ctx context.Context, g *generation, reason string) {
	deadline := time.Now().Add(s.cfg.DrainTimeout)
	if err := s.call(ctx, g, func(c *Client) error { return c.Drain(ctx, deadline) }); err != nil {
		s.end(ctx, g, "its drain failed: "+err.Error())
		return
	}
	g.deadline = deadline
	s.draining = append(s.draining, g)
	s.log.Info("egress generation draining", "generation", g.num, "unit", g.unit, "deadline", deadline, "reason", reason)
}

// makeRoom ends the oldest draining generations until one more fits.
func (s *Supervisor) makeRoom(ctx context.Context, reason string) {
	for len(s.draining) > 0 && len(s.draining)+s.serving() >= maxGenerations {
		s.endOldest(ctx, reason)
	}
}

func (s *Supervisor) serving() int {
	if s.current != nil {
		return 1
	}
	return 0
}

func (s *Supervisor) endOldest(ctx context.Context, reason string) {
	g := s.draining[0]
	s.draining = s.draining[1:]
	s.end(ctx, g, reason)
}

// end ends g at once (mu held, g tracked no more): its connections are
// closed now, then it exits by itself or its unit is stopped.
func (s *Supervisor) end(ctx context.Context, g *generation, reason string) {
	if g.client != nil && !g.client.Broken() {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		g.client.Drain(dctx, time.Now())
		cancel()
	}
	stopErr := s.series.Stop(ctx, g.unit, endWait)
	attrs := []any{"generation", g.num, "unit", g.unit, "main_pid", g.mainPID, "reason", reason}
	if stopErr != nil {
		g.closeClient()
		s.log.Error("egress generation ended", append(attrs, "err", stopErr)...)
		return
	}
	s.ended(g, slog.LevelWarn, reason)
}

// ended forgets a generation whose processes are gone. A process that did
// not exit cleanly left its control socket behind: no later generation
// has its number, so the file is only litter.
func (s *Supervisor) ended(g *generation, level slog.Level, reason string) {
	g.closeClient()
	os.Remove(s.controlSocket(g))
	if g.socketDir != "" && g.socketDir != s.cfg.SocketDir {
		// The directory of an earlier build goes with its last process
		// (removing one that still holds another's socket fails).
		os.Remove(g.socketDir)
	}
	s.log.Log(s.ctx, level, "egress generation ended", "generation", g.num, "unit", g.unit, "main_pid", g.mainPID, "reason", reason)
}
