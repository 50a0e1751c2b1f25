// Package artifacts is the cluster's artifact store: content-addressed
// objects (sha256) that nodes put and fetch, such as template images a
// node built and another node boots. The store is configured once for the
// cluster ([artifacts] url): a directory (file://, e.g. on a shared file
// system, Dir) or an S3-compatible bucket (s3://, S3); both implement
// Store and pass the same behaviour tests.
//
// An object is never trusted as it is read: every read is checked against
// its digest, and a mismatch is an error naming the object, never data.
// Objects appear whole (a directory renames a temporary file into place; a
// bucket completes an upload or copy only once its digest is known) and a
// fetch to a local file resumes where an interrupted one stopped. A store's
// credentials never appear in a message or a log line.
//
// Besides them the store holds named objects (PutNamed): objects under a
// key their writer chooses, lists by prefix and deletes, such as the
// workspace archives of a transfer under kibotos-transfer/v1/<namespace>/.
// They appear whole as objects do, and a reader verifies one against the
// digest its writer recorded (FetchNamed).
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
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/storagepool"
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
	// Delete removes an object; one that is not there is no error, so
	// a collector or a transfer that stopped halfway can run again.
	Delete(ctx context.Context, d Digest) error
	// List is every content-addressed object, sorted by digest, with
	// when it was last written: objects being written are not among
	// them. More than 100,000 is an error, as for ListNamed.
	List(ctx context.Context) ([]Listed, error)

	// PutNamed stores what r yields under key (see ParseKey), replacing
	// what was there, and returns its digest and size. Readers see the
	// old object or the new one, whole, never a part. On a directory
	// store a key cannot also be the prefix of another (a/b and a/b/c):
	// the first is a file, the second needs it to be a directory.
	PutNamed(ctx context.Context, key string, r io.Reader) (Object, error)
	// StatNamed tells a named object's size without reading it.
	StatNamed(ctx context.Context, key string) (int64, error)
	// OpenNamed reads a named object's raw bytes from offset on; the
	// caller verifies them against the digest it recorded (FetchNamed
	// does).
	OpenNamed(ctx context.Context, key string, offset int64) (io.ReadCloser, error)
	// ListNamed is every named object whose key starts with prefix
	// (which ends in "/"), sorted by key: objects being written are not
	// among them. More than 100,000 is an error, not a partial list, so
	// a collector never mistakes the first part for all of it.
	ListNamed(ctx context.Context, prefix string) ([]Named, error)
	// DeleteNamed removes a named object; one that is not there is no
	// error.
	DeleteNamed(ctx context.Context, key string) error

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

// ref is what an operation is on, for its errors: an object by its
// digest or a named object by its key.
type ref struct {
	id   string // the digest or the key
	name string // "object sha256:… in s3://…", "named object k in file://…"
	// lost and damaged say what to do when it is not there, or when
	// it does not match what its reader recorded.
	lost, damaged string
}

func digestRef(s Store, d Digest) ref {
	return ref{id: string(d), name: objectName(s, d),
		lost: "publish it again (kibo template publish)", damaged: "publish it again from a node that holds it"}
}

func keyRef(s Store, key string) ref {
	return ref{id: key, name: "named object " + key + " in " + s.String(),
		lost: "put it again, or list its prefix to see what is there", damaged: "put it again from its source"}
}

// loc is where an object lies in a store (a path, an S3 key) and how
// errors name it. err, if set, is why it can lie nowhere (not a digest,
// not a key), and every operation on it answers that.
type loc struct {
	at string
	ref
	err error
}

// missing is the error for r not being there.
func (r ref) missing() error {
	return api.Errorf(api.CodeNotFound, "%s is not there: %s", r.name, r.lost)
}

// checkOffset refuses a read of r from before its start.
func (r ref) checkOffset(offset int64) error {
	if offset < 0 {
		return api.Errorf(api.CodeInvalidArgument, "read %s from offset %d: give an offset of 0 or more", r.name, offset)
	}
	return nil
}

// Named is an object stored under a key of its writer's choosing (a
// workspace archive under kibotos-transfer/v1/<namespace>/), which its
// writer lists by prefix and deletes.
type Named struct {
	Key  string `json:"key"`
	Size int64  `json:"size"`
}

// Listed is an object as List finds it.
type Listed struct {
	Object
	Modified time.Time `json:"modified"`
}

// objectListing collects what List finds.
type objectListing struct {
	s     Store
	max   int
	found []Listed
}

// add takes name if it is an object's (64 hex digits): a temporary file,
// or anything a hand put there, is not one.
func (l *objectListing) add(name string, size int64, mod time.Time) error {
	d, err := ParseDigest(digestPrefix + name)
	if err != nil {
		return nil
	}
	if len(l.found) == l.max {
		return api.Errorf(api.CodeResourceExhausted, "artifact store %s: more than %d objects: delete what is no longer needed", l.s, l.max)
	}
	l.found = append(l.found, Listed{Object: Object{Digest: d, Size: size}, Modified: mod})
	return nil
}

func (l *objectListing) sorted() []Listed {
	slices.SortFunc(l.found, func(a, b Listed) int { return strings.Compare(string(a.Digest), string(b.Digest)) })
	return l.found
}

// MaxKeyBytes bounds a key.
const MaxKeyBytes = 512

// defaultMaxListed bounds what List and ListNamed answer: their callers
// hold the list in memory. Each store keeps its bound in a field, which
// tests lower.
const defaultMaxListed = 100_000

