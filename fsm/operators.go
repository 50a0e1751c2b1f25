package fsm

import (
	"encoding/hex"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Personal operator credentials (kibo operator issue): ctrl records who
// may call as operator:NAME, since when and until when; a certificate of
// kind operator is accepted only while its name's record exists, is not
// revoked and was issued at the time the certificate names. Issuing a
// name again replaces its record, so the earlier certificate stops
// working. The record holds the key's fingerprint, never a key.

// LevelOperators is the level of the operator role (ValidRoles accepts it
// from here on; the leader refuses grants with it below) and of
// OpOperatorIssue and OpOperatorRevoke.
const LevelOperators = 12

// Bounds of a personal operator credential's lifetime: at most as long
// as a host's operator certificate (the issue's bound for anything that
// may act as operator), at least long enough to be worth a certificate.
const (
	OperatorMaxTTL = 30 * 24 * time.Hour
	OperatorMinTTL = time.Hour
)

// MaxOperators bounds the operators bucket (revoked records included; a
// name issued again reuses its record).
const MaxOperators = 1000

// OperatorIssueArgs records a personal operator credential for the key
// whose fingerprint is given; the entry's time is its issue time.
type OperatorIssueArgs struct {
	Name           string        `json:"name"`
	KeyFingerprint string        `json:"key_fingerprint"`
	TTL            time.Duration `json:"ttl"`
}

// OperatorArgs names one operator credential.
type OperatorArgs struct {
	Name string `json:"name"`
}

// ValidOperatorName checks an operator's name: the syntax of a node id.
func ValidOperatorName(name string) error {
	if !nodeIDPattern.MatchString(name) {
		return api.Errorf(api.CodeInvalidArgument, "operator name %q is not valid: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// CheckOperatorTTL refuses a lifetime outside the bounds.
func CheckOperatorTTL(name string, ttl time.Duration) error {
	if ttl < OperatorMinTTL || ttl > OperatorMaxTTL {
		return api.Errorf(api.CodeInvalidArgument, "operator %s: ttl %s is out of range: give at least 1h and at most %dd (720h)", name, ttl, OperatorMaxTTL/(24*time.Hour))
	}
	return nil
}

func applyOperatorIssue(ac *applyCtx) (any, error) {
	var a OperatorIssueArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := ValidOperatorName(a.Name); err != nil {
		return nil, err
	}
	if err := CheckOperatorTTL(a.Name, a.TTL); err != nil {
		return nil, err
	}
	if b, err := hex.DecodeString(a.KeyFingerprint); err != nil || len(b) != 32 {
		return nil, api.Errorf(api.CodeInvalidArgument, "operator %s: key fingerprint %.80q is not 64 hex digits", a.Name, a.KeyFingerprint)
	}
	old, err := getRecord[api.Operator](ac.tx, bucketOperators, []byte(a.Name))
	if err != nil {
		return nil, err
	}
	if old == nil && countAtMost(ac.tx, bucketOperators, MaxOperators) >= MaxOperators {
		return nil, api.Errorf(api.CodeResourceExhausted, "operator %s: ctrl keeps at most %d operator credentials; revoke and reuse a name", a.Name, MaxOperators)
	}
	rec := api.Operator{Name: a.Name, IssuedAt: *at(ac.e), ExpiresAt: ac.e.IssuedAt.Add(a.TTL).UTC(), IssuedBy: ac.e.Actor, KeyFingerprint: a.KeyFingerprint}
	if err := putJSON(ac.tx, bucketOperators, []byte(a.Name), rec); err != nil {
		return nil, err
	}
	return operatorView(rec, ac.e.IssuedAt), nil
}

func applyOperatorRevoke(ac *applyCtx) (any, error) {
	var a OperatorArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	rec, err := GetOperator(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if rec.RevokedAt == nil {
		rec.RevokedAt = at(ac.e)
		if err := putJSON(ac.tx, bucketOperators, []byte(a.Name), rec); err != nil {
			return nil, err
		}
	}
	return operatorView(*rec, ac.e.IssuedAt), nil
}

// GetOperator is the record of operator name as stored (State unset).
func GetOperator(tx *bolt.Tx, name string) (*api.Operator, error) {
	if err := ValidOperatorName(name); err != nil {
		return nil, err
	}
	rec, err := getRecord[api.Operator](tx, bucketOperators, []byte(name))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeNotFound, "operator %s has no credential in this cluster: issue one with kibo operator issue %s", name, name)
	}
	return rec, nil
}

// ListOperators is every operator credential by name, its state as of now.
func ListOperators(tx *bolt.Tx, now time.Time) ([]api.Operator, error) {
	out := []api.Operator{}
	err := tx.Bucket(bucketOperators).ForEach(func(k, v []byte) error {
		var rec api.Operator
		if err := jsonRecord(bucketOperators, k, v, &rec); err != nil {
			return err
		}
		out = append(out, operatorView(rec, now))
		return nil
	})
	return out, err
}

// operatorView is rec with its state as of now.
func operatorView(rec api.Operator, now time.Time) api.Operator {
	switch {
	case rec.RevokedAt != nil:
		rec.State = api.OperatorRevoked
	case !now.Before(rec.ExpiresAt):
		rec.State = api.OperatorExpired
	default:
		rec.State = api.OperatorActive
	}
	return rec
}
