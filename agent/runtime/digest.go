package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/ctxio"
)

// Checksums of snapshot state files, taken off the critical path: a
// pause hashes the stream while QEMU writes it, a restore while QEMU
// loads it. Each used to be a second pass over a file of hundreds of MiB
// after (pause) or before (restore) QEMU's own, about 0.15-0.2 s of a
// pause or resume on these machines.

// stateHash is the checksum of a snapshot's state file in snapshot
// format v. It detects a torn or damaged file, not a forged one: it sits
// beside the state, in the same pool, where whoever could change the one
// could change the other. Format 2's xxh3-128 checks at memory speed
// (7.0 GB/s on these machines, sha256 1.4 GB/s with SHA-NI): a resume's
// vCPUs wait for the check, which for a 232 MiB state took 0.21-0.24 s
// with sha256, longer than QEMU's load beside it. Format 1 used sha256.
func stateHash(format int) hash.Hash {
	if format == 1 {
		return sha256.New()
	}
	return xxh3.New128()
}

// stateSum is the state's checksum snapshot.json records, checked for
// its format's hash.
func (m SnapshotMeta) stateSum() (string, error) {
	field, sum := "state_xxh3", m.StateXXH3
	if m.FormatVersion == 1 {
		field, sum = "state_sha256", m.StateSHA256
	}
	if b, err := hex.DecodeString(sum); err != nil || len(b) != stateHash(m.FormatVersion).Size() {
		return "", fmt.Errorf("format %d wants %s, %d hex digits: got %q", m.FormatVersion, field, 2*stateHash(m.FormatVersion).Size(), sum)
	}
	return sum, nil
}

// fileDigest is the size and checksum of a file for snapshot format v.
func fileDigest(ctx context.Context, path string, format int) (uint64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := stateHash(format)
	n, err := io.Copy(h, ctxio.Reader(ctx, f))
	if err != nil {
		return 0, "", err
	}
	return uint64(n), hex.EncodeToString(h.Sum(nil)), nil
}

// digestFollower hashes a file another process appends to, chasing the
// writer, and starts the write-back of what it has read so that the
// fsync after the writer's last byte has little left to flush.
type digestFollower struct {
	writerDone chan struct{}
	cancel     context.CancelFunc
	result     chan digestResult
	done       chan struct{} // closed when the follower returned
}

type digestResult struct {
	size uint64
	sum  string
	err  error
}

// How far the follower reads at once, how much it hands to write-back at
// once, and how long it waits when it caught up with the writer.
const (
	followChunk     = 1 << 20
	followWriteback = 8 << 20
	followPoll      = 2 * time.Millisecond
)

// followDigest starts hashing path, which the caller's writer appends to
// from its start and never rewrites.
func followDigest(ctx context.Context, path string) (*digestFollower, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &digestFollower{writerDone: make(chan struct{}), cancel: cancel, result: make(chan digestResult, 1), done: make(chan struct{})}
	go func() {
		defer close(d.done)
		defer f.Close()
		size, sum, err := d.follow(ctx, f)
		d.result <- digestResult{size, sum, err}
	}()
	return d, nil
}

func (d *digestFollower) follow(ctx context.Context, f *os.File) (uint64, string, error) {
	h := stateHash(snapshotFormat)
	buf := make([]byte, followChunk)
	var off, flushed int64
	for {
		// Read after looking: a writer done before this read left
		// nothing beyond what it returns.
		done := isClosed(d.writerDone)
		n, err := f.ReadAt(buf, off)
		h.Write(buf[:n]) // a hash never fails
		off += int64(n)
		if off-flushed >= followWriteback {
			// A hint: the fsync at the end is what makes it durable.
			_ = unix.SyncFileRange(int(f.Fd()), flushed, off-flushed, unix.SYNC_FILE_RANGE_WRITE)
			flushed = off
		}
		switch {
		case err == nil && ctx.Err() != nil:
			// Abandoned while behind the writer: stop waits for this.
			return 0, "", ctx.Err()
		case err == nil:
			continue
		case !errors.Is(err, io.EOF):
			return 0, "", err
		case done:
			return uint64(off), hex.EncodeToString(h.Sum(nil)), nil
		}
		select {
		case <-ctx.Done():
			return 0, "", ctx.Err()
		case <-d.writerDone:
		case <-time.After(followPoll):
		}
	}
}

// finish is called once the writer wrote its last byte: the size and
// checksum (this build's format) of the whole file.
func (d *digestFollower) finish() (uint64, string, error) {
	close(d.writerDone)
	r := <-d.result
	d.cancel()
	return r.size, r.sum, r.err
}

// stop abandons the digest and waits for the follower to end (after
// finish, at once), so the state file is no longer read once it returns.
func (d *digestFollower) stop() {
	d.cancel()
	<-d.done
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stateCheck verifies a snapshot's state file against its snapshot.json
// while QEMU loads it; the guest's vCPUs start only once it passed.
type stateCheck struct {
	cancel context.CancelFunc
	result chan error
	done   chan struct{} // closed when the check returned
}

func checkStateAsync(ctx context.Context, dir string, m SnapshotMeta) *stateCheck {
	ctx, cancel := context.WithCancel(ctx)
	c := &stateCheck{cancel: cancel, result: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		c.result <- checkState(ctx, dir, m)
	}()
	return c
}

// wait is the check's outcome; stop abandons it and waits for it to end.
func (c *stateCheck) wait() error {
	err := <-c.result
	c.cancel()
	return err
}

func (c *stateCheck) stop() {
	c.cancel()
	<-c.done
}

// checkState compares the state file with what snapshot.json says of it.
func checkState(ctx context.Context, dir string, m SnapshotMeta) error {
	want, err := m.stateSum()
	if err != nil {
		return fmt.Errorf("%w: %s: %s: %v", ErrSnapshotUnusable, dir, SnapshotMetaFile, err)
	}
	size, sum, err := fileDigest(ctx, filepath.Join(dir, SnapshotStateFile), m.FormatVersion)
	switch {
	case ctx.Err() != nil:
		// Abandoned (the start was), not unusable: the snapshot is kept.
		return fmt.Errorf("check the state file in %s: %w", dir, ctx.Err())
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrSnapshotUnusable, dir, err)
	case size != m.StateBytes || sum != want:
		return fmt.Errorf("%w: %s: the state file is %d bytes with checksum %s, the snapshot says %d bytes with %s: torn or changed", ErrSnapshotUnusable, dir, size, sum, m.StateBytes, want)
	}
	return nil
}
