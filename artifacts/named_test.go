package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

// transfers is the prefix the product documents for workspace archives.
const transfers = "kibotos-transfer/v1/team-a/"

func putNamed(t *testing.T, s Store, key string, b []byte) Object {
	t.Helper()
	o, err := s.PutNamed(context.Background(), key, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if o != (Object{digestOfBytes(b), int64(len(b))}) {
		t.Fatalf("PutNamed(%s) = %+v, want the digest and size of its %d bytes", key, o, len(b))
	}
	return o
}

func readNamed(t *testing.T, s Store, key string, offset int64) []byte {
	t.Helper()
	rc, err := s.OpenNamed(context.Background(), key, offset)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func listNamed(t *testing.T, s Store, prefix string) []Named {
	t.Helper()
	l, err := s.ListNamed(context.Background(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func namedPath(key string) string { return "named/" + key }

func TestNamedRoundTrip(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		a, b := content(t, 6<<20+3), []byte("second archive") // a: two parts of an S3 upload
		putNamed(t, s, transfers+"ws-1.tar", a)
		putNamed(t, s, transfers+"ws-0.tar", b)
		empty := putNamed(t, s, transfers+"empty", nil)
		if size, err := s.StatNamed(ctx, transfers+"ws-1.tar"); err != nil || size != int64(len(a)) {
			t.Fatalf("StatNamed = %d, %v", size, err)
		}
		if got := readNamed(t, s, transfers+"ws-1.tar", 0); !bytes.Equal(got, a) {
			t.Fatalf("OpenNamed read %d bytes, not the %d put", len(got), len(a))
		}
		if got := readNamed(t, s, transfers+"ws-1.tar", 5<<20); !bytes.Equal(got, a[5<<20:]) {
			t.Fatal("OpenNamed from an offset read other bytes")
		}
		if got := readNamed(t, s, transfers+"ws-0.tar", int64(len(b))); len(got) != 0 {
			t.Fatalf("OpenNamed at the end read %q", got)
		}
		want := []Named{{transfers + "empty", empty.Size}, {transfers + "ws-0.tar", int64(len(b))}, {transfers + "ws-1.tar", int64(len(a))}}
		if got := listNamed(t, s, transfers); !slices.Equal(got, want) {
			t.Fatalf("ListNamed = %v, want %v", got, want)
		}
		// Named objects are kept apart from the content-addressed ones,
		// and nothing else is left (no temporary file, staging key or
		// unfinished upload).
		if got := stored(t, s); !slices.Equal(got, []string{namedPath(want[0].Key), namedPath(want[1].Key), namedPath(want[2].Key)}) {
			t.Fatalf("store holds %v", got)
		}

		for i := range 2 { // the second finds nothing to delete, and is no error
			if err := s.DeleteNamed(ctx, transfers+"ws-1.tar"); err != nil {
				t.Fatalf("delete %d: %v", i+1, err)
			}
		}
		if _, err := s.StatNamed(ctx, transfers+"ws-1.tar"); api.CodeOf(err) != api.CodeNotFound || !strings.Contains(err.Error(), transfers+"ws-1.tar") || !strings.Contains(err.Error(), s.String()) {
			t.Fatalf("StatNamed of a deleted object: %v", err)
		}
		if _, err := s.OpenNamed(ctx, transfers+"ws-1.tar", 0); api.CodeOf(err) != api.CodeNotFound || !strings.Contains(err.Error(), transfers+"ws-1.tar") {
			t.Fatalf("OpenNamed of a deleted object: %v", err)
		}
		if got := listNamed(t, s, transfers); !slices.Equal(got, want[:2]) {
			t.Fatalf("ListNamed after the delete = %v", got)
		}
		if got := listNamed(t, s, "kibotos-transfer/v1/team-z/"); len(got) != 0 {
			t.Fatalf("ListNamed of a prefix never used = %v", got)
		}
	})
}

// A listing holds what is under the prefix, however deep and however many
// pages the endpoint answers in, and never an object still being written.
func TestListNamedSeesThePrefixOnly(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		if s3, ok := s.(*S3); ok {
			s3.listPage = 2 // the answer comes in pages
		}
		ctx := context.Background()
		for _, key := range []string{transfers + "x", transfers + "sub/z", transfers + "w", "kibotos-transfer/v1/team-ab/y", "kibotos-transfer/v1/team-a.old", "other/v"} {
			putNamed(t, s, key, []byte(key))
		}
		put(t, s, []byte("a content-addressed object"))
		var want []Named
		for _, key := range []string{transfers + "sub/z", transfers + "w", transfers + "x"} {
			want = append(want, Named{key, int64(len(key))})
		}
		if got := listNamed(t, s, transfers); !slices.Equal(got, want) {
			t.Fatalf("ListNamed = %v, want %v", got, want)
		}

		// A put that has sent part of its object and waits for the rest.
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := s.PutNamed(ctx, transfers+"new", pr)
			done <- err
		}()
		b := content(t, 1<<20)
		if _, err := pw.Write(b); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "a write under way in the store", func() (bool, string) {
			names := stored(t, s)
			return slices.ContainsFunc(names, underWay), fmt.Sprint(names)
		})
		if got := listNamed(t, s, transfers); !slices.Equal(got, want) {
			t.Fatalf("ListNamed while a put is under way = %v, want %v", got, want)
		}
		pw.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		want = append([]Named{{transfers + "new", int64(len(b))}}, want...)
		if got := listNamed(t, s, transfers); !slices.Equal(got, want) {
			t.Fatalf("ListNamed after the put = %v, want %v", got, want)
		}
	})
}

