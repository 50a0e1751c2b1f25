package cluster

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// Personal operator credentials (issue 44): an operator certificate is
// issued on purpose, to a name, for a key made where it will be used,
// listed and revocable, instead of every member's host holding one. The
// leader signs (every ctrl member holds the CA key, and the issue time the
// certificate names is the one its entry recorded); every member accepts
// the certificate only while the record says so (operatorAccepted).

// operatorRoutes issue, list and revoke personal operator credentials.
func (s *Server) operatorRoutes() []route {
	return []route{
		{"POST", "/v1/operators", operators, atLeader, decoded(s.handleOperatorIssue)},
		{"GET", "/v1/operators", operators, atReader, s.handleOperatorList},
		{"POST", "/v1/operators/{name}/revoke", operators, atLeader, decoded(s.handleOperatorRevoke)},
	}
}

// handleOperatorIssue records the credential, then signs the certificate
// for the issue time the entry recorded. A replay of the same command
// signs again for the same record and key: the answer that was lost is
// given anew.
func (s *Server) handleOperatorIssue(r *http.Request, req api.OperatorIssueRequest) response {
	if err := fsm.ValidOperatorName(req.Name); err != nil {
		return fail(err)
	}
	ttl, err := operatorTTL(req.Name, req.TTL)
	if err != nil {
		return fail(err)
	}
	pub, err := trust.ParsePublicKeyPEM(req.PublicKey)
	if err != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "operator %s: public_key is not an ECDSA PEM key: %v", req.Name, err))
	}
	fp, err := trust.KeyFingerprint(pub)
	if err != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "operator %s: %v", req.Name, err))
	}
	if !s.holdsCAKey() {
		return fail(api.Errorf(api.CodeUnavailable, "member %s holds no CA key and cannot sign operator %s's certificate; retry on a ctrl member", s.id.NodeID, req.Name))
	}
	res, err := s.applyWrite(r, fsm.OpOperatorIssue, req.WriteMeta, fsm.OperatorIssueArgs{Name: req.Name, KeyFingerprint: fp, TTL: ttl})
	if err != nil {
		return fail(err)
	}
	var rec api.Operator
	if err := json.Unmarshal(res.Value, &rec); err != nil {
		return fail(api.Errorf(api.CodeInternal, "operator %s: read the recorded credential: %v", req.Name, err))
	}
	if rec.KeyFingerprint != fp {
		return fail(api.Errorf(api.CodeFailedPrecondition, "operator %s: command %s was used for another key; give a new --command-id", req.Name, req.CommandID))
	}
	id := trust.Identity{ClusterID: s.id.ClusterID, Kind: trust.KindOperator, NodeID: rec.Name, Admitted: rec.IssuedAt}
	ca := s.signingCA()
	cert, err := ca.Issue(id, nil, pub, time.Until(rec.ExpiresAt))
	if err != nil {
		return fail(api.Errorf(api.CodeInternal, "operator %s: sign the certificate: %v", rec.Name, err))
	}
	s.log.Info("operator credential issued", "operator", rec.Name, "issued_by", rec.IssuedBy, "expires_at", rec.ExpiresAt.Format(time.RFC3339), "key_fingerprint", rec.KeyFingerprint)
	return resultResponse{value: api.OperatorIssueResponse{Operator: rec, Cert: string(cert), CACert: s.trustedBundle()}, replayed: res.Replayed}
}

// parseDays reads a lifetime: a Go duration or a number of days ("30d").
// Days beyond any lifetime's bound read as the longest duration, so the
// caller's bound refuses them.
func parseDays(v string) (time.Duration, error) {
	days, ok := strings.CutSuffix(v, "d")
	if !ok {
		return time.ParseDuration(v)
	}
	n, err := strconv.Atoi(days)
	if n > 1<<16 {
		return time.Duration(math.MaxInt64), err
	}
	return time.Duration(n) * 24 * time.Hour, err
}

