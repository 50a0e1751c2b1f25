// Package artifacts is the cluster's artifact store: content-addressed
// objects (sha256) that nodes put and fetch, such as template images a
// node built and another node boots. The store is configured once for the
// cluster ([artifacts] url); the directory backend (file://, e.g. on a
// shared file system) is the first, others (S3) implement the same Store.
//
// An object is never trusted as it is read: every read is checked against
// its digest, and a mismatch is an error naming the object, never data.
// Objects appear whole (written to a temporary file, then renamed) and a
// fetch to a local file resumes where an interrupted one stopped.
//
// It knows nothing of consensus or of what the objects are; the catalog
// of what was published lives in the FSM.
package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// Digest names an object by its content: "sha256:" and 64 lower-case hex
// digits.
type Digest string

const digestPrefix = "sha256:"

// MaxObjectBytes bounds one object (a template image is far below).
const MaxObjectBytes = 1 << 40

// ParseDigest checks s is a digest; nothing else ever becomes a path.
func ParseDigest(s string) (Digest, error) {
	hexPart, ok := strings.CutPrefix(s, digestPrefix)
	if !ok || len(hexPart) != sha256.Size*2 || strings.ToLower(hexPart) != hexPart {
		return "", api.Errorf(api.CodeInvalidArgument, "digest %.80q is not sha256: and 64 lower-case hex digits", s)
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", api.Errorf(api.CodeInvalidArgument, "digest %.80q is not sha256: and 64 lower-case hex digits", s)
	}
	return Digest(s), nil
}

// Hex is the digest's hex digits.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), digestPrefix) }

// Short is the digest cut to 12 hex digits, for tables.
func (d Digest) Short() string {
	if h := d.Hex(); len(h) > 12 {
		return digestPrefix + h[:12]
	}
	return string(d)
}

// Object is a stored object.
type Object struct {
	Digest Digest `json:"digest"`
	Size   int64  `json:"size"`
}

// ErrCorrupt is wrapped by every error of content that does not match its
// digest (a flipped byte, a truncated or overlong object).
var ErrCorrupt = errors.New("content does not match its digest")

// Store holds objects. Every method names the object in its errors; an
// object that is not there is an *api.Error not_found.
type Store interface {
	// Put stores what r yields and returns its digest and size. If want
	// is set, content that hashes otherwise is refused and not stored.
	Put(ctx context.Context, r io.Reader, want Digest) (Object, error)
	// Stat tells an object's size without reading it.
	Stat(ctx context.Context, d Digest) (Object, error)
	// OpenAt reads an object's raw bytes from offset on, unchecked: the
	// caller verifies (Get and Fetch do).
	OpenAt(ctx context.Context, d Digest, offset int64) (io.ReadCloser, error)
	// String names the store in messages (its URL).
	String() string
}

// Get opens an object for reading; the reader fails at its end, with an
// error wrapping ErrCorrupt, when what it read does not match the digest.
func Get(ctx context.Context, s Store, d Digest) (io.ReadCloser, Object, error) {
	o, err := s.Stat(ctx, d)
	if err != nil {
		return nil, Object{}, err
	}
	rc, err := s.OpenAt(ctx, d, 0)
	if err != nil {
		return nil, Object{}, err
	}
	return &verifier{rc: rc, name: objectName(s, d), want: o, h: sha256.New()}, o, nil
}

// verifier hashes what passes through and turns a mismatch at the end into
// an error instead of io.EOF.
type verifier struct {
	rc   io.ReadCloser
	name string
	want Object
	h    hash.Hash
	n    int64
}

func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.n > v.want.Size {
		return n, fmt.Errorf("%s: longer than its %d bytes: %w", v.name, v.want.Size, ErrCorrupt)
	}
	if err == io.EOF {
		if err := check(v.name, v.want, v.n, v.h); err != nil {
			return n, err
		}
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }

// check compares what was read (n bytes hashing to h) with want.
func check(name string, want Object, n int64, h hash.Hash) error {
	if n != want.Size {
		return fmt.Errorf("%s: read %d bytes of %d (truncated): %w", name, n, want.Size, ErrCorrupt)
	}
	if got := digestOf(h); got != want.Digest {
		return fmt.Errorf("%s: content hashes to %s: %w", name, got.Short(), ErrCorrupt)
	}
	return nil
}

func digestOf(h hash.Hash) Digest { return Digest(digestPrefix + hex.EncodeToString(h.Sum(nil))) }

func objectName(s Store, d Digest) string { return "object " + string(d) + " in " + s.String() }

// Open makes the store a URL names: file:///absolute/dir for now. node
// names this member in the names of temporary files (a shared directory's
// other writers keep their hands off them).
func Open(rawURL, node string) (Store, error) {
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return NewDir(u.Path, node)
}

// ParseURL checks an [artifacts] url.
func ParseURL(rawURL string) (*url.URL, error) {
	if len(rawURL) > 4096 {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url is %d bytes long: give at most 4096", len(rawURL))
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q is not a URL: %v; give file:///absolute/directory", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		switch {
		case u.Host != "" && u.Host != "localhost":
			return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q names host %q: a file:// store is a local (or mounted) directory, give file:///absolute/directory", rawURL, u.Host)
		case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
			return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q has a user, query or fragment: give file:///absolute/directory", rawURL)
		case !filepath.IsAbs(u.Path) || filepath.Clean(u.Path) != u.Path || u.Path == "/":
			return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: the directory must be an absolute, clean path other than /, e.g. file:///srv/kibotos/artifacts", rawURL)
		}
		return u, nil
	case "s3":
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: s3:// stores are not supported yet; use a directory on a shared file system (file:///srv/kibotos/artifacts)", rawURL)
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: scheme %q is not supported; give file:///absolute/directory", rawURL, u.Scheme)
	}
}
