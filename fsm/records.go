package fsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"regexp"
	"sync"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Records, arguments and results are JSON, encoded and decoded with
// segmentio/encoding/json: the standard library's format and rules (it
// runs the standard library's tests) at about twice the speed, which is
// most of an apply's CPU. Every replica decodes what a Marshal wrote, so
// the two libraries agree on every byte the FSM reads.
func getJSON(tx *bolt.Tx, bucket, key []byte, v any) (bool, error) {
	raw := tx.Bucket(bucket).Get(key)
	if raw == nil {
		return false, nil
	}
	return true, jsonRecord(bucket, key, raw, v)
}

// getRecord reads the record of bucket/key as a T, nil when there is none.
func getRecord[T any](tx *bolt.Tx, bucket, key []byte) (*T, error) {
	var v T
	ok, err := getJSON(tx, bucket, key, &v)
	if err != nil || !ok {
		return nil, err
	}
	return &v, nil
}

// jsonRecord decodes the stored record raw of bucket/key.
func jsonRecord(bucket, key, raw []byte, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("state record %s/%s is corrupt: %w", bucket, key, err)
	}
	return nil
}

func putJSON(tx *bolt.Tx, bucket, key []byte, v any) error {
	raw, err := encodeRecord(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put(key, raw)
}

func putUint(tx *bolt.Tx, bucket, key []byte, n uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return tx.Bucket(bucket).Put(key, b[:])
}

func decodeArgs(e *Entry, v any) error {
	if err := json.Unmarshal(e.Args, v); err != nil {
		return api.Errorf(api.CodeInvalidArgument, "%s: malformed arguments: %v", e.Op, err)
	}
	return nil
}

func at(e *Entry) *time.Time {
	t := e.IssuedAt.UTC()
	return &t
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidNodeID checks a node id: 1–63 letters, digits, '.', '_' or '-',
// starting with a letter or digit.
func ValidNodeID(id string) error {
	if !nodeIDPattern.MatchString(id) {
		return api.Errorf(api.CodeInvalidArgument, "node id %q is not valid: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

// ValidRoles checks a role list: ctrl and/or node, no repeats, and
// operator (LevelOperators) only beside one of them: it is an extra of a
// member, whose host then holds an operator certificate.
func ValidRoles(roles []string) error {
	if len(roles) == 0 {
		return api.Errorf(api.CodeInvalidArgument, "roles are empty: give ctrl, node or ctrl,node")
	}
	seen := map[string]bool{}
	for _, r := range roles {
		if r != api.RoleCtrl && r != api.RoleNode && r != api.RoleOperator {
			return api.Errorf(api.CodeInvalidArgument, "role %q is unknown: use ctrl, node or ctrl,node, with operator beside node for a node whose host may act as operator", r)
		}
		if seen[r] {
			return api.Errorf(api.CodeInvalidArgument, "role %q is given twice", r)
		}
		seen[r] = true
	}
	if seen[api.RoleOperator] && !seen[api.RoleCtrl] && !seen[api.RoleNode] {
		return api.Errorf(api.CodeInvalidArgument, "role operator is given alone: it goes beside node (node,operator); a person gets an operator credential with kibo operator issue NAME")
	}
	return nil
}

func checkVersion(e *Entry, current uint64, object string) error {
	if e.ExpectedVersion != nil && *e.ExpectedVersion != current {
		return api.Errorf(api.CodeVersionMismatch,
			"%s is at version %d, not the expected %d: read it again and retry with the current version", object, current, *e.ExpectedVersion)
	}
	return nil
}

// moveIndex keeps a record's entry in the index bucket b in step as the
// record goes from old to now (either may be nil): key is the record's
// entry, nil when it has none.
func moveIndex[T any](b *bolt.Bucket, old, now *T, key func(*T) []byte) error {
	var before, after []byte
	if old != nil {
		before = key(old)
	}
	if now != nil {
		after = key(now)
	}
	if bytes.Equal(before, after) {
		return nil
	}
	if before != nil {
		if err := b.Delete(before); err != nil {
			return err
		}
	}
	if after != nil {
		return b.Put(after, nil)
	}
	return nil
}

// encodeRecord is how the FSM encodes what it stores and what it
// answers: the standard library's format without its HTML escaping (no
// record or answer is embedded in HTML), and with the json.RawMessage
// parts copied as they are. Every RawMessage the FSM holds is valid JSON,
// decoded by json.Unmarshal (which checks it) or encoded by this FSM;
// json.Marshal parsed, compacted and escaped each again, a fifth of an
// operator write on a node that carries its report through as stored
// (adminNode, BenchmarkOvercommitSet). A RawMessage made of other bytes
// must be checked before it reaches a record.
func encodeRecord(v any) ([]byte, error) {
	buf := recordBuffers.Get().(*[]byte)
	defer recordBuffers.Put(buf)
	b, err := json.Append((*buf)[:0], v, json.SortMapKeys|json.TrustRawMessage)
	*buf = b[:0]
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil // the exact size, as json.Marshal
}

// recordBuffers are encodeRecord's buffers, reused from record to record.
var recordBuffers = sync.Pool{New: func() any { return new([]byte) }}
