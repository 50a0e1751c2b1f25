package fsm

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"
)

// The command log (LevelCommandLog): an entry with Entry.CommandLog
// stores its command record in bucketCommandLog under the record's time
// and its command key's digest, the key the time index gives older
// records (commandTimeKey). The FSM clock never goes back, so a write
// appends its record to the bucket's last page, and expiry drops from its
// first: every write rewrote a page of its own in a random place of the
// command bucket before, and that bucket's inserts, lookups and page
// writes grew with the 24 hours of records a busy cluster keeps
// (BenchmarkApplyBatchCommands; bench/README.md, and in its git history
// "The command log's growth, FSM alone").
//
// A retry finds its record through commandIndex, which is derived from the
// bucket (never part of the state): digest → time, built again from the
// bucket's keys at every Restore and after any batch that did not commit.
// Records of entries without the flag stay where older builds keep them
// (commands.go), and are looked up there too.

// LevelCommandLog is the level of Entry.CommandLog.
const LevelCommandLog = 9

// commandLogKeyLen is the length of a key of bucketCommandLog: the time
// (8 bytes) and the digest of the command key.
const commandLogKeyLen = 8 + sha256.Size

// commandIndex finds a record of the command log by its command key: the
// digest of the key, to the record's time. It costs about 100 bytes of
// memory per record the log holds.
//
// Only ApplyBatch uses it, and Raft applies one batch at a time: like the
// place cache it has no lock of its own.
type commandIndex struct {
	at    map[[sha256.Size]byte]uint64
	stale bool // rebuild from the state before the next batch
}

func newCommandIndex() *commandIndex {
	return &commandIndex{at: map[[sha256.Size]byte]uint64{}}
}

// beginBatch readies ix for one batch, rebuilding it if it is stale. A
// batch that does not commit must be followed by invalidate.
func (ix *commandIndex) beginBatch(tx *bolt.Tx) error {
	if ix.stale {
		return ix.rebuild(tx)
	}
	return nil
}

// invalidate: the state changed in a way the index did not see (a batch
// rolled back after it added or dropped records, a restore).
func (ix *commandIndex) invalidate() { ix.stale = true }

// rebuild reads the log's keys. A key of another length (no build writes
// one) gets no entry: no retry can find it, and expiry drops it by its
// position at the log's start.
func (ix *commandIndex) rebuild(tx *bolt.Tx) error {
	clear(ix.at)
	if b := tx.Bucket(bucketCommandLog); b != nil {
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if len(k) == commandLogKeyLen {
				ix.at[[sha256.Size]byte(k[8:])] = binary.BigEndian.Uint64(k)
			}
		}
	}
	ix.stale = false
	return nil
}

// findLoggedCommand is the command log's record under key, nil if none.
func findLoggedCommand(ac *applyCtx, key []byte) (*commandRecord, error) {
	sum := sha256.Sum256(key)
	at, ok := ac.commands.at[sum]
	if !ok {
		return nil, nil
	}
	var rec commandRecord
	ok, err := getJSON(ac.tx, bucketCommandLog, timeDigestKey(at, sum), &rec)
	if err == nil && !ok {
		err = fmt.Errorf("command log: the index names a record at %d that is not there", at)
	}
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// putLoggedCommand appends rec under key to the command log.
func putLoggedCommand(ac *applyCtx, key []byte, rec commandRecord) error {
	logKey := commandTimeKey(rec.AppliedAt, key)
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	b := ac.tx.Bucket(bucketCommandLog)
	b.FillPercent = 1 // appended in time order: pages split full
	if err := b.Put(logKey, raw); err != nil {
		return err
	}
	ac.commands.at[[sha256.Size]byte(logKey[8:])] = binary.BigEndian.Uint64(logKey)
	return nil
}

// expireLoggedCommands drops the log's records from its start while they
// are older than before, no more than budget of them (negative: no
// limit); it says how many it dropped and whether it stopped at its
// budget with older ones left.
func expireLoggedCommands(ac *applyCtx, before uint64, budget int) (expired int, more bool, err error) {
	c := ac.tx.Bucket(bucketCommandLog).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.First() {
		if len(k) >= 8 && binary.BigEndian.Uint64(k) >= before {
			break
		}
		if budget >= 0 && expired == budget {
			return expired, true, nil
		}
		if len(k) == commandLogKeyLen {
			delete(ac.commands.at, [sha256.Size]byte(k[8:]))
		}
		if err := c.Delete(); err != nil {
			return expired, false, err
		}
		expired++
	}
	return expired, false, nil
}
