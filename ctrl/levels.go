package ctrl

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// Feature levels in a mixed-version cluster (see fsm/levels.go): every
// member answers what its build applies; the leader asks every voter at
// the start of its leadership and every minute, records what changed, and
// refuses before the log an op some voter could not apply. A voter it
// cannot reach keeps its recorded level; one that answers "not found" is
// a build from before levels: level 1.

// MemberLevel is what a member answers of its build's level (GET
// /v1/internal/member-level).
type MemberLevel struct {
	NodeID  string `json:"node_id"`
	Level   int    `json:"level"`
	Release string `json:"release"`
}

// RaftServer is a server of the Raft configuration.
type RaftServer struct {
	ID, Address string
	Voter       bool
}

// LevelSource is what the levels need of the member.
type LevelSource interface {
	// Servers is the Raft configuration.
	Servers() ([]RaftServer, error)
	// View reads the local state.
	View(fn func(tx *bolt.Tx) error) error
	// Apply proposes e and waits for its result.
	Apply(ctx context.Context, e fsm.Entry) (fsm.Result, error)
	// AskLevel asks another member its build's level; an error coded
	// not found is a build from before levels.
	AskLevel(ctx context.Context, addr string) (MemberLevel, error)
}

// Levels tracks the voters' feature levels: what the state records of
// them, asked again at the leader's pace, and what that allows.
type Levels struct {
	src LevelSource
	log *slog.Logger
	own MemberLevel // this member's answer
	// asked is when the voters' levels were last asked after a refusal
	// (unix nanoseconds).
	asked atomic.Int64
	// cache keeps Voters' answer for cacheFor; gen moves whenever the
	// voters or their recorded levels may have changed, and an answer
	// cached in an earlier generation is not used.
	cache atomic.Pointer[cachedLevels]
	gen   atomic.Uint64
}

// NewLevels tracks the levels of the voters src knows; own is this
// member's answer.
func NewLevels(src LevelSource, log *slog.Logger, own MemberLevel) *Levels {
	return &Levels{src: src, log: log, own: own}
}

// CheckOp refuses, before the log, an op a voter could not apply.
// A refusal asks the voters again first (at most every few seconds): a
// voter that just joined or was just upgraded is not refused for what the
// records do not know yet.
func (l *Levels) CheckOp(ctx context.Context, op string) error {
	if fsm.OpLevel(op) <= 1 {
		return nil
	}
	err := l.allow(op)
	if err == nil || api.CodeOf(err) != api.CodeFailedPrecondition {
		return err
	}
	if last := l.asked.Load(); last != 0 && time.Since(time.Unix(0, last)) < 2*time.Second {
		return err
	}
	l.asked.Store(time.Now().UnixNano())
	l.Refresh(ctx)
	return l.allow(op)
}

// allow checks op against the recorded levels of the voters.
func (l *Levels) allow(op string) error { return l.Reach(op, fsm.OpLevel(op)) }

// Reach checks that every voter's recorded level reaches need, for what
// (an op, or a new rule of one).
func (l *Levels) Reach(what string, need int) error {
	levels, err := l.voters()
	if err != nil {
		return err
	}
	return fsm.CheckLevel(what, need, levels)
}

// EntryFormatBinary reports whether every voter reaches
// fsm.LevelEntryFormat; until a new voter's level is recorded it counts as
// level 1.
func (l *Levels) EntryFormatBinary() bool {
	return l.Reach("the binary entry format", fsm.LevelEntryFormat) == nil
}

// CommandLog reports whether every voter keeps command records in the
// command log (fsm.LevelCommandLog): only then may an entry ask for it.
func (l *Levels) CommandLog() bool {
	return l.Reach("the command log", fsm.LevelCommandLog) == nil
}

// CountsPlacements reports whether every voter counts placements
// (fsm.LevelPlacementCounts): only then may an entry ask for it.
func (l *Levels) CountsPlacements() bool {
	return l.Reach("placement counts", fsm.LevelPlacementCounts) == nil
}

