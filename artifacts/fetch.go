package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
)

// PartialSuffix ends the file a fetch writes into; LockSuffix the file it
// holds a lock on while it does.
const (
	PartialSuffix = ".partial"
	LockSuffix    = ".lock"
)

// progressStep is how often (in bytes) Fetch reports progress.
const progressStep = 16 << 20

// Fetch copies object want from s to the local file dst. An interrupted
// fetch leaves dst.partial behind and the next continues it from where it
// stopped; the whole file is verified before it is renamed to dst, and a
// partial file that does not verify (a byte flipped on the local disk, a
// torn write) is fetched again from the start once. progress, if set, is
// told the bytes done of the total as they grow. Concurrent fetches of
// the same dst wait for one another; one that finds dst there is done.
// Nothing but dst is left behind by a fetch that completed.
func Fetch(ctx context.Context, s Store, want Object, dst string, progress func(done, total int64)) error {
	return fetch(ctx, source{
		ref:   digestRef(s, want.Digest),
		store: s,
		size: func(ctx context.Context) (int64, error) {
			o, err := s.Stat(ctx, want.Digest)
			return o.Size, err
		},
		open: func(ctx context.Context, offset int64) (io.ReadCloser, error) {
			return s.OpenAt(ctx, want.Digest, offset)
		},
	}, want, dst, progress)
}

// FetchNamed is Fetch of the object stored under key, which its writer
// recorded as want: what is fetched is verified against want, as Fetch
// verifies an object against its digest.
func FetchNamed(ctx context.Context, s Store, key string, want Object, dst string, progress func(done, total int64)) error {
	if err := checkKey(s, key); err != nil {
		return err
	}
	return fetch(ctx, source{
		ref:   keyRef(s, key),
		store: s,
		size:  func(ctx context.Context) (int64, error) { return s.StatNamed(ctx, key) },
		open:  func(ctx context.Context, offset int64) (io.ReadCloser, error) { return s.OpenNamed(ctx, key, offset) },
	}, want, dst, progress)
}

// source is what a fetch reads: an object by its digest or by its key.
type source struct {
	ref
	store Store
	size  func(ctx context.Context) (int64, error)
	open  func(ctx context.Context, offset int64) (io.ReadCloser, error)
}

func fetch(ctx context.Context, src source, want Object, dst string, progress func(done, total int64)) error {
	if _, err := ParseDigest(string(want.Digest)); err != nil {
		return err
	}
	if want.Size < 0 || want.Size > MaxObjectBytes {
		return api.Errorf(api.CodeInvalidArgument, "%s: size %d is out of range", src.name, want.Size)
	}
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	unlock, err := lockFile(dst + LockSuffix)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(dst); err == nil {
		return nil // a concurrent fetch completed it
	}
	size, err := src.size(ctx)
	if err != nil {
		return err
	}
	if size != want.Size {
		return fmt.Errorf("%s is %d bytes, %d expected (truncated or overwritten): %w; %s", src.name, size, want.Size, ErrCorrupt, src.damaged)
	}
	partial := dst + PartialSuffix
	for attempt := 0; ; attempt++ {
		err := fetchOnce(ctx, src, want, partial, progress)
		if err == nil {
			if err := storagepool.Commit(partial, dst); err != nil {
				return err
			}
			// Whoever waits on it finds dst and is done; later fetches
			// find dst before they lock.
			os.Remove(dst + LockSuffix)
			return nil
		}
		if !errors.Is(err, ErrCorrupt) {
			return err // the partial file stays for the next fetch to continue
		}
		os.Remove(partial)
		if attempt == 1 {
			return fmt.Errorf("%w; fetched twice from the start: the object in the store is damaged, %s", err, src.damaged)
		}
	}
}

// fetchOnce continues partial from its length and verifies all of it.
func fetchOnce(ctx context.Context, src source, want Object, partial string, progress func(done, total int64)) (err error) {
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", src.id, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	h := sha256.New()
	have, err := io.Copy(h, f) // what an earlier fetch left, hashed again
	if err != nil {
		return fmt.Errorf("fetch %s: read %s: %w", src.id, partial, err)
	}
	if have > want.Size {
		if err := f.Truncate(0); err != nil {
			return err
		}
		h.Reset()
		if have, err = f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	if have < want.Size {
		rc, err := src.open(ctx, have)
		if err != nil {
			return err
		}
		defer rc.Close()
		hw := &holeWriter{f: f, off: have}
		w := &progressWriter{w: io.MultiWriter(hw, h), done: have, total: want.Size, report: progress}
		n, err := io.Copy(w, io.LimitReader(rc, want.Size-have+1))
		have += n
		if ferr := hw.finish(); err == nil {
			err = ferr // what was received, holes included, is kept for the next fetch
		}
		if err != nil {
			return fmt.Errorf("fetch %s from %s: %w (kept %d of %d bytes; the next fetch continues)", src.id, src.store, err, have, want.Size)
		}
	}
	if err := check(src.name+" fetched to "+partial, want, have, h); err != nil {
		return err
	}
	if progress != nil {
		progress(have, want.Size)
	}
	return f.Sync()
}

type progressWriter struct {
	w           io.Writer
	done, total int64
	last        int64
	report      func(done, total int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.done += int64(n)
	if p.report != nil && p.done-p.last >= progressStep {
		p.last = p.done
		p.report(p.done, p.total)
	}
	return n, err
}

// lockFile takes an exclusive lock on path (created if need be).
func lockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
