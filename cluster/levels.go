package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/fsm"
)

// Feature levels in a mixed-version cluster (see fsm/levels.go): every
// member answers what its build applies; the leader asks every voter at
// the start of its leadership and every minute, records what changed, and
// refuses before the log an op some voter could not apply. A voter it
// cannot reach keeps its recorded level; one that answers "not found" is
// a build from before levels: level 1.

// MemberLevel is what GET /v1/internal/member-level answers.
type MemberLevel struct {
	NodeID  string `json:"node_id"`
	Level   int    `json:"level"`
	Release string `json:"release"`
}

// featureLevel is this member's level (a test may claim a lower one).
func (s *Server) featureLevel() int {
	if s.cfg.FeatureLevel > 0 {
		return s.cfg.FeatureLevel
	}
	return fsm.FeatureLevel
}

// handleMemberLevel answers this member's build level (member certificates).
func (s *Server) handleMemberLevel(w http.ResponseWriter, r *http.Request) {
	writeResult(w, MemberLevel{NodeID: s.id.NodeID, Level: s.featureLevel(), Release: buildinfo.ReleaseName()})
}

// voters are the ids and addresses of the Raft configuration's voters.
func (s *Server) voters() ([]raft.Server, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []raft.Server
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			out = append(out, srv)
		}
	}
	return out, nil
}

// checkOpLevel refuses, before the log, an op a voter could not apply.
// A refusal asks the voters again first (at most every few seconds): a
// voter that just joined or was just upgraded is not refused for what the
// records do not know yet.
func (s *Server) checkOpLevel(ctx context.Context, op string) error {
	if fsm.OpLevel(op) <= 1 {
		return nil
	}
	err := s.levelsAllow(op)
	if err == nil || api.CodeOf(err) != api.CodeFailedPrecondition {
		return err
	}
	if last := s.levelsAsked.Load(); last != 0 && time.Since(time.Unix(0, last)) < 2*time.Second {
		return err
	}
	s.levelsAsked.Store(time.Now().UnixNano())
	s.refreshLevels(ctx)
	return s.levelsAllow(op)
}

// levelsAllow checks op against the recorded levels of the voters.
func (s *Server) levelsAllow(op string) error { return s.levelsReach(op, fsm.OpLevel(op)) }

// levelsReach checks that every voter's recorded level reaches need, for
// what (an op, or a new rule of one).
func (s *Server) levelsReach(what string, need int) error {
	levels, err := s.voterLevels()
	if err != nil {
		return err
	}
	return fsm.CheckLevel(what, need, levels)
}

// entryFormatBinary reports whether every voter reaches
// fsm.LevelEntryFormat; until a new voter's level is recorded it counts as
// level 1.
func (s *Server) entryFormatBinary() bool {
	return s.levelsReach("the binary entry format", fsm.LevelEntryFormat) == nil
}

// commandLog reports whether every voter keeps command records in the
// command log (fsm.LevelCommandLog): only then may an entry ask for it.
func (s *Server) commandLog() bool {
	return s.levelsReach("the command log", fsm.LevelCommandLog) == nil
}

// countsPlacements reports whether every voter counts placements
// (fsm.LevelPlacementCounts): only then may an entry ask for it.
func (s *Server) countsPlacements() bool {
	return s.levelsReach("placement counts", fsm.LevelPlacementCounts) == nil
}

// voterLevels are the recorded levels of the voters (level 1, not
// recorded, for one never asked).
//
// Asking them takes a trip through Raft's loop and a read of the state,
// and writes ask several times each (a node's report three), so the
// answer is kept for levelsCacheFor; adding a voter and recording a level
// drop it (forgetLevels), also when they happen while it is being asked.
// Callers must not change the slice.
func (s *Server) voterLevels() ([]fsm.MemberLevel, error) {
	now, gen := time.Now().UnixNano(), s.levelsGen.Load()
	if c := s.levelsCache.Load(); c != nil && c.gen == gen && now-c.at < int64(levelsCacheFor) {
		return c.levels, nil
	}
	levels, err := s.askVoterLevels()
	if err == nil {
		s.levelsCache.Store(&cachedLevels{at: now, gen: gen, levels: levels})
	}
	return levels, err
}

// levelsCacheFor is how long voterLevels keeps an answer.
const levelsCacheFor = time.Second

type cachedLevels struct {
	at     int64 // unix nanoseconds
	gen    uint64
	levels []fsm.MemberLevel
}

// forgetLevels drops the kept voterLevels: the voters or their levels
// changed.
func (s *Server) forgetLevels() { s.levelsGen.Add(1) }

func (s *Server) askVoterLevels() ([]fsm.MemberLevel, error) {
	vs, err := s.voters()
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "ctrl could not read its voters: %v; retry", err)
	}
	ids := make([]string, len(vs))
	for i, v := range vs {
		ids[i] = string(v.ID)
	}
	var levels []fsm.MemberLevel
	err = s.fsm.View(func(tx *bolt.Tx) (err error) { levels, err = fsm.MemberLevels(tx, ids); return })
	return levels, err
}

