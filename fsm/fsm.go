// Package fsm is the deterministic state machine of a Kibotos cluster: Raft
// log entries in, bbolt state out. It owns the state layout and every rule
// that decides whether a write is accepted.
//
// It must never read the clock, draw random numbers, depend on map order or
// do I/O besides its own bbolt transaction: time comes from the entry
// (IssuedAt, set by the leader), identifiers come from the entry's arguments.
//
// Besides api value types it imports one package of ours, ctrl/placement:
// a pure function of node records, run inside the apply so two creates can
// never both win a node's last room.
//
// Replicas never drift silently. An entry's handler either succeeds or
// rejects it with an *api.Error before its first write; that rejection is
// the entry's result on every replica. Any other error (a bbolt write, a
// record that does not encode or decode, a failed commit) and an
// operation this binary does not know (without IgnoreUnknown) make
// ApplyBatch return a *HaltError: nothing of the batch commits, no result
// is recorded, and the replica must stop applying the log until it is
// fixed or upgraded. A handler must therefore never return a non-api error
// for a rule it checks, nor an *api.Error after it wrote.
package fsm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	stdjson "encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// FSM holds the state in one bbolt file. The file is scratch: Raft restores
// it from the latest snapshot and replays the log at every start, so it is
// opened fresh and written without fsync (the Raft log is the durable copy).
type FSM struct {
	path string

	mu sync.RWMutex // guards db against Restore swapping it
	db *bolt.DB

	cache    *placeCache   // derived from the state, never part of it
	commands *commandIndex // derived from the state, never part of it

	// beforeCommit, when set (tests), runs after the last entry of a batch;
	// its error fails the batch as a failed commit would.
	beforeCommit func(tx *bolt.Tx) error

	// observe, when set, is told how long each entry's apply took
	// (ObserveApply): a measurement for metrics, which no result or
	// state ever depends on.
	observe atomic.Pointer[func(op string, d time.Duration)]
}

// ObserveApply makes every apply report its op and how long it took to
// fn (an op no handler knows reports as "unknown"). fn runs inside the
// apply: it must be quick and must not touch the FSM.
func (f *FSM) ObserveApply(fn func(op string, d time.Duration)) {
	f.observe.Store(&fn)
}

var handlers = map[string]handler{
	OpNamespaceCreate:      applyNamespaceCreate,
	OpNamespaceDelete:      applyNamespaceDelete,
	OpAPIKeyCreate:         applyAPIKeyCreate,
	OpAPIKeyRevoke:         applyAPIKeyRevoke,
	OpNamespaceQuota:       applyNamespaceSetQuota,
	OpAPIKeyUsed:           applyAPIKeyUsed,
	OpNamespaceDefaults:    applyNamespaceDefaults,
	OpBootstrap:            applyBootstrap,
	OpEnrollmentGrant:      applyEnrollmentGrant,
	OpEnrollmentRevoke:     applyEnrollmentRevoke,
	OpEnrollmentConsume:    applyEnrollmentConsume,
	OpSessionOpen:          applySessionOpen,
	OpSessionClose:         applySessionClose,
	OpNodeReport:           applyNodeReport,
	OpNodeDrain:            applyNodeDrain,
	OpNodeCancelDrain:      applyNodeCancelDrain,
	OpNodeIsolate:          applyNodeIsolate,
	OpNodeRetire:           applyNodeRetire,
	OpOvercommitSetDefault: applyOvercommitSetDefault,
	OpOvercommitSet:        applyOvercommitSet,
	OpOvercommitAck:        applyOvercommitAck,
	OpCommandsExpire:       applyCommandsExpire,
	OpWorkspaceCreate:      applyWorkspaceCreate,
	OpWorkspaceStart:       applyWorkspaceStart,
	OpWorkspaceStop:        applyWorkspaceStop,
	OpWorkspaceDelete:      applyWorkspaceDelete,
	OpWorkspaceResult:      applyWorkspaceResult,
	OpWorkspaceSetNetwork:  applyWorkspaceSetNetwork,
	OpEgressCreate:         applyEgressCreate,
	OpEgressUpdate:         applyEgressUpdate,
	OpEgressDelete:         applyEgressDelete,
	OpResolverCreate:       applyResolverCreate,
	OpResolverDelete:       applyResolverDelete,
	OpPoolSetCapacity:      applyPoolSetCapacity,
	OpPoolDeclareLost:      applyPoolDeclareLost,
	OpVolumeCreate:         applyVolumeCreate,
	OpVolumeResize:         applyVolumeResize,
	OpVolumeDelete:         applyVolumeDelete,
	OpVolumeResult:         applyVolumeResult,
	OpMemberLevel:          applyMemberLevel,
	OpWorkspacePause:       applyWorkspacePause,
	OpTemplatePublish:      applyTemplatePublish,
	OpTemplateDelete:       applyTemplateDelete,
	OpPlatformPublish:      applyPlatformPublish,
	OpPlatformApprove:      applyPlatformApprove,
	OpPlatformWithdraw:     applyPlatformWithdraw,
	OpTransferExport:       applyTransferExport,
	OpTransferResult:       applyTransferResult,
	OpTransferDelete:       applyTransferDelete,
	OpTransferProgress:     applyTransferProgress,
	OpOperatorIssue:        applyOperatorIssue,
	OpOperatorRevoke:       applyOperatorRevoke,
	OpCARotateBegin:        applyCARotateBegin,
	OpCARotateSign:         applyCARotateSign,
	OpCARotateFinish:       applyCARotateFinish,
	OpWorkspaceSetTimeout:  applyWorkspaceSetTimeout,
	OpWorkspaceTimedOut:    applyWorkspaceTimedOut,
	OpWorkspaceIdlePause:   applyWorkspaceIdlePause,
}

