package cluster

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/fsm"
)

// Rounds of ended-Instance records on the leader (the rules are in
// fsm/ended.go). A node sends its records with every full report; the
// leader passes them on only in the report entry it finds the node's
// round due for, so one entry a minute per node carries them. The FSM
// checks the minute again by the entry's time, which is the leader's
// clock after this check, so the two agree unless leadership moved to a
// member whose clock is behind (then the next report is the round).

// roundsRule names rounds in a refusal by feature level.
const roundsRule = "rounds of ended-Instance records"

// endedRounds reports whether every voter applies rounds.
func (s *Server) endedRounds() bool { return s.levelsReach(roundsRule, fsm.LevelEndedRounds) == nil }

// troubleshootingRules reports whether every voter applies the rules of
// fsm.LevelTroubleshooting (an OOM-killed VMM stops its Workspace; stop
// --force of an Instance its node no longer has keeps it FAILED).
func (s *Server) troubleshootingRules() bool {
	return s.levelsReach("troubleshooting rules", fsm.LevelTroubleshooting) == nil
}

// endedRoundDue is when the node's next round is due; zero when it has
// had none.
func (s *Server) endedRoundDue(node string) (time.Time, error) {
	var last time.Time
	err := s.fsm.View(func(tx *bolt.Tx) (err error) { last, err = fsm.LastEndedRound(tx, node); return })
	if err != nil || last.IsZero() {
		return time.Time{}, err
	}
	return last.Add(fsm.EndedRoundInterval), nil
}

// markEndedRound shapes a report entry's records for the voters: all of
// them as before for voters below the level, or only in a due round.
func (s *Server) markEndedRound(args *fsm.ReportArgs, now time.Time) {
	r := &args.Report
	if !s.endedRounds() {
		// An older voter knows no completeness: an entry carrying it would
		// be stored differently there.
		r.EndedComplete = false
		if !s.levels.Recorded() {
			// Whether every voter applies rounds is not known yet (a new
			// cluster or voter, asked at the start of the leadership):
			// the records wait rather than meet the earlier rules, which
			// forget the records ctrl does not know.
			r.Ended = nil
		}
		return
	}
	args.Rounds = true
	if due, err := s.endedRoundDue(args.NodeID); err == nil && !now.Before(due) {
		args.Round = true
		if len(r.Ended) > fsm.EndedRoundMax {
			r.Ended, r.EndedComplete = r.Ended[:fsm.EndedRoundMax], false
		}
		return
	}
	r.Ended, r.EndedComplete = nil, false
}

// endedRoundSoon is when the node's round is due if that is after now but
// within window: a sync then waits for it, so that the sync and the round
// (both about once a minute) share one report instead of the round
// missing its minute by the jitter between two tickers.
func (s *Server) endedRoundSoon(node string, now time.Time, window time.Duration) (time.Time, bool) {
	if !s.endedRounds() {
		return time.Time{}, false
	}
	due, err := s.endedRoundDue(node)
	if err != nil || !due.After(now) || due.Sub(now) >= window {
		return time.Time{}, false
	}
	return due, true
}
