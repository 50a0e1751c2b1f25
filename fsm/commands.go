package fsm

import (
	"crypto/sha256"
	"time"

	bolt "go.etcd.io/bbolt"
)

// commandRecord is the stored outcome of a command with a command id.
type commandRecord struct {
	Op        string    `json:"op"`
	InputHash string    `json:"input_hash"`
	AppliedAt time.Time `json:"applied_at"`
	Result    Result    `json:"result"`
}

// commandKey is where e's command record is stored. An entry with
// CommandDigest (LevelEntryFormat) keys it by the id's sha256 behind a 0
// byte: a command id may be up to bolt.MaxKeySize bytes, and keys that
// long leave three or four to a page of the command bucket, so every
// insert rewrote a deep path of pages (a 1 KiB id doubled a write's CPU).
// An entry without it keys by the id itself, as every older build does.
func commandKey(e *Entry) []byte {
	if !e.CommandDigest {
		return []byte(e.CommandID)
	}
	sum := sha256.Sum256([]byte(e.CommandID))
	return append([]byte{0}, sum[:]...)
}

// findCommand is e's command record, nil when the command is new. With
// CommandDigest the id itself is looked up too: the command may have been
// applied before every voter reached the level.
func findCommand(tx *bolt.Tx, e *Entry) (*commandRecord, error) {
	rec, err := getCommand(tx, commandKey(e))
	if rec == nil && err == nil && e.CommandDigest {
		rec, err = getCommand(tx, []byte(e.CommandID))
	}
	return rec, err
}

func getCommand(tx *bolt.Tx, key []byte) (*commandRecord, error) {
	var rec commandRecord
	ok, err := getJSON(tx, bucketCommands, key, &rec)
	if err != nil || !ok {
		return nil, err
	}
	return &rec, nil
}

func putCommand(tx *bolt.Tx, e *Entry, rec commandRecord) error {
	return putJSON(tx, bucketCommands, commandKey(e), rec)
}

// applyCommandsExpire forgets results older than the retention window; the
// leader computes Before from its clock, so replicas agree.
func applyCommandsExpire(tx *bolt.Tx, e *Entry) (any, error) {
	var a CommandsExpireArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	var drop [][]byte
	c := tx.Bucket(bucketCommands).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		rec, err := getCommand(tx, k)
		if err != nil || rec == nil {
			continue
		}
		if rec.AppliedAt.Before(a.Before) {
			drop = append(drop, append([]byte(nil), k...))
		}
	}
	for _, k := range drop {
		if err := tx.Bucket(bucketCommands).Delete(k); err != nil {
			return nil, err
		}
	}
	return map[string]int{"expired": len(drop)}, nil
}
