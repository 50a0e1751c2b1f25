package cluster

import (
	"encoding/json"
	"io"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/kibotos/kibotos/api"
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
	// admission, when set, learns which nodes' admission a batch may have
	// changed (all after a restore): open connections of revoked nodes end.
	admission func(nodes []string, all bool)
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
	entries := make([]fsm.Entry, 0, len(logs))
	index := make([]int, 0, len(logs))
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		var e fsm.Entry
		if err := json.Unmarshal(l.Data, &e); err != nil {
			out[i] = fsm.Result{Error: api.Errorf(api.CodeInternal, "log entry %d is not a kibotos command: %v", l.Index, err)}
			continue
		}
		entries = append(entries, e)
		index = append(index, i)
	}
	for j, res := range r.f.Apply(entries) {
		out[index[j]] = res
	}
	r.changed.notify()
	if nodes := admissionChanges(entries); len(nodes) > 0 && r.admission != nil {
		r.admission(nodes, false)
	}
	return out
}

func (r *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	write, release, err := r.f.BeginSnapshot()
	if err != nil {
		return nil, err
	}
	return &raftSnapshot{write: write, release: release}, nil
}

func (r *raftFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
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
