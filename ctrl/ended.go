package ctrl

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

// Rounds decides which report entries carry a node's ended-Instance
// records (the session protocol asks it for each report).
type Rounds struct {
	levels *Levels
	view   func(fn func(tx *bolt.Tx) error) error
}

// NewRounds decides rounds by the voters' levels and the state view reads.
func NewRounds(levels *Levels, view func(fn func(tx *bolt.Tx) error) error) *Rounds {
	return &Rounds{levels: levels, view: view}
}

// on reports whether every voter applies rounds.
func (r *Rounds) on() bool { return r.levels.Reach(roundsRule, fsm.LevelEndedRounds) == nil }

// due is when the node's next round is due; zero when it has
// had none.
func (r *Rounds) due(node string) (time.Time, error) {
	var last time.Time
	err := r.view(func(tx *bolt.Tx) (err error) { last, err = fsm.LastEndedRound(tx, node); return })
	if err != nil || last.IsZero() {
		return time.Time{}, err
	}
	return last.Add(fsm.EndedRoundInterval), nil
}

// Mark shapes a report entry's records for the voters: all of them as
// before for voters below the level, or only in a due round.
func (r *Rounds) Mark(args *fsm.ReportArgs, now time.Time) {
	rep := &args.Report
	if !r.on() {
		// An older voter knows no completeness: an entry carrying it would
		// be stored differently there.
		rep.EndedComplete = false
		if !r.levels.Recorded() {
			// Whether every voter applies rounds is not known yet (a new
			// cluster or voter, asked at the start of the leadership):
			// the records wait rather than meet the earlier rules, which
			// forget the records ctrl does not know.
			rep.Ended = nil
		}
		return
	}
	args.Rounds = true
	if due, err := r.due(args.NodeID); err == nil && !now.Before(due) {
		args.Round = true
		if len(rep.Ended) > fsm.EndedRoundMax {
			rep.Ended, rep.EndedComplete = rep.Ended[:fsm.EndedRoundMax], false
		}
		return
	}
	rep.Ended, rep.EndedComplete = nil, false
}

// Soon is when the node's round is due if that is after now but
// within window: a sync then waits for it, so that the sync and the round
// (both about once a minute) share one report instead of the round
// missing its minute by the jitter between two tickers.
func (r *Rounds) Soon(node string, now time.Time, window time.Duration) (time.Time, bool) {
	if !r.on() {
		return time.Time{}, false
	}
	due, err := r.due(node)
	if err != nil || !due.After(now) || due.Sub(now) >= window {
		return time.Time{}, false
	}
	return due, true
}
