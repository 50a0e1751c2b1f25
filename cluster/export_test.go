package cluster

import (
	"context"
	"encoding/json"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// OpenLogStore opens a stopped member's Raft log for tests.
var OpenLogStore = openLogStore

// ForgetCaughtUp makes a leading member look just elected: its lead
// loop's barrier not yet through.
func (s *Server) ForgetCaughtUp() { s.consistentReady.Store(false) }

// RouteRule is one route of the member's API with its access rule.
type RouteRule struct {
	Method, Path string
	Roles        []string // the roles that may call it
	Public       bool     // served without a certificate
	Refuses      bool     // the rule says how a caller without the roles is refused
}

// RouteRules is the member's route table as its rules declare it.
func (s *Server) RouteRules() []RouteRule {
	var out []RouteRule
	for _, rt := range s.routeTable() {
		r := RouteRule{Method: rt.method, Path: rt.path, Public: rt.access.public, Refuses: rt.access.refuse != nil}
		for _, ro := range rt.access.roles {
			r.Roles = append(r.Roles, string(ro))
		}
		out = append(out, r)
	}
	return out
}

// PostJoin sends one join request through the member at addr, as Join
// does: the same keys and secret give the same request.
func PostJoin(ctx context.Context, addr, grant, advertise, memberKey, adminKey, joinSecret string) (api.JoinResponse, error) {
	tok, err := parseGrantToken(grant)
	if err != nil {
		return api.JoinResponse{}, err
	}
	body, _ := json.Marshal(api.JoinRequest{Token: grant, Advertise: advertise, MemberKey: memberKey, AdminKey: adminKey, JoinSecret: joinSecret})
	return postJoin(ctx, addr, tok.CA, trust.Want{Kind: trust.KindMember}, body)
}

// RetryUnavailable is Join's retry of a join ctrl could not decide.
var RetryUnavailable = retryUnavailable

// Unreachable marks err as a join that reached no member.
func Unreachable(err error) error { return unreachable{err} }