// Open creates a fresh state file at path (any old file is replaced).
func Open(path string) (*FSM, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", filepath.Dir(path), err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("remove old state file %s: %w", path, err)
	}
	db, err := openDB(path)
	if err != nil {
		return nil, err
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return &FSM{path: path, db: db, cache: newPlaceCache(), commands: newCommandIndex()}, nil
}

// stateMmapSize is how much of the state file bbolt maps from the start
// (address space, not memory): see openDB.
const stateMmapSize = 1 << 30

// openDB opens the state file. It is scratch (see FSM), so nothing of it
// is ever synced: not its commits (NoSync), its freelist (NoFreelistSync)
// nor its growth (NoGrowSync: otherwise bbolt fsyncs the whole file, every
// commit's pages still dirty in the page cache, each time the file grows
// by its AllocSize, which under a steady write load stalled applies every
// few seconds). And a Raft snapshot holds a read transaction for as long
// as it writes the state out, while bbolt remaps only once every read
// transaction ended: mapped large from the start (as etcd maps its
// backend), a file that grows does not make the applies wait for the
// snapshot.
func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoFreelistSync: true, NoGrowSync: true, InitialMmapSize: stateMmapSize, Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	return db, nil
}

// Close closes the state file.
func (f *FSM) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.db.Close()
}

// ApplyBatch applies entries in order in one bbolt transaction (group
// commit) and returns one result per entry. A rejected entry changes
// nothing but the FSM clock (see clampIssuedAt) and the placement counts
// (placements.go): every apply function checks all its preconditions
// before its first write.
//
// When the batch cannot be applied as on every other replica (see
// HaltError) it returns a *HaltError, no results, and nothing of the batch
// is committed; the caller must stop applying the log.
func (f *FSM) ApplyBatch(entries []Entry) ([]Result, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	results := make([]Result, len(entries))
	err := f.db.Update(func(tx *bolt.Tx) error {
		f.cache.beginBatch()
		if err := f.commands.beginBatch(tx); err != nil {
			return &HaltError{Pos: -1, Err: err}
		}
		clock, err := getClock(tx)
		if err != nil {
			return &HaltError{Pos: -1, Err: err}
		}
		last := clock
		observe := f.observe.Load()
		ac := &applyCtx{tx: tx, cache: f.cache, commands: f.commands}
		for i := range entries {
			e := entries[i]
			clock = clampIssuedAt(&e, clock)
			var t0 time.Time
			if observe != nil {
				t0 = time.Now()
			}
			ac.e, ac.tally = &e, nil
			res, err := applyOne(ac)
			if observe != nil {
				op := e.Op
				if handlers[op] == nil {
					op = "unknown"
				}
				(*observe)(op, time.Since(t0))
			}
			if err != nil {
				if h, ok := err.(*HaltError); ok {
					h.Pos = i
					return h
				}
				return &HaltError{Pos: i, Op: e.Op, Err: err}
			}
			results[i] = res
		}
		if clock.After(last) {
			if err := putClock(tx, clock); err != nil {
				return &HaltError{Pos: -1, Err: err}
			}
		}
		if f.beforeCommit != nil {
			return f.beforeCommit(tx)
		}
		return nil
	})
	if err != nil {
		// Nothing of the batch committed.
		f.cache.invalidate()
		f.commands.invalidate()
		if h, ok := err.(*HaltError); ok {
			return nil, h
		}
		return nil, &HaltError{Pos: -1, Err: err}
	}
	return results, nil
}