// TroubleshootingRules reports whether every voter applies the rules of
// fsm.LevelTroubleshooting (an OOM-killed VMM stops its Workspace; stop
// --force of an Instance its node no longer has keeps it FAILED).
func (l *Levels) TroubleshootingRules() bool {
	return l.Reach("troubleshooting rules", fsm.LevelTroubleshooting) == nil
}

// voters are the recorded levels of the voters (level 1, not recorded,
// for one never asked).
//
// Asking them takes a trip through Raft's loop and a read of the state,
// and writes ask several times each (a node's report three), so the
// answer is kept for cacheFor; adding a voter and recording a level drop
// it (Forget), also when they happen while it is being asked. Callers
// must not change the slice.
func (l *Levels) voters() ([]fsm.MemberLevel, error) {
	now, gen := time.Now().UnixNano(), l.gen.Load()
	if c := l.cache.Load(); c != nil && c.gen == gen && now-c.at < int64(cacheFor) {
		return c.levels, nil
	}
	levels, err := l.recorded()
	if err == nil {
		l.cache.Store(&cachedLevels{at: now, gen: gen, levels: levels})
	}
	return levels, err
}

// cacheFor is how long voters keeps an answer.
const cacheFor = time.Second

type cachedLevels struct {
	at     int64 // unix nanoseconds
	gen    uint64
	levels []fsm.MemberLevel
}

// Forget drops the kept answer: the voters or their levels changed.
func (l *Levels) Forget() { l.gen.Add(1) }

// voterServers are the voters of the Raft configuration.
func (l *Levels) voterServers() ([]RaftServer, error) {
	all, err := l.src.Servers()
	if err != nil {
		return nil, err
	}
	var out []RaftServer
	for _, srv := range all {
		if srv.Voter {
			out = append(out, srv)
		}
	}
	return out, nil
}

// recorded reads the voters' levels as the state records them.
func (l *Levels) recorded() ([]fsm.MemberLevel, error) {
	vs, err := l.voterServers()
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "ctrl could not read its voters: %v; retry", err)
	}
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	var levels []fsm.MemberLevel
	err = l.src.View(func(tx *bolt.Tx) (err error) { levels, err = fsm.MemberLevels(tx, ids); return })
	return levels, err
}

// Recorded reports whether every voter's level has been asked and
// recorded (the leader does at the start of its leadership).
func (l *Levels) Recorded() bool {
	levels, err := l.voters()
	if err != nil {
		return false
	}
	for _, m := range levels {
		if m.RecordedAt.IsZero() {
			return false
		}
	}
	return true
}

// Refresh asks every voter its level and records what changed.
func (l *Levels) Refresh(ctx context.Context) {
	vs, err := l.voterServers()
	if err != nil {
		return
	}
	for _, v := range vs {
		if got, err := l.ask(ctx, v); err == nil {
			l.RecordAnswer(ctx, got)
		}
	}
}

// RecordAnswer records a member's answered level if it changed or was
// never recorded, and reports whether the record now holds it.
func (l *Levels) RecordAnswer(ctx context.Context, got MemberLevel) bool {
	var rec []fsm.MemberLevel
	if err := l.src.View(func(tx *bolt.Tx) (err error) { rec, err = fsm.MemberLevels(tx, []string{got.NodeID}); return }); err != nil {
		return false
	}
	if rec[0].Level == got.Level && rec[0].Release == got.Release && !rec[0].RecordedAt.IsZero() {
		return true
	}
	raw, _ := json.Marshal(fsm.MemberLevelArgs{NodeID: got.NodeID, Level: got.Level, Release: got.Release})
	// A build from before levels skips it.
	res, err := l.src.Apply(ctx, fsm.Entry{Op: fsm.OpMemberLevel, Args: raw, Actor: "member:" + l.own.NodeID, IgnoreUnknown: true})
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		l.log.Warn("feature level of a ctrl member not recorded", "member", got.NodeID, "level", got.Level, "err", err)
		return false
	}
	l.Forget()
	l.log.Info("feature level of a ctrl member recorded", "member", got.NodeID, "level", got.Level, "release", got.Release)
	return true
}