// underWay says whether a name stored lists is a write not yet complete.
func underWay(name string) bool {
	return strings.HasSuffix(name, ".tmp") || strings.HasPrefix(name, "unfinished upload of ")
}

func TestListNamedIsBounded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		switch s := s.(type) {
		case *Dir:
			s.maxListed = 2
		case *S3:
			s.maxListed = 2
		}
		putNamed(t, s, transfers+"a", []byte("a"))
		putNamed(t, s, transfers+"b", []byte("b"))
		if got := listNamed(t, s, transfers); len(got) != 2 {
			t.Fatalf("ListNamed = %v", got)
		}
		putNamed(t, s, transfers+"c", []byte("c"))
		_, err := s.ListNamed(context.Background(), transfers)
		if api.CodeOf(err) != api.CodeResourceExhausted || !strings.Contains(err.Error(), "more than 2 named objects under "+transfers) {
			t.Fatalf("ListNamed of too many = %v", err)
		}
	})
}

func TestPutNamedReplaces(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		key := transfers + "ws-1.tar"
		putNamed(t, s, key, content(t, 2<<20))
		b := []byte("the archive again, shorter")
		putNamed(t, s, key, b)
		if size, err := s.StatNamed(context.Background(), key); err != nil || size != int64(len(b)) {
			t.Fatalf("StatNamed = %d, %v", size, err)
		}
		if got := readNamed(t, s, key, 0); !bytes.Equal(got, b) {
			t.Fatalf("OpenNamed read %d bytes, not the second put's", len(got))
		}
		if got := stored(t, s); !slices.Equal(got, []string{namedPath(key)}) {
			t.Fatalf("store holds %v", got)
		}
	})
}

func TestNamedKeysRefused(t *testing.T) {
	for _, good := range []string{"a", transfers + "ws-1.tar", "x/.hidden/_y-1", "objectsx/y", strings.Repeat("k", MaxKeyBytes)} {
		if err := ParseKey(good); err != nil {
			t.Errorf("ParseKey(%.40q): %v", good, err)
		}
	}
	forEachBackend(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		for bad, says := range map[string]string{
			"":                                  "0 bytes",
			"../x":                              ". or ..",
			"a/./b":                             ". or ..",
			"/abs":                              "empty segment",
			"a/":                                "empty segment",
			"a//b":                              "empty segment",
			"a b":                               "a character other than",
			"a/\x00":                            "a character other than",
			"objects/sha256/x":                  "objects for its first segment",
			"staging/node-a.1":                  "staging for its first segment",
			"objects":                           "objects for its first segment",
			transfers + ".node-a.put-1.tmp":     "temporary file",
			strings.Repeat("k", MaxKeyBytes+88): "600 bytes",
		} {
			for op, err := range map[string]error{
				"put":    func() error { _, err := s.PutNamed(ctx, bad, strings.NewReader("x")); return err }(),
				"stat":   func() error { _, err := s.StatNamed(ctx, bad); return err }(),
				"open":   func() error { _, err := s.OpenNamed(ctx, bad, 0); return err }(),
				"delete": s.DeleteNamed(ctx, bad),
				"fetch":  FetchNamed(ctx, s, bad, Object{digestOfBytes([]byte("x")), 1}, filepath.Join(t.TempDir(), "x"), nil),
			} {
				if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), s.String()) {
					t.Errorf("%s of key %.40q = %v, want invalid_argument naming the store and saying %q", op, bad, err, says)
				}
			}
		}
		for _, bad := range []string{"", "/", "kibotos-transfer", "../", "objects/", "a//"} {
			if _, err := s.ListNamed(ctx, bad); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "list prefix") {
				t.Errorf("ListNamed(%q) = %v, want invalid_argument", bad, err)
			}
		}
		if got := stored(t, s); len(got) != 0 {
			t.Fatalf("refused operations left %v", got)
		}
	})
}

