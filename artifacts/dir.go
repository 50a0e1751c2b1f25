package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
)

// Dir is the directory backend: objects/sha256/<hex> under its root, each
// written to a temporary file beside it (named after the writing node) and
// renamed into place, so a reader on any host sees a whole object or none.
type Dir struct {
	root string
	node string
}

// NewDir is the store in directory root (absolute); node names the
// writer's temporary files.
func NewDir(root, node string) (*Dir, error) {
	if !filepath.IsAbs(root) || filepath.Clean(root) != root {
		return nil, api.Errorf(api.CodeInvalidArgument, "artifact store directory %q is not an absolute, clean path", root)
	}
	if _, err := (storagepool.Temp{Node: node, Purpose: "put"}).Name(); err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "artifact store %s: %v", root, err)
	}
	return &Dir{root: root, node: node}, nil
}

func (s *Dir) String() string { return "file://" + s.root }

func (s *Dir) objects() string { return filepath.Join(s.root, "objects", "sha256") }

// path of a checked digest only.
func (s *Dir) path(d Digest) (string, error) {
	if _, err := ParseDigest(string(d)); err != nil {
		return "", err
	}
	return filepath.Join(s.objects(), d.Hex()), nil
}

func (s *Dir) Put(ctx context.Context, r io.Reader, want Digest) (Object, error) {
	if want != "" {
		if _, err := ParseDigest(string(want)); err != nil {
			return Object{}, err
		}
	}
	if err := os.MkdirAll(s.objects(), 0o750); err != nil {
		return Object{}, s.unavailable("create "+s.objects(), err)
	}
	tmp, err := storagepool.TempPath(s.objects(), storagepool.Temp{Node: s.node, Purpose: "put"})
	if err != nil {
		return Object{}, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return Object{}, s.unavailable("write "+tmp, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, MaxObjectBytes+1))
	if err == nil && n > MaxObjectBytes {
		err = api.Errorf(api.CodeInvalidArgument, "object for %s is larger than %d bytes", s, int64(MaxObjectBytes))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	o := Object{Digest: digestOf(h), Size: n}
	if err == nil && want != "" && o.Digest != want {
		err = fmt.Errorf("%s: what was written hashes to %s: %w; nothing was stored", objectName(s, want), o.Digest.Short(), ErrCorrupt)
	}
	if err != nil {
		os.Remove(tmp)
		return Object{}, err
	}
	// Renaming over an existing object is harmless (same content) and
	// repairs one that was damaged in place.
	final, _ := s.path(o.Digest)
	if err := storagepool.Commit(tmp, final); err != nil {
		return Object{}, s.unavailable("store "+string(o.Digest), err)
	}
	return o, nil
}

func (s *Dir) Stat(ctx context.Context, d Digest) (Object, error) {
	p, err := s.path(d)
	if err != nil {
		return Object{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Object{}, s.openErr(d, err)
	}
	if !fi.Mode().IsRegular() {
		return Object{}, api.Errorf(api.CodeFailedPrecondition, "%s is not a regular file: remove %s and publish it again", objectName(s, d), p)
	}
	return Object{Digest: d, Size: fi.Size()}, nil
}

func (s *Dir) OpenAt(ctx context.Context, d Digest, offset int64) (io.ReadCloser, error) {
	p, err := s.path(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, s.openErr(d, err)
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, s.unavailable("read "+string(d), err)
	}
	return readCloser{ctxReader{ctx, f}, f}, nil
}

func (s *Dir) Delete(ctx context.Context, d Digest) error {
	p, err := s.path(d)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		if err := s.openErr(d, err); api.CodeOf(err) != api.CodeNotFound {
			return err
		}
	}
	return nil
}

func (s *Dir) openErr(d Digest, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		if _, rerr := os.Stat(s.root); rerr != nil {
			return s.unavailable("open", rerr)
		}
		return api.Errorf(api.CodeNotFound, "%s is not there: publish it again (kibo template publish)", objectName(s, d))
	}
	return s.unavailable("read "+string(d), err)
}

func (s *Dir) unavailable(what string, err error) error {
	return api.Errorf(api.CodeUnavailable, "artifact store %s: %s: %v; check that the directory is mounted and writable on this host", s, what, err)
}

// ctxReader stops a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type readCloser struct {
	io.Reader
	io.Closer
}