// levelsRecorded reports whether every voter's level has been asked and
// recorded (the leader does at the start of its leadership).
func (s *Server) levelsRecorded() bool {
	levels, err := s.voterLevels()
	if err != nil {
		return false
	}
	for _, l := range levels {
		if l.RecordedAt.IsZero() {
			return false
		}
	}
	return true
}

// refreshLevels asks every voter its level and records what changed.
func (s *Server) refreshLevels(ctx context.Context) {
	vs, err := s.voters()
	if err != nil {
		return
	}
	for _, v := range vs {
		s.recordLevel(ctx, v)
	}
}

// recordLevel asks one voter its level and records it if it changed or
// was never recorded. It reports whether the record now holds the
// voter's answer; a voter it cannot reach keeps its recorded level.
func (s *Server) recordLevel(ctx context.Context, v raft.Server) bool {
	got, err := s.askLevel(ctx, v)
	if err != nil {
		return false
	}
	return s.recordAnswer(ctx, got)
}

// recordAnswer records a member's answered level if it changed or was
// never recorded, and reports whether the record now holds it.
func (s *Server) recordAnswer(ctx context.Context, got MemberLevel) bool {
	var rec []fsm.MemberLevel
	if err := s.fsm.View(func(tx *bolt.Tx) (err error) { rec, err = fsm.MemberLevels(tx, []string{got.NodeID}); return }); err != nil {
		return false
	}
	if rec[0].Level == got.Level && rec[0].Release == got.Release && !rec[0].RecordedAt.IsZero() {
		return true
	}
	raw, _ := json.Marshal(fsm.MemberLevelArgs{NodeID: got.NodeID, Level: got.Level, Release: got.Release})
	// A build from before levels skips it.
	res, err := s.Apply(ctx, fsm.Entry{Op: fsm.OpMemberLevel, Args: raw, Actor: "member:" + s.id.NodeID, IgnoreUnknown: true})
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		s.log.Warn("feature level of a ctrl member not recorded", "member", got.NodeID, "level", got.Level, "err", err)
		return false
	}
	s.forgetLevels()
	s.log.Info("feature level of a ctrl member recorded", "member", got.NodeID, "level", got.Level, "release", got.Release)
	return true
}

// askLevel asks a member its build's level; a build from before levels
// answers "not found": level 1.
func (s *Server) askLevel(ctx context.Context, v raft.Server) (MemberLevel, error) {
	if string(v.ID) == s.id.NodeID {
		return MemberLevel{NodeID: s.id.NodeID, Level: s.featureLevel(), Release: buildinfo.ReleaseName()}, nil
	}
	var got MemberLevel
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := memberRequest(cctx, s.httpClient, http.MethodGet, string(v.Address), "/v1/internal/member-level", nil, &got)
	switch {
	case api.CodeOf(err) == api.CodeNotFound:
		return MemberLevel{NodeID: string(v.ID), Level: 1, Release: ""}, nil
	case err != nil:
		return got, err
	case got.NodeID != string(v.ID):
		return got, fmt.Errorf("member at %s answered as %s, not %s", v.Address, got.NodeID, v.ID)
	case got.Level < 1 || len(got.Release) > 64:
		return got, fmt.Errorf("member %s answered feature level %d, release of %d bytes: not a level", v.ID, got.Level, len(got.Release))
	}
	return got, nil
}

// refuseOlderVoter refuses to add a voter whose build is below the level
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
func (s *Server) refuseOlderVoter(ctx context.Context, v raft.Server) (MemberLevel, error) {
	got, err := s.askLevel(ctx, v)
	if err != nil {
		return got, api.Errorf(api.CodeUnavailable, "ctrl could not ask member %s its feature level: %v; retry", v.ID, err)
	}
	levels, err := s.voterLevels()
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
	for _, l := range levels {
		if l.NodeID != except && (lowest == 0 || l.Level < lowest) {
			lowest = l.Level
		}
	}
	return lowest
}

// checkStateLevel refuses to start a build below the level every voter
// ran when this member's replicated state was saved (a downgrade): the
// state may hold what this build does not know, and would read as if it
// were not there (a command log, for one). There is no rollback. A voter
// whose level was never recorded counts as level 1, which refuses
// nothing; a log entry this build cannot read halts it as it applies.
func (s *Server) checkStateLevel() error {
	levels, err := s.askVoterLevels()
	if err != nil {
		return err
	}
	low := lowestLevel(levels, "")
	if low <= s.featureLevel() {
		return nil
	}
	return api.Errorf(api.CodeFailedPrecondition,
		"member %s: its replicated state was saved while every ctrl voter ran feature level %d, and this build (%s) applies level %d: run that release again (there is no rollback)", s.id.NodeID, low, buildinfo.ReleaseName(), s.featureLevel())
}
