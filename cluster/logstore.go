package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/migrate"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"

	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/storagepool"
)

// logStore is a member's Raft log and stable store (term and vote).
type logStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// Where a member's Raft log lives, under its Raft directory.
const (
	walDirName  = "wal"     // raft-wal segments and meta (this build)
	boltLogName = "raft.db" // raft-boltdb (builds before it)
)

// walSegmentBytes is the size of one log segment file. A member keeps
// about TrailingLogs entries after a snapshot, a few MiB; segments are
// preallocated, so a smaller one costs less disk on small members.
const walSegmentBytes = 16 << 20

// openLogStore opens the member's Raft log: a write-ahead log (raft-wal),
// whose append is one write and one fsync, where raft-boltdb's commit
// costs two fdatasyncs (data pages, then meta page). hashicorp/raft
// stores the leader's batch before it replicates and the follower stores
// it before it answers, so those syncs are in series on every write.
// The durability is the same: an append returns once the entries are on
// disk.
//
// A member whose log is still raft-boltdb's is migrated once, before Raft
// starts: every entry and the term and vote are copied into a new WAL
// beside it, which becomes the log by a rename; raft.db is removed only
// after. A crash at any point leaves either the old log whole or the new
// one renamed into place.
func openLogStore(ctx context.Context, raftDir string, log *slog.Logger, hl hclog.Logger) (logStore, error) {
	dir := filepath.Join(raftDir, walDirName)
	bolt := filepath.Join(raftDir, boltLogName)
	if _, err := os.Stat(dir); err == nil {
		// A migration that renamed the WAL into place but crashed before
		// removing the old file.
		if err := os.Remove(bolt); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("raft log: remove the migrated raft-boltdb log %s: %w", bolt, err)
		}
		return openWAL(dir, hl)
	}
	if _, err := os.Stat(bolt); err == nil {
		if err := migrateBoltLog(ctx, bolt, dir, log, hl); err != nil {
			return nil, err
		}
		return openWAL(dir, hl)
	}
	return openWAL(dir, hl)
}

func openWAL(dir string, hl hclog.Logger) (logStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raft log directory %s: %w", dir, err)
	}
	meta := &metadb.BoltMetaDB{}
	filer := segment.NewFiler(dir, privateSegments{fs.New()})
	w, err := wal.Open(dir, wal.WithSegmentSize(walSegmentBytes), wal.WithMetaStore(meta), wal.WithSegmentFiler(filer), wal.WithLogger(hl))
	if err != nil {
		meta.Close()
		return nil, fmt.Errorf("raft log %s: %w", dir, err)
	}
	// The meta store (opened 0644 by raft-wal), and segments an earlier
	// release left 0644.
	if err := datadir.MakePrivate(dir); err != nil {
		w.Close() // and its meta store
		return nil, fmt.Errorf("raft log %s: %w", dir, err)
	}
	return w, nil
}

// privateSegments creates the WAL's segment files 0600: raft-wal makes
// them 0644.
type privateSegments struct{ *fs.FS }

func (p privateSegments) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := p.FS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(dir, name), datadir.PrivateFileMode); err != nil {
		f.Close()
		return nil, fmt.Errorf("raft log segment %s: %w", name, err)
	}
	return f, nil
}

// migrateBoltLog copies the raft-boltdb log at bolt into a WAL at dir.
func migrateBoltLog(ctx context.Context, bolt, dir string, log *slog.Logger, hl hclog.Logger) error {
	start := time.Now()
	tmp := dir + ".migrating"
	if err := os.RemoveAll(tmp); err != nil { // an earlier attempt's
		return fmt.Errorf("raft log migration: remove %s: %w", tmp, err)
	}
	src, err := raftboltdb.New(raftboltdb.Options{Path: bolt})
	if err != nil {
		return fmt.Errorf("raft log migration: open %s: %w", bolt, err)
	}
	dst, err := openWAL(tmp, hl)
	if err != nil {
		src.Close()
		return fmt.Errorf("raft log migration: %w", err)
	}
	err = copyStable(dst, src)
	first, _ := src.FirstIndex()
	last, _ := src.LastIndex()
	if err == nil && last > 0 { // an empty log has no entry 0 to copy
		err = migrate.CopyLogs(ctx, dst, src, 1<<20, nil)
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	src.Close()
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("raft log migration from %s: %w; the old log is untouched: fix the cause and start again", bolt, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("raft log migration: %w", err)
	}
	if err := storagepool.SyncDir(filepath.Dir(dir)); err != nil {
		return fmt.Errorf("raft log migration: %w", err)
	}
	if err := os.Remove(bolt); err != nil {
		return fmt.Errorf("raft log migration: remove %s: %w", bolt, err)
	}
	log.Info("raft log moved from raft-boltdb to the write-ahead log", "first_index", first, "last_index", last, "seconds", time.Since(start).Seconds())
	return nil
}

// copyStable copies what hashicorp/raft keeps in its stable store: the
// current term, and the term and candidate of the last vote, which a
// member that never voted does not have (raft-wal's migrate.CopyStable
// fails on those).
func copyStable(dst, src raft.StableStore) error {
	for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
		v, err := src.GetUint64([]byte(k))
		if errors.Is(err, raftboltdb.ErrKeyNotFound) {
			continue
		}
		if err == nil {
			err = dst.SetUint64([]byte(k), v)
		}
		if err != nil {
			return fmt.Errorf("stable key %s: %w", k, err)
		}
	}
	v, err := src.Get([]byte("LastVoteCand"))
	if errors.Is(err, raftboltdb.ErrKeyNotFound) {
		return nil
	}
	if err == nil {
		err = dst.Set([]byte("LastVoteCand"), v)
	}
	if err != nil {
		return fmt.Errorf("stable key LastVoteCand: %w", err)
	}
	return nil
}

// privateSnapshots is raft's file snapshot store with its files 0600 in
// 0700 directories: raft makes them 0644 in 0755.
type privateSnapshots struct {
	*raft.FileSnapshotStore
	dir string // raft/snapshots
}

func openSnapshots(raftDir string, hl hclog.Logger) (raft.SnapshotStore, error) {
	store, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 2, hl)
	if err != nil {
		return nil, err
	}
	p := privateSnapshots{FileSnapshotStore: store, dir: filepath.Join(raftDir, "snapshots")}
	if err := datadir.MakePrivate(p.dir); err != nil {
		return nil, fmt.Errorf("raft snapshots: %w", err)
	}
	return p, nil
}

func (p privateSnapshots) Create(version raft.SnapshotVersion, index, term uint64, c raft.Configuration, ci uint64, t raft.Transport) (raft.SnapshotSink, error) {
	sink, err := p.FileSnapshotStore.Create(version, index, term, c, ci, t)
	if err != nil {
		return nil, err
	}
	return privateSink{SnapshotSink: sink, dir: p.dir}, nil
}

type privateSink struct {
	raft.SnapshotSink
	dir string
}

// Close completes the snapshot, then takes the wider modes away from it.
func (s privateSink) Close() error {
	if err := s.SnapshotSink.Close(); err != nil {
		return err
	}
	return datadir.MakePrivate(s.dir)
}