// Apply is ApplyBatch for callers that build the log themselves (tests,
// benchmarks): a batch that halts yields an internal error result for every
// entry, and nothing of it is committed. A Raft replica must use
// ApplyBatch and stop on its error instead.
func (f *FSM) Apply(entries []Entry) []Result {
	results, err := f.ApplyBatch(entries)
	if err != nil {
		results = make([]Result, len(entries))
		for i := range results {
			results[i] = Result{Error: &api.Error{Code: api.CodeInternal, Message: err.Error()}}
		}
	}
	return results
}

// applyOne applies one entry. A handler's *api.Error is a clean rejection
// (nothing written, recorded as the entry's result); any other error is
// internal: the handler may have written already, so it is returned and
// halts the batch rather than commit half an entry.
func applyOne(ac *applyCtx) (Result, error) {
	var hash string
	if ac.e.CommandID != "" {
		// Checked before the handler runs: a record that cannot be stored
		// afterwards would halt every replica at this entry.
		if len(ac.e.CommandID) > bolt.MaxKeySize {
			return Result{Error: api.Errorf(api.CodeInvalidArgument, "command id is %d bytes long; use at most %d", len(ac.e.CommandID), bolt.MaxKeySize)}, nil
		}
		hash = inputHash(ac.e)
		rec, err := findCommand(ac)
		if err != nil {
			return Result{}, err
		}
		if rec != nil {
			if rec.InputHash != hash {
				return Result{Error: api.Errorf(api.CodeFailedPrecondition,
					"command %s was already used for %s with different inputs; use a new --command-id", ac.e.CommandID, rec.Op)}, nil
			}
			res := rec.Result
			res.Replayed = true
			return res, nil
		}
	}
	if ac.e.Op != OpBootstrap && ac.tx.Bucket(bucketMeta).Get(keyClusterID) == nil {
		return Result{Error: api.Errorf(api.CodeFailedPrecondition, "%s: the cluster is not bootstrapped yet", ac.e.Op)}, nil
	}
	h, ok := handlers[ac.e.Op]
	if !ok {
		if ac.e.IgnoreUnknown {
			return Result{}, nil
		}
		return Result{}, &HaltError{Op: ac.e.Op, Unknown: true}
	}
	scope, err := entryScope(ac)
	if err != nil {
		if ae, ok := err.(*api.Error); ok {
			return Result{Error: ae}, nil
		}
		return Result{}, err
	}
	ac.scope = scope
	if ac.e.CountPlacements {
		ac.tally = &placementTally{}
	}
	v, err := h(ac)
	if err != nil {
		if ae, ok := err.(*api.Error); ok {
			// The handler wrote nothing; what its placement decided
			// still counts.
			if err := ac.tally.write(ac.tx, false); err != nil {
				return Result{}, err
			}
			return Result{Error: ae}, nil
		}
		return Result{}, err
	}
	if err := ac.tally.write(ac.tx, true); err != nil {
		return Result{}, err
	}
	raw, err := encodeRecord(v)
	if err != nil {
		return Result{}, fmt.Errorf("encode the result: %w", err)
	}
	res := Result{Value: raw}
	if ac.e.CommandID != "" {
		if err := putCommand(ac, commandRecord{Op: ac.e.Op, InputHash: hash, AppliedAt: ac.e.IssuedAt, Result: res}); err != nil {
			return Result{}, fmt.Errorf("record command %s: %w", ac.e.CommandID, err)
		}
	}
	return res, nil
}

// inputHash identifies the inputs of a command: op, expected version and
// arguments (the actor and the time are not inputs).
func inputHash(e *Entry) string {
	h := sha256.New()
	h.Write([]byte(e.Op))
	h.Write([]byte{0})
	if e.ExpectedVersion != nil {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], *e.ExpectedVersion)
		h.Write([]byte{1})
		h.Write(b[:])
	}
	h.Write([]byte{0})
	h.Write(compactJSON(e.Args))
	return hex.EncodeToString(h.Sum(nil))
}

func compactJSON(b []byte) []byte {
	// Compact only drops whitespace, so JSON without any (what the
	// leader's encoder writes) is its own compact form, and invalid JSON
	// is returned as it is either way.
	if bytes.IndexAny(b, " \t\r\n") < 0 {
		return b
	}
	var buf bytes.Buffer
	// The standard library's: the hash is stored in command records and
	// compared by every later build, so its bytes must never change.
	if err := stdjson.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// View runs fn in a read transaction.
func (f *FSM) View(fn func(tx *bolt.Tx) error) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.db.View(fn)
}

// Snapshot writes a consistent copy of the state file to w.
func (f *FSM) Snapshot(w io.Writer) error {
	return f.View(func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(w)
		return err
	})
}

