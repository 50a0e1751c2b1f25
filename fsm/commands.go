package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/kibotos/kibotos/api"
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
// Entries with CommandLog always have the digest.
func commandKey(e *Entry) []byte {
	if !e.CommandDigest && !e.CommandLog {
		return []byte(e.CommandID)
	}
	sum := sha256.Sum256([]byte(e.CommandID))
	return append([]byte{0}, sum[:]...)
}

// findCommand is e's command record, nil when the command is new. An
// entry with Entry.CommandLog looks in the command log first; every entry
// looks where entries without it keep theirs, and with CommandDigest
// under the id itself too: the command may have been applied before
// every voter reached the level. Those two lookups are skipped once the
// last such record expired. An entry without CommandLog does not see the
// log, as an older voter, which applies it too, does not.
func findCommand(ac *applyCtx) (*commandRecord, error) {
	key := commandKey(ac.e)
	if ac.e.CommandLog {
		rec, err := findLoggedCommand(ac, key)
		if rec != nil || err != nil {
			return rec, err
		}
	}
	if k, _ := ac.tx.Bucket(bucketCommands).Cursor().First(); k == nil {
		return nil, nil
	}
	rec, err := getRecord[commandRecord](ac.tx, bucketCommands, key)
	if rec == nil && err == nil && (ac.e.CommandDigest || ac.e.CommandLog) {
		rec, err = getRecord[commandRecord](ac.tx, bucketCommands, []byte(ac.e.CommandID))
	}
	return rec, err
}

func putCommand(ac *applyCtx, rec commandRecord) error {
	key := commandKey(ac.e)
	if ac.e.CommandLog {
		return putLoggedCommand(ac, key, rec)
	}
	if err := putJSON(ac.tx, bucketCommands, key, rec); err != nil {
		return err
	}
	return ac.tx.Bucket(bucketCommandTimes).Put(commandTimeKey(rec.AppliedAt, key), key)
}

// commandTimeKey is the key of a command record's entry in the time
// index. The key's digest, not the key, follows the time: a command id
// may be as long as bbolt's longest key. The FSM clock never goes back,
// so records are appended at the index's end.
func commandTimeKey(appliedAt time.Time, key []byte) []byte {
	return timeDigestKey(indexTime(appliedAt), sha256.Sum256(key))
}

// timeDigestKey is a time (indexTime) followed by a command key's digest:
// the key of the time index and of the command log.
func timeDigestKey(at uint64, sum [sha256.Size]byte) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(sum)), at), sum[:]...)
}

// indexTime orders times in the index; none is before 1970 but the zero
// time of a record without one, which sorts first.
func indexTime(t time.Time) uint64 {
	if t.Before(time.Unix(0, 0)) {
		return 0
	}
	return uint64(t.UnixNano())
}

// The time index is this build's: an older build neither reads nor
// writes it, yet may carry it in its snapshots and state while it adds and
// drops command records (a follower not yet upgraded that installed a
// snapshot of an upgraded leader, or a downgrade). So the index says as
// of which FSM clock it matched the records (keyCommandTimesAt, written
// with every advance of the clock, by this build only), and Restore
// builds it anew unless that is the state's clock and both buckets hold
// as many keys.

// checkCommandTimes keeps the index a restored state brings if it is
// marked at the state's clock and as long as the records, and builds it
// anew otherwise.
func checkCommandTimes(tx *bolt.Tx) error {
	return checkDerived(tx, keyCommandTimesAt, func() bool {
		return tx.Bucket(bucketCommands).Stats().KeyN == tx.Bucket(bucketCommandTimes).Stats().KeyN
	}, rebuildCommandTimes)
}

// derivedMarks are the meta keys that say as of which clock a derived
// index matched its records: this build writes each with every advance of
// the clock (putClock).
var derivedMarks = [][]byte{keyCommandTimesAt, keyWorkspaceCommandsAt, keyWorkspaceEndsAt}

// freshBucket replaces a derived index's bucket with an empty one.
func freshBucket(tx *bolt.Tx, name []byte) (*bolt.Bucket, error) {
	if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
		return nil, err
	}
	return tx.CreateBucket(name)
}

