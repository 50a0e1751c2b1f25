package fsm

import (
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

func getCommand(tx *bolt.Tx, id string) (*commandRecord, error) {
	var rec commandRecord
	ok, err := getJSON(tx, bucketCommands, []byte(id), &rec)
	if err != nil || !ok {
		return nil, err
	}
	return &rec, nil
}

func putCommand(tx *bolt.Tx, id string, rec commandRecord) error {
	return putJSON(tx, bucketCommands, []byte(id), rec)
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
		rec, err := getCommand(tx, string(k))
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
