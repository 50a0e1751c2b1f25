package fsm

import (
	"crypto/subtle"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// grantRecord is a grant with the hash of its secret; the secret itself
// exists only in the string handed to the operator.
type grantRecord struct {
	api.Grant
	SecretHash string `json:"secret_hash"`
}

func revokePendingGrant(tx *bolt.Tx, nodeID string) error {
	g, err := getRecord[grantRecord](tx, bucketGrants, []byte(nodeID))
	if err != nil || g == nil || g.State != api.GrantPending {
		return err
	}
	g.State = api.GrantRevoked
	return putJSON(tx, bucketGrants, []byte(nodeID), g)
}

func applyEnrollmentGrant(ac *applyCtx) (any, error) {
	var a GrantArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := ValidNodeID(a.NodeID); err != nil {
		return nil, err
	}
	if err := ValidRoles(a.Roles); err != nil {
		return nil, err
	}
	if a.SecretHash == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "grant for node %s: the secret hash is missing", a.NodeID)
	}
	if a.TTL <= 0 {
		return nil, api.Errorf(api.CodeInvalidArgument, "grant for node %s: ttl must be positive", a.NodeID)
	}
	n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(a.NodeID))
	if err != nil {
		return nil, err
	}
	if n != nil {
		if err := notRetired(n, "a new enrollment grant"); err != nil {
			return nil, err
		}
		if n.Admission == api.Admitted {
			return nil, api.Errorf(api.CodeFailedPrecondition,
				"node %s is already an admitted member; revoke it first (kibo enrollment revoke %s) or use a new node id", a.NodeID, a.NodeID)
		}
	}
	g := grantRecord{
		Grant:      api.Grant{NodeID: a.NodeID, Roles: a.Roles, IssuedAt: *at(ac.e), ExpiresAt: ac.e.IssuedAt.Add(a.TTL).UTC(), State: api.GrantPending},
		SecretHash: a.SecretHash,
	}
	if err := putJSON(ac.tx, bucketGrants, []byte(a.NodeID), g); err != nil {
		return nil, err
	}
	return g.Grant, nil
}

func applyEnrollmentRevoke(ac *applyCtx) (any, error) {
	var a NodeArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	g, err := getRecord[grantRecord](ac.tx, bucketGrants, []byte(a.NodeID))
	if err != nil {
		return nil, err
	}
	n, err := getRecord[api.Node](ac.tx, bucketNodes, []byte(a.NodeID))
	if err != nil {
		return nil, err
	}
	if g == nil && n == nil {
		return nil, api.Errorf(api.CodeNotFound, "node %s has no enrollment grant and no registration", a.NodeID)
	}
	out := map[string]any{"node_id": a.NodeID, "grant_revoked": false, "node_revoked": false}
	if g != nil && g.State == api.GrantPending {
		if err := revokePendingGrant(ac.tx, a.NodeID); err != nil {
			return nil, err
		}
		out["grant_revoked"] = true
	}
	if n != nil && n.Admission == api.Admitted && !n.Retired {
		n.Admission = api.Revoked
		endSession(n, ac.e, "revoked")
		if err := putNode(ac, n); err != nil {
			return nil, err
		}
		out["node_revoked"] = true
	}
	return out, nil
}

func applyEnrollmentConsume(ac *applyCtx) (any, error) {
	var a ConsumeArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	g, n, err := checkGrant(ac.tx, a.NodeID, a.SecretHash, ac.e.IssuedAt)
	if err != nil {
		return nil, err
	}
	if n == nil {
		n = &api.Node{NodeID: a.NodeID}
	}
	n.Roles, n.Address, n.Admission, n.AdmittedAt = g.Roles, a.Address, api.Admitted, *at(ac.e)
	g.State, g.UsedAt, g.UsedBy = api.GrantUsed, at(ac.e), a.Address
	if err := putJSON(ac.tx, bucketGrants, []byte(a.NodeID), g); err != nil {
		return nil, err
	}
	if err := putNode(ac, n); err != nil {
		return nil, err
	}
	return view(ac.tx, n)
}

// CheckGrant tells whether a join with this grant would be admitted at
// time now, without changing anything: the member that receives a join
// checks it before it signs or proposes anything.
func CheckGrant(tx *bolt.Tx, nodeID, secretHash string, now time.Time) error {
	_, _, err := checkGrant(tx, nodeID, secretHash, now)
	return err
}

// GrantUsedBy says nodeID's grant with secretHash was used by a host
// advertising address. A join whose answer was lost (its leader changed
// after the admission committed) is sent again; its own admission is then
// replayed (handleJoin).
func GrantUsedBy(tx *bolt.Tx, nodeID, secretHash, address string) bool {
	g, err := getRecord[grantRecord](tx, bucketGrants, []byte(nodeID))
	return err == nil && g != nil && g.State == api.GrantUsed && g.UsedBy == address &&
		subtle.ConstantTimeCompare([]byte(g.SecretHash), []byte(secretHash)) == 1
}

func checkGrant(tx *bolt.Tx, nodeID, secretHash string, now time.Time) (*grantRecord, *api.Node, error) {
	g, err := getRecord[grantRecord](tx, bucketGrants, []byte(nodeID))
	if err != nil {
		return nil, nil, err
	}
	if g == nil || subtle.ConstantTimeCompare([]byte(g.SecretHash), []byte(secretHash)) != 1 {
		return nil, nil, api.Errorf(api.CodeUnauthenticated, "enrollment grant for node %s is not valid in this cluster; ask an operator for a new one (kibo enrollment grant %s)", nodeID, nodeID)
	}
	switch {
	case g.State == api.GrantUsed:
		return nil, nil, api.Errorf(api.CodeFailedPrecondition, "enrollment grant for node %s was already used at %s; a grant admits one host once, ask for a new one", nodeID, g.UsedAt.Format("2006-01-02T15:04:05Z"))
	case g.State == api.GrantRevoked:
		return nil, nil, api.Errorf(api.CodeFailedPrecondition, "enrollment grant for node %s was revoked; ask an operator for a new one", nodeID)
	case !now.Before(g.ExpiresAt):
		return nil, nil, api.Errorf(api.CodeFailedPrecondition, "enrollment grant for node %s expired at %s; ask an operator for a new one", nodeID, g.ExpiresAt.Format("2006-01-02T15:04:05Z"))
	}
	n, err := getRecord[api.Node](tx, bucketNodes, []byte(nodeID))
	if err != nil {
		return nil, nil, err
	}
	if n != nil && n.Retired {
		return nil, nil, notRetired(n, "joining")
	}
	return g, n, nil
}
