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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

func newStore(t testing.TB) *Dir {
	t.Helper()
	s, err := NewDir(t.TempDir(), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func content(t testing.TB, n int) []byte {
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
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 12<<20+17) // three parts of an S3 upload
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
		// Nothing but the object is left in the store (no temporary
		// file, staging key or unfinished upload).
		if got := stored(t, s); len(got) != 1 || got[0] != objectPath(o.Digest) {
			t.Fatalf("store holds %v", got)
		}
	})
}

func TestPutEmptyObject(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		empty := digestOfBytes(nil)
		for _, want := range []Digest{"", empty} {
			if o, err := s.Put(context.Background(), strings.NewReader(""), want); err != nil || o != (Object{empty, 0}) {
				t.Fatalf("Put of nothing (want %q) = %+v, %v", want, o, err)
			}
		}
		if _, err := s.Put(context.Background(), strings.NewReader(""), digestOfBytes([]byte("x"))); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Put of nothing for x = %v", err)
		}
		rc, _, err := Get(context.Background(), s, empty)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if b, err := io.ReadAll(rc); err != nil || len(b) != 0 {
			t.Fatalf("Get of the empty object: %q, %v", b, err)
		}
		if got := stored(t, s); len(got) != 1 || got[0] != objectPath(empty) {
			t.Fatalf("store holds %v", got)
		}
	})
}

func TestPutRefusesWrongContent(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		for name, b := range map[string][]byte{"small": []byte("something else"), "many parts": content(t, 11<<20)} {
			want := digestOfBytes([]byte("expected"))
			_, err := s.Put(context.Background(), bytes.NewReader(b), want)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), string(want)) {
				t.Fatalf("%s: Put of other content = %v", name, err)
			}
			if got := stored(t, s); len(got) != 0 {
				t.Fatalf("%s: a refused put left %v", name, got)
			}
		}
	})
}

func TestGetDetectsDamage(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		for name, fn := range map[string]func([]byte) []byte{
			"flipped byte": flip(1 << 20),
			"truncated":    func(b []byte) []byte { return b[:len(b)-1] },
			"extended":     func(b []byte) []byte { return append(b, 0) },
		} {
			t.Run(name, func(t *testing.T) {
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
	})
}

func TestPutRepairsDamagedObject(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 1<<20)
		for _, want := range []Digest{"", digestOfBytes(b)} {
			o := put(t, s, b)
			damage(t, s, o.Digest, flip(10))
			if _, err := s.Put(context.Background(), bytes.NewReader(b), want); err != nil {
				t.Fatal(err)
			}
			rc, _, _ := Get(context.Background(), s, o.Digest)
			if _, err := io.ReadAll(rc); err != nil {
				t.Fatalf("after a second put (want %q): %v", want, err)
			}
			rc.Close()
		}
	})
}

func TestConcurrentPutsOfTheSameObject(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 6<<20)
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				want := digestOfBytes(b)
				if i%2 == 1 {
					want = "" // half of them through a staging key
				}
				o, err := s.Put(context.Background(), bytes.NewReader(b), want)
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
		if got := stored(t, s); len(got) != 1 {
			t.Fatalf("after concurrent puts the store holds %v, want the object alone", got)
		}
		dst := filepath.Join(t.TempDir(), "img")
		if err := Fetch(context.Background(), s, Object{digestOfBytes(b), int64(len(b))}, dst, nil); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		keep, gone := put(t, s, content(t, 1<<20)), put(t, s, content(t, 1<<20))
		for i := range 2 { // the second finds nothing to delete, and is no error
			if err := s.Delete(ctx, gone.Digest); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
		if _, err := s.Stat(ctx, gone.Digest); api.CodeOf(err) != api.CodeNotFound {
			t.Fatalf("Stat of a deleted object: %v", err)
		}
		if got := stored(t, s); len(got) != 1 || got[0] != objectPath(keep.Digest) {
			t.Fatalf("after the delete the store holds %v", got)
		}
		if err := s.Delete(ctx, "sha256:../x"); api.CodeOf(err) != api.CodeInvalidArgument {
			t.Fatalf("Delete of a bad digest: %v", err)
		}
	})
}

func TestDeleteFromAnUnreachableStore(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := b.unreachable(t)
			err := s.Delete(context.Background(), digestOfBytes([]byte("x")))
			if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), b.hint) {
				t.Fatalf("Delete from an unreachable store = %v", err)
			}
		})
	}
}

// List finds every object with its digest, size and when it was written,
// sorted by digest, and nothing else: not an upload's temporary file, not
// a named object.
func TestList(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		if l, err := s.List(ctx); err != nil || len(l) != 0 {
			t.Fatalf("List of an empty store: %v, %v", l, err)
		}
		before := time.Now().Add(-time.Minute)
		a, b := put(t, s, []byte("first object")), put(t, s, content(t, 6<<20))
		if _, err := s.PutNamed(ctx, "kibotos-transfer/v1/default/tr-x.tar", strings.NewReader("named")); err != nil {
			t.Fatal(err)
		}
		if d, ok := s.(*Dir); ok {
			os.WriteFile(filepath.Join(d.objects(), ".node-a.put-1.tmp"), []byte("half"), 0o640)
		}
		l, err := s.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []Object{a, b}
		slices.SortFunc(want, func(x, y Object) int { return strings.Compare(string(x.Digest), string(y.Digest)) })
		if len(l) != 2 || l[0].Object != want[0] || l[1].Object != want[1] {
			t.Fatalf("List = %+v, want %+v", l, want)
		}
		for _, o := range l {
			if o.Modified.Before(before) || o.Modified.After(time.Now().Add(time.Minute)) {
				t.Errorf("object %s modified %s, want about now", o.Digest.Short(), o.Modified)
			}
		}
	})
}
