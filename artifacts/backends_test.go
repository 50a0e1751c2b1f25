package artifacts

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/minio/minio-go/v7"

	"github.com/kibotos/kibotos/internal/s3test"
)

// backend is a kind of store the behaviour tests run against.
type backend struct {
	name string
	open func(t testing.TB) Store
	// unreachable is the store when what holds it is gone, and hint
	// what its errors then tell the operator to check.
	unreachable func(t *testing.T) Store
	hint        string
}

var backends = []backend{
	{name: "dir", open: func(t testing.TB) Store { return newStore(t) },
		unreachable: func(t *testing.T) Store {
			s, err := NewDir(filepath.Join(t.TempDir(), "not-mounted"), "node-a")
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, hint: "check that the directory is mounted"},
	{name: "s3", open: func(t testing.TB) Store { return newS3Store(t, testBucket) },
		unreachable: func(t *testing.T) Store {
			srv := httptest.NewServer(http.NotFoundHandler())
			srv.Close() // its port now refuses connections
			return openS3(t, srv.URL, testBucket, accessKey)
		}, hint: "is reachable from this host"},
}

// forEachBackend runs test against a fresh store of every backend.
func forEachBackend(t *testing.T, test func(t *testing.T, s Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { test(t, b.open(t)) })
	}
}

const (
	testBucket = "kibotos-test"
	testPrefix = "cluster-a/artifacts"
	accessKey  = "AKIDKIBOTOSTEST"
	secretKey  = "wJalrXUtnFEMI-kibotos-test-secret"
)

// fakeS3 is an S3-protocol server (gofakes3, in memory) on a loopback
// port. gofakes3 v1.2.0 does not verify request signatures (it has no
// option to): the requests are signed (SigV4) by minio-go as for any
// endpoint, but only the access key id they name is checked, by wrong.
type fakeS3 struct {
	url string
	mu  sync.Mutex
	log []string // "METHOD what" of every request that reached gofakes3
}

// requests is the log of requests, each as "PUT part", "DELETE upload"...
func (f *fakeS3) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

func newFakeS3(t testing.TB) *fakeS3 {
	t.Helper()
	mem := s3mem.New()
	if err := mem.CreateBucket(testBucket); err != nil {
		t.Fatal(err)
	}
	h := gofakes3.New(mem).Server()
	f := &fakeS3{}
	srv := httptest.NewServer(s3test.KeyChecked(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		what := "object"
		switch q := r.URL.Query(); {
		case q.Has("partNumber"):
			what = "part"
		case q.Has("uploadId"), q.Has("uploads"):
			what = "upload"
		}
		f.mu.Lock()
		f.log = append(f.log, r.Method+" "+what)
		f.mu.Unlock()
		h.ServeHTTP(w, r)
	}), accessKey))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// writeCredentials writes a credentials file as an operator would.
func writeCredentials(t testing.TB, id string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s3.toml")
	if err := os.WriteFile(p, []byte("access_key_id = \""+id+"\"\nsecret_access_key = \""+secretKey+"\"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// openS3 opens the store through its configuration, as a member does.
func openS3(t testing.TB, endpoint, bucket, id string) *S3 {
	t.Helper()
	s, err := Open(Config{URL: "s3://" + bucket + "/" + testPrefix, Endpoint: endpoint, CredentialsFile: writeCredentials(t, id, 0o600)}, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	s3 := s.(*S3)
	s3.partSize = 5 << 20 // S3's least part: many parts from small objects
	return s3
}

func newS3Store(t testing.TB, bucket string) *S3 {
	return openS3(t, newFakeS3(t).url, bucket, accessKey)
}

// damage rewrites an object in place the way a disk or a careless hand
// would: fn gets its bytes and returns the new ones.
func damage(t *testing.T, s Store, d Digest, fn func([]byte) []byte) {
	t.Helper()
	damageAt(t, s, objectPath(d), fn)
}

// damageAt is damage of what lies at rel (as stored names it).
func damageAt(t *testing.T, s Store, rel string, fn func([]byte) []byte) {
	t.Helper()
	switch s := s.(type) {
	case *Dir:
		p := filepath.Join(s.root, filepath.FromSlash(rel))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, fn(b), 0o640); err != nil {
			t.Fatal(err)
		}
	case *S3:
		ctx := context.Background()
		key := s.key(rel)
		obj, err := s.client.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(obj)
		if err != nil {
			t.Fatal(err)
		}
		b = fn(b)
		if _, err := s.client.PutObject(ctx, s.bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{DisableContentSha256: true}); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("damage: no way into %T", s)
	}
}

// stored lists what a store holds, relative to its root or prefix:
// objects, temporary files, staging keys and unfinished uploads alike.
func stored(t *testing.T, s Store) []string {
	t.Helper()
	var names []string
	switch s := s.(type) {
	case *Dir:
		filepath.WalkDir(s.root, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				rel, _ := filepath.Rel(s.root, p)
				names = append(names, rel)
			}
			return nil
		})
	case *S3:
		ctx := context.Background()
		for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + "/", Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			names = append(names, strings.TrimPrefix(o.Key, s.prefix+"/"))
		}
		for u := range s.client.ListIncompleteUploads(ctx, s.bucket, s.prefix+"/", true) {
			if minio.ToErrorResponse(u.Err).Code == "NoSuchUpload" {
				break // gofakes3's answer for a bucket that never had one
			}
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			names = append(names, "unfinished upload of "+u.Key)
		}
	default:
		t.Fatalf("stored: no way into %T", s)
	}
	sort.Strings(names)
	return names
}

func objectPath(d Digest) string { return "objects/sha256/" + d.Hex() }

// The refused-put tests trust stored to see an upload that was started
// and never completed nor aborted.
func TestStoredSeesUnfinishedUploads(t *testing.T) {
	s := newS3Store(t, testBucket)
	core := minio.Core{Client: s.client}
	if _, err := core.NewMultipartUpload(context.Background(), s.bucket, s.key("objects", "half"), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s); len(got) != 1 || got[0] != "unfinished upload of "+s.key("objects", "half") {
		t.Fatalf("stored = %v", got)
	}
}
