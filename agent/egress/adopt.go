package egress

import (
	"context"
	"slices"
	"time"
)

// adoptTimeout bounds reaching one running generation at open.
const adoptTimeout = 3 * time.Second

// adopt takes over the generations of this scope that run already (a
// node restart leaves them serving). Newest first: the newest one that
// answers and has its sockets serves; an older one still serving is what
// a switch the node did not finish left, and drains now; draining ones
// go on draining. Whatever does not answer, never got its sockets or
// would be a third generation is ended.
func (s *Supervisor) adopt(ctx context.Context) error {
	listed, err := s.series.Running(ctx)
	if err != nil {
		return err
	}
	var running []*generation
	for _, p := range listed {
		g := &generation{num: p.Generation, unit: p.Unit, mainPID: p.MainPID, adopted: true}
		s.findSocketDir(g)
		running = append(running, g)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// s.draining is filled newest first here and turned oldest first below.
	for _, g := range running {
		actx, cancel := context.WithTimeout(ctx, adoptTimeout)
		var st Stats
		err := s.dial(actx, g)
		if err == nil {
			st, err = g.client.Stats(actx)
		}
		cancel()
		switch {
		case err != nil:
			s.end(ctx, g, "its control socket does not answer: "+err.Error())
		case len(s.draining)+s.serving() >= maxGenerations:
			s.end(ctx, g, "at most two generations run")
		case st.Draining:
			// Its own deadline is in its memory: the node's bound from
			// now on only stops it if it overstays.
			g.deadline = time.Now().Add(s.cfg.DrainTimeout)
			s.draining = append(s.draining, g)
			s.log.Info("egress generation adopted", "generation", g.num, "unit", g.unit, "main_pid", g.mainPID, "draining", true, "active", st.Active)
		case !st.Listening:
			s.end(ctx, g, "it never got its sockets")
		case s.current == nil:
			s.current = g
			s.log.Info("egress generation adopted", "generation", g.num, "unit", g.unit, "main_pid", g.mainPID,
				"revision", g.revision, "same_build", g.revision == s.cfg.Revision, "routes", st.Routes)
		default:
			s.drain(ctx, g, "a newer generation serves (a switch the node did not finish)")
		}
	}
	slices.Reverse(s.draining)
	return nil
}