// checkDerived keeps a derived index a restored state brings if its mark
// (a key of bucketMeta) is the state's clock and it agrees with its
// records as far as agrees checks, and builds it anew otherwise.
func checkDerived(tx *bolt.Tx, markKey []byte, agrees func() bool, rebuild func(*bolt.Tx) error) error {
	meta := tx.Bucket(bucketMeta)
	clock, mark := meta.Get(keyClock), meta.Get(markKey)
	if mark != nil && bytes.Equal(clock, mark) && agrees() {
		return nil
	}
	if err := rebuild(tx); err != nil {
		return err
	}
	if clock == nil {
		return meta.Delete(markKey)
	}
	return meta.Put(markKey, bytes.Clone(clock))
}

// rebuildCommandTimes makes the time index anew from the command
// records. A record that does not decode gets no entry: the scan of
// older builds skips it too.
func rebuildCommandTimes(tx *bolt.Tx) error {
	idx, err := freshBucket(tx, bucketCommandTimes)
	if err != nil {
		return err
	}
	type entry struct {
		at  time.Time
		key []byte
	}
	var entries []entry
	err = tx.Bucket(bucketCommands).ForEach(func(k, v []byte) error {
		var rec struct {
			AppliedAt time.Time `json:"applied_at"`
		}
		if json.Unmarshal(v, &rec) != nil {
			return nil
		}
		entries = append(entries, entry{rec.AppliedAt, bytes.Clone(k)})
		return nil
	})
	if err != nil {
		return err
	}
	// In time order, so that pages fill once, as the index's appends do.
	slices.SortFunc(entries, func(a, b entry) int { return a.at.Compare(b.at) })
	idx.FillPercent = 1
	for _, e := range entries {
		if err := idx.Put(commandTimeKey(e.at, e.key), e.key); err != nil {
			return err
		}
	}
	return nil
}

// applyCommandsExpire forgets results older than the retention window; the
// leader computes Before from its clock, so replicas agree. It reads the
// time index from its oldest entry, so its work is what it drops (a scan
// of every record, as older builds make, took 3.5 µs a record: seconds
// on a busy cluster's 24 hours of records, every CommandExpiry, on every
// member); Limit bounds it further, and the leader applies again while
// More.
func applyCommandsExpire(ac *applyCtx) (any, error) {
	var a CommandsExpireArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	// Oldest first, up to Before: the same records the scan of every
	// record that older builds make drops.
	if a.Limit < 0 {
		return nil, api.Errorf(api.CodeInvalidArgument, "%s: limit %d is negative", ac.e.Op, a.Limit)
	}
	idx := ac.tx.Bucket(bucketCommandTimes)
	before := indexTime(a.Before)
	var res CommandsExpireResult
	c := idx.Cursor()
	seen := 0
	for k, key := c.First(); k != nil; k, key = c.First() {
		if len(k) == 8+sha256.Size && binary.BigEndian.Uint64(k) >= before {
			break
		}
		// Each entry looked at counts: the limit bounds the apply's work.
		if a.Limit > 0 && seen == a.Limit {
			res.More = true
			break
		}
		seen++
		key = bytes.Clone(key) // the entry's memory goes with it
		rec, rerr := getRecord[commandRecord](ac.tx, bucketCommands, key)
		if err := c.Delete(); err != nil {
			return nil, err
		}
		switch {
		case rerr != nil || rec == nil:
			// Its record is gone, or unreadable: the scan older builds
			// make keeps an unreadable record, so only the entry goes.
		case rec.AppliedAt.Before(a.Before):
			if err := ac.tx.Bucket(bucketCommands).Delete(key); err != nil {
				return nil, err
			}
			res.Expired++
		default:
			// The entry was not this record's: give it its own, later
			// than Before, so a coming expiry finds it.
			if err := idx.Put(commandTimeKey(rec.AppliedAt, key), key); err != nil {
				return nil, err
			}
		}
	}
	if res.More {
		return res, nil
	}
	// Then the command log, with what is left of the limit (the older
	// layout's records are older).
	budget := -1
	if a.Limit > 0 {
		budget = a.Limit - seen
	}
	n, more, err := expireLoggedCommands(ac, before, budget)
	if err != nil {
		return nil, err
	}
	res.Expired += n
	res.More = more
	return res, nil
}
