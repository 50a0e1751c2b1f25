package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/ctxio"
)

// Checksums of snapshot state files, taken off the critical path: a
// pause hashes the stream while QEMU writes it, a restore while QEMU
// loads it. Each used to be a second pass over a file of hundreds of MiB
// after (pause) or before (restore) QEMU's own, about 0.15-0.2 s of a
// pause or resume on these machines.

// fileDigest is the size and sha256 of a file.
func fileDigest(ctx context.Context, path string) (uint64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
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
	d := &digestFollower{writerDone: make(chan struct{}), cancel: cancel, result: make(chan digestResult, 1)}
	go func() {
		defer f.Close()
		size, sum, err := d.follow(ctx, f)
		d.result <- digestResult{size, sum, err}
	}()
	return d, nil
}

func (d *digestFollower) follow(ctx context.Context, f *os.File) (uint64, string, error) {
	h := sha256.New()
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
// sha256 of the whole file.
func (d *digestFollower) finish() (uint64, string, error) {
	close(d.writerDone)
	r := <-d.result
	d.cancel()
	return r.size, r.sum, r.err
}

// stop abandons the digest.
func (d *digestFollower) stop() { d.cancel() }

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
}

func checkStateAsync(ctx context.Context, dir string, m SnapshotMeta) *stateCheck {
	ctx, cancel := context.WithCancel(ctx)
	c := &stateCheck{cancel: cancel, result: make(chan error, 1)}
	go func() { c.result <- checkState(ctx, dir, m) }()
	return c
}

// wait is the check's outcome; stop abandons it.
func (c *stateCheck) wait() error {
	err := <-c.result
	c.cancel()
	return err
}

func (c *stateCheck) stop() { c.cancel() }

// checkState compares the state file with what snapshot.json says of it.
func checkState(ctx context.Context, dir string, m SnapshotMeta) error {
	size, sum, err := fileDigest(ctx, filepath.Join(dir, SnapshotStateFile))
	switch {
	case ctx.Err() != nil:
		// Abandoned (the start was), not unusable: the snapshot is kept.
		return fmt.Errorf("check the state file in %s: %w", dir, ctx.Err())
	case err != nil:
		return fmt.Errorf("%w: %s: %v", ErrSnapshotUnusable, dir, err)
	case size != m.StateBytes || sum != m.StateSHA256:
		return fmt.Errorf("%w: %s: the state file is %d bytes with sha256 %s, the snapshot says %d bytes with %s: torn or changed", ErrSnapshotUnusable, dir, size, sum, m.StateBytes, m.StateSHA256)
	}
	return nil
}
