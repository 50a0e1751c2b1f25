package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// A member whose Raft log is raft-boltdb's (every build before the WAL)
// starts with the same log, term and vote in the WAL, and raft.db gone;
// the next start opens the WAL as it is.
func TestLogStoreMigratesBoltLog(t *testing.T) {
	dir := t.TempDir()
	bolt := filepath.Join(dir, boltLogName)
	old, err := raftboltdb.New(raftboltdb.Options{Path: bolt})
	if err != nil {
		t.Fatal(err)
	}
	// A log whose head was truncated by a snapshot, as a member's is.
	var logs []*raft.Log
	for i := uint64(101); i <= 400; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 3 + i/200, Type: raft.LogCommand, Data: []byte(fmt.Sprintf(`{"op":"op-%d"}`, i))})
	}
	if err := old.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]uint64{"CurrentTerm": 5, "LastVoteTerm": 5} {
		if err := old.SetUint64([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	// A member that never voted, and one whose log is still empty (it
	// joined and stopped before the leader sent anything), move too.
	for _, keys := range [][]string{{"CurrentTerm"}, nil} {
		d := t.TempDir()
		b, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(d, boltLogName)})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := b.SetUint64([]byte(k), 2); err != nil {
				t.Fatal(err)
			}
		}
		b.Close()
		s, err := openLogStore(t.Context(), d, slog.New(slog.DiscardHandler), hclog.NewNullLogger())
		if err != nil {
			t.Fatalf("stable keys %v, empty log: %v", keys, err)
		}
		term, _ := s.GetUint64([]byte("CurrentTerm"))
		vote, _ := s.GetUint64([]byte("LastVoteTerm"))
		if last, _ := s.LastIndex(); last != 0 || term != uint64(2*len(keys)) || vote != 0 {
			t.Fatalf("stable keys %v: last index %d, term %d, vote term %d", keys, last, term, vote)
		}
		s.Close()
	}

	quiet, hq := slog.New(slog.DiscardHandler), hclog.NewNullLogger()
	wantLast := uint64(400)
	for start := 1; start <= 2; start++ {
		s, err := openLogStore(t.Context(), dir, quiet, hq)
		if err != nil {
			t.Fatalf("start %d: %v", start, err)
		}
		if _, err := os.Stat(bolt); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("start %d: raft.db still there: %v", start, err)
		}
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if first != 101 || last != wantLast {
			t.Fatalf("start %d: log holds %d..%d, want 101..%d", start, first, last, wantLast)
		}
		for _, want := range []*raft.Log{logs[0], logs[150], logs[299]} {
			var got raft.Log
			if err := s.GetLog(want.Index, &got); err != nil || got.Term != want.Term || !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("start %d: entry %d is %+v (%v), want %+v", start, want.Index, got, err, want)
			}
		}
		term, _ := s.GetUint64([]byte("CurrentTerm"))
		cand, _ := s.Get([]byte("LastVoteCand"))
		if term != 5 || string(cand) != "node-2" {
			t.Fatalf("start %d: term %d, vote %q", start, term, cand)
		}
		// The log goes on where it was.
		if err := s.StoreLogs([]*raft.Log{{Index: last + 1, Term: 5, Type: raft.LogCommand, Data: []byte("x")}}); err != nil {
			t.Fatalf("start %d: append: %v", start, err)
		}
		wantLast++
		s.Close()
	}
	if _, err := os.Stat(filepath.Join(dir, walDirName+".migrating")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the migration's temporary WAL is left: %v", err)
	}
}

// A migration that renamed the WAL into place and then crashed leaves
// raft.db beside it: the WAL is the log, and the old file goes.
func TestLogStoreRemovesMigratedBoltLog(t *testing.T) {
	dir := t.TempDir()
	quiet, hq := slog.New(slog.DiscardHandler), hclog.NewNullLogger()
	s, err := openLogStore(t.Context(), dir, quiet, hq)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("wal")}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	old, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, boltLogName)})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.StoreLogs([]*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("bolt")}, {Index: 2, Term: 1, Type: raft.LogCommand}}); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s, err = openLogStore(t.Context(), dir, quiet, hq)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var l raft.Log
	if last, _ := s.LastIndex(); last != 1 || s.GetLog(1, &l) != nil || string(l.Data) != "wal" {
		t.Fatalf("the log is not the WAL: last %d, entry %+v", last, l)
	}
	if _, err := os.Stat(filepath.Join(dir, boltLogName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("raft.db left beside the WAL: %v", err)
	}
}

// Raft clears a log suffix a new leader did not keep (its own uncommitted
// tail, after a leader change); the log must open again after it. raft-wal
// before v0.4.1 sealed the segment without its index on such a tail
// truncation, and the member's next start panicked ("sealed segment has
// no index block"): found by the fault harness (nemesis), a member killed
// after a leader change never came back.
func TestLogStoreReopensAfterTailTruncation(t *testing.T) {
	dir := t.TempDir()
	open := func() logStore {
		t.Helper()
		s, err := openLogStore(t.Context(), dir, slog.New(slog.DiscardHandler), hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open()
	var logs []*raft.Log
	for i := uint64(1); i <= 40; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: []byte(fmt.Sprintf(`{"op":"op-%d"}`, i))})
	}
	if err := s.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRange(38, 40); err != nil {
		t.Fatal(err)
	}
	// The new leader's entries from 38 on.
	if err := s.StoreLog(&raft.Log{Index: 38, Term: 3, Type: raft.LogCommand, Data: []byte(`{"op":"new-38"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open()
	defer s.Close()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	var got raft.Log
	if err := s.GetLog(1, &got); err != nil || first != 1 || last != 38 {
		t.Fatalf("after a tail truncation and a restart: first %d, last %d, entry 1: %v; want 1, 38, readable", first, last, err)
	}
	if err := s.GetLog(38, &got); err != nil || got.Term != 3 {
		t.Fatalf("entry 38 after the restart: term %d, %v; want the new leader's (term 3)", got.Term, err)
	}
}