// Restore replaces the state with a snapshot written by Snapshot. A snapshot
// of a newer schema than this binary reads is refused and the old state kept.
func (f *FSM) Restore(r io.Reader) error {
	tmp := f.path + ".restore.tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("restore state: %w", err)
	}
	_, err = io.Copy(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("restore state: %w", err)
	}
	if err := checkSchemaFile(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cache.invalidate()
	f.commands.invalidate()
	if err := f.db.Close(); err != nil {
		return fmt.Errorf("restore state: close %s: %w", f.path, err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		os.Remove(tmp)
		// Keep serving the old state rather than a closed file.
		if db, rerr := openDB(f.path); rerr == nil {
			f.db = db
		}
		return fmt.Errorf("restore state: %w", err)
	}
	db, err := openDB(f.path)
	if err != nil {
		return err
	}
	f.db = db
	// A snapshot of an older release lacks the buckets added since.
	err = db.Update(func(tx *bolt.Tx) error {
		hadPoolUse := tx.Bucket(bucketPoolUse) != nil
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if !hadPoolUse {
			// Its layers were placed before pools were counted.
			if err := recountPoolUse(tx); err != nil {
				return err
			}
		}
		if err := checkCommandTimes(tx); err != nil {
			return err
		}
		if err := checkWorkspaceCommands(tx); err != nil {
			return err
		}
		if err := checkWorkspaceEnds(tx); err != nil {
			return err
		}
		return f.commands.rebuild(tx)
	})
	if err != nil {
		f.commands.invalidate() // built from a transaction that did not commit
	}
	return err
}

func checkSchemaFile(path string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("snapshot %s is not a state file: %w", path, err)
	}
	defer db.Close()
	return db.View(func(tx *bolt.Tx) error { return CheckSchema(tx) })
}

// CheckSchema refuses a state written by a newer kibotos.
func CheckSchema(tx *bolt.Tx) error {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return nil
	}
	v := b.Get(keySchemaVersion)
	if v == nil {
		return nil
	}
	if len(v) != 8 {
		return fmt.Errorf("cluster state has a corrupt schema version record (%d bytes)", len(v))
	}
	n := binary.BigEndian.Uint64(v)
	if n > SchemaVersion {
		return fmt.Errorf("cluster state has schema version %d but this kibotos reads up to %d; run a kibotos release at least as new as the one that wrote it", n, SchemaVersion)
	}
	return nil
}

// Dump returns every bucket's keys and values in order: two replicas with
// the same history have byte-identical dumps.
func (f *FSM) Dump() ([]byte, error) {
	var buf bytes.Buffer
	err := f.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			fmt.Fprintf(&buf, "[%s]\n", name)
			return b.ForEach(func(k, v []byte) error {
				fmt.Fprintf(&buf, "%q=%q\n", k, v)
				return nil
			})
		})
	})
	return buf.Bytes(), err
}

// DumpDecisions is Dump without the FSM clock, which every entry moves
// (accepted or not), and without the placement counts, which a rejected
// create or start moves too (what its placement refused counts): two
// dumps that differ here differ in what was decided.
func (f *FSM) DumpDecisions() ([]byte, error) {
	d, err := f.Dump()
	return []byte(withoutSection(withoutClock(string(d)), bucketPlacements)), err
}

// withoutSection drops one bucket's lines from a dump.
func withoutSection(dump string, bucket []byte) string {
	var out strings.Builder
	skip := false
	for _, line := range strings.SplitAfter(dump, "\n") {
		if strings.HasPrefix(line, "[") {
			skip = line == "["+string(bucket)+"]\n"
		}
		if !skip {
			out.WriteString(line)
		}
	}
	return out.String()
}

func withoutClock(dump string) string {
	var out strings.Builder
	section := ""
	skip := []string{fmt.Sprintf("%q=", keyClock)}
	for _, mark := range derivedMarks {
		skip = append(skip, fmt.Sprintf("%q=", mark))
	}
	for _, line := range strings.SplitAfter(dump, "\n") {
		if strings.HasPrefix(line, "[") {
			section = line
		}
		if section == "["+string(bucketMeta)+"]\n" && slices.ContainsFunc(skip, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		out.WriteString(line)
	}
	return out.String()
}

// BeginSnapshot opens a read transaction that pins the current state; write
// streams it out later (Raft persists snapshots concurrently with Apply) and
// release must be called once.
func (f *FSM) BeginSnapshot() (write func(io.Writer) error, release func(), err error) {
	f.mu.RLock()
	tx, err := f.db.Begin(false)
	if err != nil {
		f.mu.RUnlock()
		return nil, nil, err
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			tx.Rollback()
			f.mu.RUnlock()
		})
	}
	write = func(w io.Writer) error {
		_, err := tx.WriteTo(w)
		return err
	}
	return write, release, nil
}
