package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/ctxio"
	"github.com/kibotos/kibotos/storagepool"
)

// Dir is the directory backend: objects/sha256/<hex> and named/<key>
// under its root, each written to a temporary file beside it (named after
// the writing node) and renamed into place, so a reader on any host sees
// a whole object or none.
type Dir struct {
	root string
	node string
	// maxListed bounds a listing (defaultMaxListed; tests lower it).
	maxListed int
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
	return &Dir{root: root, node: node, maxListed: defaultMaxListed}, nil
}

func (s *Dir) String() string { return "file://" + s.root }

func (s *Dir) objects() string { return filepath.Join(s.root, "objects", "sha256") }

// object is where d lies (l.err if d is not a digest).
func (s *Dir) object(d Digest) loc {
	_, err := ParseDigest(string(d))
	return loc{filepath.Join(s.objects(), d.Hex()), digestRef(s, d), err}
}

func (s *Dir) named() string { return filepath.Join(s.root, "named") }

// namedObject is where key lies (l.err if it is not a key): named/ keeps
// a listing out of objects/.
func (s *Dir) namedObject(key string) loc {
	err := checkKey(s, key)
	return loc{filepath.Join(s.named(), filepath.FromSlash(key)), keyRef(s, key), err}
}

func (s *Dir) Put(ctx context.Context, r io.Reader, want Digest) (Object, error) {
	if want != "" {
		if _, err := ParseDigest(string(want)); err != nil {
			return Object{}, err
		}
	}
	return s.write(ctx, s.objects(), r, func(o Object) (string, error) {
		if want != "" && o.Digest != want {
			return "", fmt.Errorf("%s: what was written hashes to %s: %w; nothing was stored", objectName(s, want), o.Digest.Short(), ErrCorrupt)
		}
		// Renaming over an existing object is harmless (same content)
		// and repairs one that was damaged in place.
		return s.object(o.Digest).at, nil
	})
}

func (s *Dir) PutNamed(ctx context.Context, key string, r io.Reader) (Object, error) {
	l := s.namedObject(key)
	if l.err != nil {
		return Object{}, l.err
	}
	o, err := s.write(ctx, filepath.Dir(l.at), r, func(Object) (string, error) { return l.at, nil })
	if err != nil && api.CodeOf(err) == api.CodeUnavailable {
		if cerr := s.keyConflict(key); cerr != nil {
			return Object{}, cerr
		}
	}
	if err != nil {
		return Object{}, fmt.Errorf("put %s: %w", l.name, err) // the errors above name the temporary file
	}
	return o, nil
}

// keyConflict explains a put that failed because a file stands where
// key needs a directory, or a directory where it needs a file.
func (s *Dir) keyConflict(key string) error {
	if fi, err := os.Lstat(filepath.Join(s.named(), filepath.FromSlash(key))); err == nil && fi.IsDir() {
		return api.Errorf(api.CodeFailedPrecondition, "artifact store %s: key %s is the prefix of other named objects: a directory store cannot hold it as an object too; choose another key", s, key)
	}
	for up := path.Dir(key); up != "."; up = path.Dir(up) {
		if fi, err := os.Lstat(filepath.Join(s.named(), filepath.FromSlash(up))); err == nil && !fi.IsDir() {
			return api.Errorf(api.CodeFailedPrecondition, "artifact store %s: key %s lies under named object %s: a directory store cannot hold both; choose another key or delete %s", s, key, up, up)
		}
	}
	return nil
}

// write copies what r yields to a temporary file in dir, named after this
// node (a shared store's other writers leave it alone), and once it is
// whole and on disk renames it to the path final chooses from its digest
// and size: a reader on any host sees the old file or the new one. If
// final refuses it, nothing is stored. Bounded by MaxObjectBytes.
func (s *Dir) write(ctx context.Context, dir string, r io.Reader, final func(Object) (string, error)) (Object, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return Object{}, s.unavailable("create "+dir, err)
	}
	tmp, err := storagepool.TempPath(dir, storagepool.Temp{Node: s.node, Purpose: "put"})
	if err != nil {
		return Object{}, err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return Object{}, s.unavailable("write "+tmp, err)
	}
	h := sha256.New()
	hw := &holeWriter{f: f}
	n, err := io.Copy(io.MultiWriter(hw, h), io.LimitReader(ctxio.Reader(ctx, r), MaxObjectBytes+1))
	if err == nil && n > MaxObjectBytes {
		err = api.Errorf(api.CodeInvalidArgument, "object for %s is larger than %d bytes", s, int64(MaxObjectBytes))
	}
	if err == nil {
		err = hw.finish()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	o := Object{Digest: digestOf(h), Size: n}
	var dst string
	if err == nil {
		dst, err = final(o)
	}
	if err != nil {
		os.Remove(tmp)
		return Object{}, err
	}
	if err := storagepool.Commit(tmp, dst); err != nil {
		return Object{}, s.unavailable("store "+dst, err)
	}
	return o, nil
}