// ask asks a member its build's level; a build from before levels
// answers "not found": level 1.
func (l *Levels) ask(ctx context.Context, v RaftServer) (MemberLevel, error) {
	if v.ID == l.own.NodeID {
		return l.own, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := l.src.AskLevel(cctx, v.Address)
	switch {
	case api.CodeOf(err) == api.CodeNotFound:
		return MemberLevel{NodeID: v.ID, Level: 1, Release: ""}, nil
	case err != nil:
		return got, err
	case got.NodeID != v.ID:
		return got, fmt.Errorf("member at %s answered as %s, not %s", v.Address, got.NodeID, v.ID)
	case got.Level < 1 || len(got.Release) > 64:
		return got, fmt.Errorf("member %s answered feature level %d, release of %d bytes: not a level", v.ID, got.Level, len(got.Release))
	}
	return got, nil
}

// RefuseOlderVoter refuses to add a voter whose build is below the level
// every current voter runs: the leader writes for that level, so the new
// voter could not apply the log it would be sent (it halts) or would not
// see what the state holds at that level (a command log it does not
// know, for one). A voter that is not reachable is unavailable; one whose
// level was never recorded counts as level 1, which refuses nothing. It
// returns the level the member answered, for the leader to record once
// the member is a voter: until then the voter would count as level 1, and
// the leader write for the oldest build (JSON entries, command records
// keyed by their ids: about half the write rate of a cluster at this
// build's level) until its next refresh, a minute away.
func (l *Levels) RefuseOlderVoter(ctx context.Context, v RaftServer) (MemberLevel, error) {
	got, err := l.ask(ctx, v)
	if err != nil {
		return got, api.Errorf(api.CodeUnavailable, "ctrl could not ask member %s its feature level: %v; retry", v.ID, err)
	}
	levels, err := l.voters()
	if err != nil {
		return got, err
	}
	lowest := lowestLevel(levels, got.NodeID)
	if got.Level >= lowest {
		return got, nil
	}
	rel := got.Release
	if rel == "" {
		rel = "a build from before feature levels"
	}
	return got, api.Errorf(api.CodeFailedPrecondition,
		"member %s runs %s at feature level %d, below level %d that every ctrl voter runs: install the cluster's release on %s (kibotos version on a voter shows it), then start it again", got.NodeID, rel, got.Level, lowest, got.NodeID)
}

// lowestLevel is the lowest level among levels but member except's; 0
// for none. A member never recorded is level 1 (fsm.MemberLevels).
func lowestLevel(levels []fsm.MemberLevel, except string) int {
	lowest := 0
	for _, m := range levels {
		if m.NodeID != except && (lowest == 0 || m.Level < lowest) {
			lowest = m.Level
		}
	}
	return lowest
}

// CheckState refuses to start a build below the level every voter ran
// when this member's replicated state was saved (a downgrade): the state
// may hold what this build does not know, and would read as if it were
// not there (a command log, for one). There is no rollback. A voter whose
// level was never recorded counts as level 1, which refuses nothing; a
// log entry this build cannot read halts it as it applies.
func (l *Levels) CheckState() error {
	levels, err := l.recorded()
	if err != nil {
		return err
	}
	low := lowestLevel(levels, "")
	if low <= l.own.Level {
		return nil
	}
	return api.Errorf(api.CodeFailedPrecondition,
		"member %s: its replicated state was saved while every ctrl voter ran feature level %d, and this build (%s) applies level %d: run that release again (there is no rollback)", l.own.NodeID, low, l.own.Release, l.own.Level)
}
