package cluster

import (
	"context"
	"net/http"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/ctrl"
	"github.com/kibotos/kibotos/fsm"
)

// Feature levels in a mixed-version cluster: ctrl.Levels tracks the
// voters' levels; this member answers its own on an internal route and
// consults the levels before it proposes (Apply) or serves what some
// voter could not apply.

// MemberLevel is what GET /v1/internal/member-level answers.
type MemberLevel = ctrl.MemberLevel

// featureLevel is this member's level (a test may claim a lower one).
func (s *Server) featureLevel() int {
	if s.cfg.FeatureLevel > 0 {
		return s.cfg.FeatureLevel
	}
	return fsm.FeatureLevel
}

// handleMemberLevel answers this member's build level (member certificates).
func (s *Server) handleMemberLevel(r *http.Request) response {
	return answer(MemberLevel{NodeID: s.id.NodeID, Level: s.featureLevel(), Release: buildinfo.ReleaseName()})
}

// newLevels tracks the voters' levels (ctrl members only).
func (s *Server) newLevels() *ctrl.Levels {
	return ctrl.NewLevels(levelSource{s}, s.log, MemberLevel{NodeID: s.id.NodeID, Level: s.featureLevel(), Release: buildinfo.ReleaseName()})
}

// levelsReach checks that every voter's recorded level reaches need, for
// what (an op, or a new rule of one).
func (s *Server) levelsReach(what string, need int) error { return s.levels.Reach(what, need) }

// forgetLevels drops the kept levels: the voters changed.
func (s *Server) forgetLevels() { s.levels.Forget() }

// refuseOlderVoter refuses to add voter v if its build is below the
// voters' level (ctrl.Levels.RefuseOlderVoter).
func (s *Server) refuseOlderVoter(ctx context.Context, v raft.Server) (MemberLevel, error) {
	return s.levels.RefuseOlderVoter(ctx, ctrl.RaftServer{ID: string(v.ID), Address: string(v.Address), Voter: true})
}

// recordAnswer records a new voter's answered level.
func (s *Server) recordAnswer(ctx context.Context, got MemberLevel) bool {
	return s.levels.RecordAnswer(ctx, got)
}

// levelSource is the member as ctrl.Levels sees it.
type levelSource struct{ s *Server }

func (l levelSource) Servers() ([]ctrl.RaftServer, error) { return l.s.raftServers() }

func (l levelSource) View(fn func(tx *bolt.Tx) error) error { return l.s.fsm.View(fn) }

func (l levelSource) Apply(ctx context.Context, e fsm.Entry) (fsm.Result, error) {
	return l.s.Apply(ctx, e)
}

func (l levelSource) AskLevel(ctx context.Context, addr string) (MemberLevel, error) {
	var got MemberLevel
	err := memberRequest(ctx, l.s.memberClient(), http.MethodGet, addr, "/v1/internal/member-level", nil, &got)
	return got, err
}

// raftServers is the Raft configuration as ctrl reads it.
func (s *Server) raftServers() ([]ctrl.RaftServer, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []ctrl.RaftServer
	for _, srv := range f.Configuration().Servers {
		out = append(out, ctrl.RaftServer{ID: string(srv.ID), Address: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
	}
	return out, nil
}