func (s *Dir) Stat(ctx context.Context, d Digest) (Object, error) {
	size, err := s.stat(s.object(d))
	if err != nil {
		return Object{}, err
	}
	return Object{Digest: d, Size: size}, nil
}

func (s *Dir) StatNamed(ctx context.Context, key string) (int64, error) {
	return s.stat(s.namedObject(key))
}

func (s *Dir) OpenAt(ctx context.Context, d Digest, offset int64) (io.ReadCloser, error) {
	return s.open(ctx, s.object(d), offset)
}

func (s *Dir) OpenNamed(ctx context.Context, key string, offset int64) (io.ReadCloser, error) {
	return s.open(ctx, s.namedObject(key), offset)
}

func (s *Dir) Delete(ctx context.Context, d Digest) error { return s.remove(s.object(d)) }

func (s *Dir) DeleteNamed(ctx context.Context, key string) error {
	return s.remove(s.namedObject(key))
}

func (s *Dir) stat(l loc) (int64, error) {
	if l.err != nil {
		return 0, l.err
	}
	fi, err := os.Stat(l.at)
	if err != nil {
		return 0, s.openErr(l.ref, err)
	}
	return regular(l, fi)
}

// regular is the size of the file fi describes if it is an object: a
// directory is not (on a named path it holds other named objects).
func regular(l loc, fi fs.FileInfo) (int64, error) {
	if fi.IsDir() {
		return 0, l.missing()
	}
	if !fi.Mode().IsRegular() {
		return 0, api.Errorf(api.CodeFailedPrecondition, "%s is not a regular file: remove %s and %s", l.name, l.at, l.lost)
	}
	return fi.Size(), nil
}

func (s *Dir) open(ctx context.Context, l loc, offset int64) (io.ReadCloser, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := l.checkOffset(offset); err != nil {
		return nil, err
	}
	f, err := os.Open(l.at)
	if err != nil {
		return nil, s.openErr(l.ref, err)
	}
	fi, err := f.Stat()
	if err == nil {
		_, err = regular(l, fi)
	}
	if err == nil {
		if _, serr := f.Seek(offset, io.SeekStart); serr != nil {
			err = s.unavailable("read "+l.id, serr)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return readCloser{ctxio.Reader(ctx, f), f}, nil
}

// remove deletes the object at l; one that is not there, or a directory
// (no object: the prefix of others), is no error.
func (s *Dir) remove(l loc) error {
	if l.err != nil {
		return l.err
	}
	if fi, err := os.Lstat(l.at); err == nil && fi.IsDir() {
		return nil
	}
	if err := os.Remove(l.at); err != nil {
		if err := s.openErr(l.ref, err); api.CodeOf(err) != api.CodeNotFound {
			return err
		}
	}
	return nil
}

func (s *Dir) List(ctx context.Context) ([]Listed, error) {
	entries, err := os.ReadDir(s.objects())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, err := os.Stat(s.root); err != nil {
			return nil, s.unavailable("list objects", err)
		}
		return nil, nil // nothing was ever stored
	case err != nil:
		return nil, s.unavailable("list objects", err)
	}
	l := objectListing{s: s, max: s.maxListed}
	for _, e := range entries {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted meanwhile, or not an object
		}
		if err := l.add(e.Name(), fi.Size(), fi.ModTime()); err != nil {
			return nil, err
		}
	}
	return l.sorted(), nil
}

func (s *Dir) ListNamed(ctx context.Context, prefix string) ([]Named, error) {
	if err := checkPrefix(s, prefix); err != nil {
		return nil, err
	}
	if _, err := os.Stat(s.root); err != nil {
		return nil, s.unavailable("list "+prefix, err)
	}
	l := listing{s: s, max: s.maxListed, prefix: prefix}
	top := filepath.Join(s.named(), filepath.FromSlash(prefix))
	err := filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil // nothing was ever stored under it, or it went meanwhile
		case err != nil:
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case !e.Type().IsRegular():
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil // deleted meanwhile
		}
		rel, _ := filepath.Rel(s.named(), p)
		return l.add(filepath.ToSlash(rel), fi.Size())
	})
	if api.CodeOf(err) == api.CodeResourceExhausted {
		return nil, err
	}
	if cerr := ctx.Err(); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, s.unavailable("list "+prefix, err)
	}
	return l.sorted(), nil
}

func (s *Dir) openErr(r ref, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		if _, rerr := os.Stat(s.root); rerr != nil {
			return s.unavailable("open "+r.id, rerr)
		}
		return r.missing()
	}
	return s.unavailable("read "+r.id, err)
}

func (s *Dir) unavailable(what string, err error) error {
	return api.Errorf(api.CodeUnavailable, "artifact store %s: %s: %v; check that the directory is mounted and writable on this host", s, what, err)
}

type readCloser struct {
	io.Reader
	io.Closer
}