// operatorTTL reads a credential's lifetime: a Go duration or a number of
// days ("30d"); empty is the maximum.
func operatorTTL(name, v string) (time.Duration, error) {
	if v == "" {
		return fsm.OperatorMaxTTL, nil
	}
	d, err := parseDays(v)
	if err != nil {
		return 0, api.Errorf(api.CodeInvalidArgument, "operator %s: ttl %s is not a duration such as 12h or 30d", name, api.EscapeText(v))
	}
	if d < fsm.OperatorMinTTL || d > fsm.OperatorMaxTTL {
		return 0, api.Errorf(api.CodeInvalidArgument, "operator %s: ttl %s is out of range: the maximum is %dd (an operator credential lives at most as long as a host's), the minimum 1h", name, api.EscapeText(v), fsm.OperatorMaxTTL/(24*time.Hour))
	}
	return d, nil
}

func (s *Server) handleOperatorList(r *http.Request) response {
	if err := noPaging(r, "operator credentials"); err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListOperators(tx, time.Now()) })
}

func (s *Server) handleOperatorRevoke(r *http.Request, req api.WriteMeta) response {
	name := r.PathValue("name")
	if err := fsm.ValidOperatorName(name); err != nil {
		return fail(err)
	}
	out := s.write(r, fsm.OpOperatorRevoke, req, fsm.OperatorArgs{Name: name})
	if res, ok := out.(resultResponse); ok {
		s.log.Info("operator credential revoked", "operator", name, "revoked_by", callerOf(r).name)
		return res
	}
	return out
}

// operatorAccepted checks a personal operator certificate against ctrl's
// record of its name: it must exist, not be revoked or expired, and be
// the issue the certificate names (issuing the name again replaces it).
func (s *Server) operatorAccepted(id trust.Identity) error {
	var rec *api.Operator
	var bootstrapped bool
	err := s.fsm.View(func(tx *bolt.Tx) error {
		if bootstrapped = fsm.ClusterID(tx) != ""; !bootstrapped {
			return nil
		}
		var err error
		rec, err = fsm.GetOperator(tx, id.NodeID)
		if api.CodeOf(err) == api.CodeNotFound || api.CodeOf(err) == api.CodeInvalidArgument {
			rec, err = nil, nil
		}
		return err
	})
	switch {
	case err != nil:
		return api.Errorf(api.CodeUnavailable, "member %s could not read the record of %s: %v; retry", s.id.NodeID, id.Name(), err)
	case !bootstrapped:
		// Unlike a host's, a person's certificate is not taken on its
		// chain alone: its record may be revoked.
		return api.Errorf(api.CodeUnavailable, "member %s has not replicated the cluster state yet and cannot check %s; retry", s.id.NodeID, id.Name())
	case rec == nil:
		return api.Errorf(api.CodeUnauthenticated, "%s is not an operator credential of this cluster: its certificate is not accepted; ask an operator for one (kibo operator issue %s)", id.Name(), id.NodeID)
	case rec.RevokedAt != nil:
		return api.Errorf(api.CodeUnauthenticated, "%s was revoked at %s: its certificate is no longer accepted; ask an operator for a new one (kibo operator issue %s)", id.Name(), rec.RevokedAt.Format(time.RFC3339), id.NodeID)
	case !rec.IssuedAt.Equal(id.Admitted):
		return api.Errorf(api.CodeUnauthenticated, "certificate of %s is from an earlier issue (%s; issued again %s): it is no longer accepted; use the credential issued last", id.Name(), id.Admitted.Format(time.RFC3339), rec.IssuedAt.Format(time.RFC3339))
	case !time.Now().Before(rec.ExpiresAt):
		return api.Errorf(api.CodeUnauthenticated, "%s expired at %s: ask an operator for a new one (kibo operator issue %s)", id.Name(), rec.ExpiresAt.Format(time.RFC3339), id.NodeID)
	}
	return nil
}

// operatorGrantLevel refuses a grant with the operator role while a voter
// is below LevelOperators: its state machine would refuse the role and
// the replicas would disagree about the grant.
func (s *Server) operatorGrantLevel(roles []string) error {
	if !contains(roles, api.RoleOperator) {
		return nil
	}
	return s.levelsReach(fmt.Sprintf("enrollment grant with roles %s", strings.Join(roles, ",")), fsm.LevelOperators)
}