var keySegment = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// reservedAreas are the first segments a key may not have: the
// content-addressed objects and S3's staging keys live there, and a key
// must never be mistaken for (or made to read as) one of them.
var reservedAreas = []string{"objects", "staging"}

const keyRules = "give 1 to 512 bytes: segments of letters, digits, '.', '_' and '-' between single '/', none of them . or .., the first neither objects nor staging, e.g. kibotos-transfer/v1/team-a/ws-1.tar"

// ParseKey checks key may name an object; nothing else ever becomes a
// path or an S3 key.
func ParseKey(key string) error {
	if why := keyProblem(key); why != "" {
		return api.Errorf(api.CodeInvalidArgument, "key %.80q %s: %s", key, why, keyRules)
	}
	return nil
}

// keyProblem says what is wrong with key, or "" if nothing is.
func keyProblem(key string) string {
	if key == "" || len(key) > MaxKeyBytes {
		return fmt.Sprintf("is %d bytes long", len(key))
	}
	segs := strings.Split(key, "/")
	if slices.Contains(reservedAreas, segs[0]) {
		return "has " + segs[0] + " for its first segment, an area the store keeps for itself"
	}
	for _, seg := range segs {
		switch {
		case seg == "":
			return "has an empty segment (a leading, trailing or double /)"
		case seg == "." || seg == "..":
			return "has a segment . or .."
		case !keySegment.MatchString(seg):
			return "has a character other than letters, digits, '.', '_', '-' and '/'"
		case storagepool.IsTemp(seg):
			// A directory store writes an object to such a file
			// beside it: a listing must tell the two apart.
			return "has a segment named as a temporary file (.name.tmp)"
		}
	}
	return ""
}

// checkKey is ParseKey for an operation on s: its refusal names s.
func checkKey(s Store, key string) error {
	if err := ParseKey(key); err != nil {
		return api.Errorf(api.CodeInvalidArgument, "artifact store %s: %v", s, err)
	}
	return nil
}

// checkPrefix checks a ListNamed prefix: a key's first segments and "/".
func checkPrefix(s Store, prefix string) error {
	body, ok := strings.CutSuffix(prefix, "/")
	why := "does not end in /"
	if ok {
		why = keyProblem(body)
	}
	if why != "" {
		return api.Errorf(api.CodeInvalidArgument, "artifact store %s: list prefix %.80q %s: give a key's leading segments and /, e.g. kibotos-transfer/v1/team-a/", s, prefix, why)
	}
	return nil
}

// listing gathers what a ListNamed finds, bounded and sorted.
type listing struct {
	s      Store
	max    int
	prefix string
	found  []Named
}

// add takes key if it is a named object's under the prefix: a temporary
// file, or anything a hand put there under another name, is not one.
func (l *listing) add(key string, size int64) error {
	if !strings.HasPrefix(key, l.prefix) || keyProblem(key) != "" {
		return nil
	}
	if len(l.found) == l.max {
		return api.Errorf(api.CodeResourceExhausted, "artifact store %s: more than %d named objects under %s: list a longer prefix, or delete what is no longer needed", l.s, l.max, l.prefix)
	}
	l.found = append(l.found, Named{Key: key, Size: size})
	return nil
}

func (l *listing) sorted() []Named {
	slices.SortFunc(l.found, func(a, b Named) int { return strings.Compare(a.Key, b.Key) })
	return l.found
}

// Config is the [artifacts] section of a member's configuration file.
type Config struct {
	// URL is the store: file:///absolute/dir or s3://bucket/prefix.
	URL string
	// Endpoint, Region, CredentialsFile and CAFile are an s3:// store's
	// (see S3Config); a file:// store refuses them.
	Endpoint        string
	Region          string
	CredentialsFile string
	// CAFile holds the PEM certificates an https endpoint's chain is
	// checked against instead of the host's trust store (a private CA).
	CAFile string
}

// Check refuses a Config Open would refuse, so a member stops on a bad
// [artifacts] section before it starts anything.
func (c Config) Check() error {
	_, err := Open(c, "")
	return err
}

// Open makes the store c names. node names this member in the names of
// temporary files and staging keys (a shared store's other writers keep
// their hands off them). Nothing is asked of the store yet: a store that
// is down fails its first operation, not the member's start.
func Open(c Config, node string) (Store, error) {
	u, err := ParseURL(c.URL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "s3" {
		sc, err := parseS3Config(u, c)
		if err != nil {
			return nil, err
		}
		return newS3(sc, node)
	}
	if c.Endpoint != "" || c.Region != "" || c.CredentialsFile != "" || c.CAFile != "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint, region, credentials_file and ca_file are an s3:// store's: delete them for url %q", c.URL)
	}
	return NewDir(u.Path, node)
}

// ParseURL checks an [artifacts] url: file:///absolute/dir or
// s3://bucket/prefix (the prefix optional).
func ParseURL(rawURL string) (*url.URL, error) {
	if len(rawURL) > 4096 {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url is %d bytes long: give at most 4096", len(rawURL))
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q is not a URL: %v; give file:///absolute/directory or s3://bucket/prefix", rawURL, err)
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
		if _, _, err := bucketAndPrefix(u); err != nil {
			return nil, err
		}
		return u, nil
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: scheme %q is not supported; give file:///absolute/directory or s3://bucket/prefix", rawURL, u.Scheme)
	}
}
