package artifacts

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kibotos/kibotos/api"
)

func newStore(t *testing.T) *Dir {
	t.Helper()
	s, err := NewDir(t.TempDir(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func content(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func digestOfBytes(b []byte) Digest {
	sum := sha256.Sum256(b)
	return Digest("sha256:" + hex.EncodeToString(sum[:]))
}

func put(t *testing.T, s Store, b []byte) Object {
	t.Helper()
	o, err := s.Put(context.Background(), bytes.NewReader(b), "")
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// damage rewrites an object in place the way a disk or a careless hand
// would: fn gets its bytes and returns the new ones.
func damage(t *testing.T, s *Dir, d Digest, fn func([]byte) []byte) {
	t.Helper()
	p, _ := s.path(d)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, fn(b), 0o640); err != nil {
		t.Fatal(err)
	}
}

func flip(at int) func([]byte) []byte {
	return func(b []byte) []byte { b[at] ^= 0x20; return b }
}

func TestParseDigest(t *testing.T) {
	good := digestOfBytes([]byte("x"))
	if _, err := ParseDigest(string(good)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "sha256:", "sha256:abc", strings.ToUpper(string(good)), "sha512:" + good.Hex(),
		"sha256:" + strings.Repeat("g", 64), "sha256:../" + good.Hex()[3:], string(good) + "0"} {
		if _, err := ParseDigest(bad); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Errorf("ParseDigest(%q) = %v, want invalid_argument", bad, err)
		}
	}
}

func TestParseURL(t *testing.T) {
	if u, err := ParseURL("file:///srv/kibotos/artifacts"); err != nil || u.Path != "/srv/kibotos/artifacts" {
		t.Fatalf("file:///srv/kibotos/artifacts: %v %v", u, err)
	}
	for raw, says := range map[string]string{
		"s3://bucket/prefix":                   "not supported yet",
		"file://relative/dir":                  "names host",
		"file:///srv/../etc":                   "absolute, clean path",
		"file:///":                             "absolute, clean path",
		"file:///srv/a?x=1":                    "query",
		"http://example.com/a":                 `scheme "http"`,
		"/srv/kibotos/artifacts":               `scheme ""`,
		"file:///" + strings.Repeat("a", 5000): "at most 4096",
	} {
		_, err := ParseURL(raw)
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseURL(%.40q) = %v, want invalid_argument saying %q", raw, err, says)
		}
	}
}

func TestPutGetStat(t *testing.T) {
	s := newStore(t)
	b := content(t, 3<<20+17)
	o := put(t, s, b)
	if o.Digest != digestOfBytes(b) || o.Size != int64(len(b)) {
		t.Fatalf("Put = %+v", o)
	}
	if st, err := s.Stat(context.Background(), o.Digest); err != nil || st != o {
		t.Fatalf("Stat = %+v, %v", st, err)
	}
	rc, got, err := Get(context.Background(), s, o.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	read, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(read, b) || got != o {
		t.Fatalf("Get: %d bytes, %v", len(read), err)
	}
	missing := digestOfBytes([]byte("never stored"))
	if _, err := s.Stat(context.Background(), missing); api.CodeOf(err) != api.CodeNotFound || !strings.Contains(err.Error(), string(missing)) {
		t.Fatalf("Stat of a missing object: %v", err)
	}
	// Nothing but the object is left in the store.
	entries, _ := os.ReadDir(s.objects())
	if len(entries) != 1 || entries[0].Name() != o.Digest.Hex() {
		t.Fatalf("store holds %v", entries)
	}
}

func TestPutRefusesWrongContent(t *testing.T) {
	s := newStore(t)
	want := digestOfBytes([]byte("expected"))
	_, err := s.Put(context.Background(), strings.NewReader("something else"), want)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), string(want)) {
		t.Fatalf("Put of other content = %v", err)
	}
	if entries, _ := os.ReadDir(s.objects()); len(entries) != 0 {
		t.Fatalf("a refused put left %v", entries)
	}
}

func TestGetDetectsDamage(t *testing.T) {
	for name, fn := range map[string]func([]byte) []byte{
		"flipped byte": flip(1 << 20),
		"truncated":    func(b []byte) []byte { return b[:len(b)-1] },
		"extended":     func(b []byte) []byte { return append(b, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			o := put(t, s, content(t, 2<<20))
			damage(t, s, o.Digest, fn)
			rc, _, err := Get(context.Background(), s, o.Digest)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			_, err = io.ReadAll(rc)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), string(o.Digest)) {
				t.Fatalf("reading a damaged object: %v, want an error naming %s", err, o.Digest)
			}
		})
	}
}

func TestPutRepairsDamagedObject(t *testing.T) {
	s := newStore(t)
	b := content(t, 1<<20)
	o := put(t, s, b)
	damage(t, s, o.Digest, flip(10))
	put(t, s, b)
	rc, _, _ := Get(context.Background(), s, o.Digest)
	defer rc.Close()
	if _, err := io.ReadAll(rc); err != nil {
		t.Fatalf("after a second put: %v", err)
	}
}

func TestConcurrentPutsOfTheSameObject(t *testing.T) {
	s := newStore(t)
	b := content(t, 4<<20)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := s.Put(context.Background(), bytes.NewReader(b), digestOfBytes(b))
			if err == nil && o.Digest != digestOfBytes(b) {
				err = errors.New("wrong digest " + string(o.Digest))
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(s.objects())
	if len(entries) != 1 {
		t.Fatalf("after concurrent puts the store holds %d files, want the object alone", len(entries))
	}
	dst := filepath.Join(t.TempDir(), "img")
	if err := Fetch(context.Background(), s, Object{digestOfBytes(b), int64(len(b))}, dst, nil); err != nil {
		t.Fatal(err)
	}
}