func TestFetchNamed(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		key := transfers + "ws-1.tar"
		b := content(t, 8<<20)
		o := putNamed(t, s, key, b)
		dst := filepath.Join(t.TempDir(), "ws-1.tar")
		bs := &breaking{Store: s, limit: 3 << 20}
		if err := FetchNamed(context.Background(), bs, key, o, dst, nil); !errors.Is(err, errLost) || !strings.Contains(err.Error(), key) {
			t.Fatalf("interrupted fetch = %v", err)
		}
		bs.limit = -1
		if err := FetchNamed(context.Background(), bs, key, o, dst, nil); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustRead(t, dst), b) {
			t.Fatal("fetched file differs from the object")
		}
		if !slices.Equal(bs.offsets, []int64{0, 3 << 20}) {
			t.Fatalf("reads started at %v, want 0 then a resume at %d", bs.offsets, 3<<20)
		}

		damageAt(t, s, namedPath(key), flip(5<<20))
		dst = filepath.Join(t.TempDir(), "again.tar")
		err := FetchNamed(context.Background(), s, key, o, dst, nil)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "put it again from its source") {
			t.Fatalf("fetch of a damaged object = %v", err)
		}
		for _, p := range []string{dst, dst + PartialSuffix} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s exists after a refused fetch", p)
			}
		}

		// Replaced since want was recorded: the size tells before a byte
		// is read.
		putNamed(t, s, key, []byte("another archive"))
		if err := FetchNamed(context.Background(), s, key, o, dst, nil); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "truncated or overwritten") {
			t.Fatalf("fetch of a replaced object = %v", err)
		}
		if err := FetchNamed(context.Background(), s, transfers+"gone", o, dst, nil); api.CodeOf(err) != api.CodeNotFound || !strings.Contains(err.Error(), transfers+"gone") {
			t.Fatalf("fetch of a missing object = %v", err)
		}
	})
}

func TestNamedStoreUnreachable(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := b.unreachable(t)
			ctx := context.Background()
			key := transfers + "ws-1.tar"
			ops := map[string]error{
				"stat":   func() error { _, err := s.StatNamed(ctx, key); return err }(),
				"open":   func() error { _, err := s.OpenNamed(ctx, key, 0); return err }(),
				"list":   func() error { _, err := s.ListNamed(ctx, transfers); return err }(),
				"delete": s.DeleteNamed(ctx, key),
				"fetch":  FetchNamed(ctx, s, key, Object{digestOfBytes([]byte("x")), 1}, filepath.Join(t.TempDir(), "x"), nil),
			}
			// A directory store creates its directory on a put, as Put
			// does: only the bucket's can be unreachable to a put.
			if _, ok := s.(*S3); ok {
				ops["put"] = func() error { _, err := s.PutNamed(ctx, key, strings.NewReader("x")); return err }()
			}
			for op, err := range ops {
				if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), s.String()) || !strings.Contains(err.Error(), b.hint) {
					t.Errorf("%s on an unreachable store = %v", op, err)
				}
				if op != "list" && !strings.Contains(err.Error(), key) {
					t.Errorf("%s on an unreachable store does not name %s: %v", op, key, err)
				}
			}
		})
	}
}

// A directory holds a named object as a file, so it cannot hold a key
// that is also another's prefix; the refusal says so.
func TestDirKeyThatIsAlsoAPrefix(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	putNamed(t, s, "a/b", []byte("x"))
	if _, err := s.PutNamed(ctx, "a/b/c", strings.NewReader("y")); api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "lies under named object a/b") {
		t.Fatalf("put under an object = %v", err)
	}
	if _, err := s.PutNamed(ctx, "a", strings.NewReader("y")); api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "key a is the prefix of other named objects") {
		t.Fatalf("put of a prefix = %v", err)
	}
	// A prefix is not an object: it is not there, and deleting it is a
	// no-op that leaves what is under it.
	if _, err := s.StatNamed(ctx, "a"); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("StatNamed of a prefix = %v", err)
	}
	if err := s.DeleteNamed(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s); !slices.Equal(got, []string{"named/a/b"}) {
		t.Fatalf("store holds %v", got)
	}
}

// A store that fills up fails the write and shows nothing of it: no key,
// no temporary file (a Transfer's archive to a full store fails its
// export with nothing half-listed).
func TestPutNamedToAFullStore(t *testing.T) {
	if os.Getuid() != 0 {
		testenv.Skipf(t, "mounting a small tmpfs needs root")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	s, err := NewDir(filepath.Join(root, "store"), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	key := "kibotos-transfer/v1/default/tr-x.tar"
	if _, err := s.PutNamed(context.Background(), key, bytes.NewReader(content(t, 2<<20))); err == nil { // data: zeros would be holes
		t.Fatal("a 2 MiB put into a 1 MiB store succeeded")
	}
	if l, err := s.ListNamed(context.Background(), "kibotos-transfer/"); err != nil || len(l) != 0 {
		t.Fatalf("listing after the failed put: %v %v", l, err)
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
}
