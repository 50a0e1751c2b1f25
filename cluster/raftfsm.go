package cluster

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/fsm"
)

// raftFSM adapts fsm.FSM to hashicorp/raft. It implements BatchingFSM so a
// batch of committed entries is applied in one bbolt transaction.
type raftFSM struct {
	f *fsm.FSM
	// restoreErr keeps why a snapshot could not be restored (e.g. a state
	// written by a newer kibotos), so start-up can say it instead of
	// Raft's generic "failed to load any existing snapshots".
	restoreErr error
	// changed, when set, learns of every applied batch and restore
	// (blocking reads wait on it).
	changed *broadcaster
	// applied is the index of the last entry applied (0 until one is, and
	// not moved by a restore: Raft's AppliedIndex covers that).
	applied atomic.Uint64
	// admission, when set, learns which nodes' admission a batch may have
	// changed (all after a restore): open connections of revoked nodes end.
	admission func(nodes []string, all bool)

	// halt is told, once, why this member must stop applying the log (an
	// fsm.HaltError: an operation this release does not know, or an
	// internal failure). Raft has no way to refuse a committed entry, so
	// the apply goroutine blocks in that batch until stopped is closed
	// (the member shutting down, which halt starts). From then on nothing
	// reaches the FSM: that batch and every later one is answered with
	// the halt error (no fsm.Result: nothing was decided), snapshots and
	// restores are refused, so no snapshot can claim those entries, and
	// Raft's waiters (barriers, config changes) are released so the
	// shutdown completes. Without halt, ApplyBatch panics instead.
	halt     func(error)
	stopped  <-chan struct{}
	halted   atomic.Bool
	haltedBy error
}

// broadcaster wakes everyone waiting for the state to change.
type broadcaster struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcaster() *broadcaster { return &broadcaster{ch: make(chan struct{})} }

// next is closed at the next change after the call.
func (b *broadcaster) next() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcaster) notify() {
	if b == nil {
		return
	}
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}

var _ raft.BatchingFSM = (*raftFSM)(nil)

func (r *raftFSM) Apply(l *raft.Log) interface{} { return r.ApplyBatch([]*raft.Log{l})[0] }

func (r *raftFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	out := make([]interface{}, len(logs))
	if r.halted.Load() {
		return r.refuse(out)
	}
	entries := make([]fsm.Entry, 0, len(logs))
	index := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		e, err := fsm.DecodeEntry(l.Data)
		if err != nil {
			out[i] = fsm.Result{Error: api.Errorf(api.CodeInternal, "log entry %d is not a kibotos command: %v", l.Index, err)}
			continue
		}
		entries = append(entries, e)
		index = append(index, i)
	}
	results, err := r.f.ApplyBatch(entries)
	if err != nil {
		r.stop(haltError(logs, index, err))
		return r.refuse(out)
	}
	for j, res := range results {
		out[index[j]] = res
	}
	if len(logs) > 0 {
		r.applied.Store(logs[len(logs)-1].Index)
	}
	r.changed.notify()
	if nodes := admissionChanges(entries); len(nodes) > 0 && r.admission != nil {
		r.admission(nodes, false)
	}
	return out
}

// stop halts the member and returns once it is shutting down.
func (r *raftFSM) stop(err error) {
	if r.halt == nil {
		panic(err)
	}
	r.haltedBy = err
	r.halted.Store(true)
	r.halt(err)
	<-r.stopped
}

// refuse answers every entry of a batch after the halt with its error.
func (r *raftFSM) refuse(out []interface{}) []interface{} {
	for i := range out {
		out[i] = r.haltedBy
	}
	return out
}

// haltError says which log entry stopped the member and what fixes it:
// an *api.Error, failed_precondition when a newer release is needed.
func haltError(logs []*raft.Log, index []int, err error) error {
	var h *fsm.HaltError
	if !errors.As(err, &h) {
		h = &fsm.HaltError{Pos: -1, Err: err}
	}
	if h.Pos < 0 || h.Pos >= len(index) {
		return api.Errorf(api.CodeInternal,
			"log entries %d to %d could not be committed to the state file: %v; this member stopped applying the log so its state cannot drift from the other members: fix the cause and restart it (it replays the log from its last snapshot)",
			logs[0].Index, logs[len(logs)-1].Index, h.Err)
	}
	idx := logs[index[h.Pos]].Index
	if h.Unknown {
		return api.Errorf(api.CodeFailedPrecondition,
			"log entry %d has operation %q, which this kibotos (release %s) does not know; upgrade this member to the release of the leader",
			idx, h.Op, buildinfo.ReleaseName())
	}
	return api.Errorf(api.CodeInternal,
		"log entry %d (operation %q) could not be applied: %v; this member stopped applying the log so its state cannot drift from the other members: fix the cause and restart it (it replays the log from its last snapshot)",
		idx, h.Op, h.Err)
}

// errHalted refuses snapshots once the member halted: a snapshot must
// never claim the entry it could not apply.
var errHalted = errors.New("this member stopped applying the log; no snapshot is taken")

func (r *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	if r.halted.Load() {
		return nil, errHalted
	}
	write, release, err := r.f.BeginSnapshot()
	if err != nil {
		return nil, err
	}
	return &raftSnapshot{write: write, release: release}, nil
}

func (r *raftFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if r.halted.Load() {
		return errHalted
	}
	err := r.f.Restore(rc)
	if err != nil {
		r.restoreErr = err
	}
	r.changed.notify()
	if r.admission != nil {
		r.admission(nil, true)
	}
	return err
}

type raftSnapshot struct {
	write   func(io.Writer) error
	release func()
}

func (s *raftSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.write(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *raftSnapshot) Release() { s.release() }
