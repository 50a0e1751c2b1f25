package artifacts

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// breaking is a store whose reads stop with an error after limit bytes
// (a connection lost mid-download) and which records where reads start.
type breaking struct {
	Store
	limit   int64
	mu      sync.Mutex
	offsets []int64
}

var errLost = errors.New("connection lost")

func (b *breaking) OpenAt(ctx context.Context, d Digest, off int64) (io.ReadCloser, error) {
	return b.cut(off, func() (io.ReadCloser, error) { return b.Store.OpenAt(ctx, d, off) })
}

func (b *breaking) OpenNamed(ctx context.Context, key string, off int64) (io.ReadCloser, error) {
	return b.cut(off, func() (io.ReadCloser, error) { return b.Store.OpenNamed(ctx, key, off) })
}

// cut records a read from off and breaks what open opens.
func (b *breaking) cut(off int64, open func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	b.mu.Lock()
	b.offsets = append(b.offsets, off)
	b.mu.Unlock()
	rc, err := open()
	if err != nil || b.limit < 0 {
		return rc, err
	}
	return readCloser{io.MultiReader(io.LimitReader(rc, b.limit), errReader{}), rc}, nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errLost }

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFetchResumesWhereItStopped(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 40<<20)
		o := put(t, s, b)
		dst := filepath.Join(t.TempDir(), "rootfs.ext4")
		bs := &breaking{Store: s, limit: 17 << 20}
		err := Fetch(context.Background(), bs, o, dst, nil)
		if !errors.Is(err, errLost) || !strings.Contains(err.Error(), "the next fetch continues") {
			t.Fatalf("interrupted fetch = %v", err)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Fatalf("an interrupted fetch put %s in place", dst)
		}
		if n := len(mustRead(t, dst+PartialSuffix)); n != 17<<20 {
			t.Fatalf("partial file holds %d bytes, want %d", n, 17<<20)
		}
		bs.limit = -1
		var reports [][2]int64
		if err := Fetch(context.Background(), bs, o, dst, func(d, t int64) { reports = append(reports, [2]int64{d, t}) }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustRead(t, dst), b) {
			t.Fatal("fetched file differs from the object")
		}
		if bs.offsets[1] != 17<<20 {
			t.Fatalf("second fetch read from offset %d, want %d (resume)", bs.offsets[1], 17<<20)
		}
		if last := reports[len(reports)-1]; last != [2]int64{o.Size, o.Size} || len(reports) < 2 {
			t.Fatalf("progress reports %v", reports)
		}
		for _, p := range []string{dst + PartialSuffix, dst + LockSuffix} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Fatalf("%s left after a complete fetch", p)
			}
		}
	})
}

func TestFetchRefetchesADamagedPartialFile(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 8<<20)
		o := put(t, s, b)
		dst := filepath.Join(t.TempDir(), "rootfs.ext4")
		part := append([]byte(nil), b[:5<<20]...)
		part[4<<20] ^= 1 // the local disk flipped a bit of an interrupted fetch
		if err := os.WriteFile(dst+PartialSuffix, part, 0o600); err != nil {
			t.Fatal(err)
		}
		bs := &breaking{Store: s, limit: -1}
		if err := Fetch(context.Background(), bs, o, dst, nil); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustRead(t, dst), b) {
			t.Fatal("fetched file differs from the object")
		}
		if len(bs.offsets) != 2 || bs.offsets[0] != 5<<20 || bs.offsets[1] != 0 {
			t.Fatalf("reads started at %v, want a resume at %d then a refetch from 0", bs.offsets, 5<<20)
		}
	})
}

func TestFetchRefusesADamagedObject(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		for name, tc := range map[string]struct {
			fn   func([]byte) []byte
			says string
		}{
			"flipped byte": {flip(3 << 20), "damaged"},
			"truncated":    {func(b []byte) []byte { return b[:1<<20] }, "truncated"},
		} {
			t.Run(name, func(t *testing.T) {
				o := put(t, s, content(t, 4<<20))
				damage(t, s, o.Digest, tc.fn)
				dst := filepath.Join(t.TempDir(), "rootfs.ext4")
				err := Fetch(context.Background(), s, o, dst, nil)
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), string(o.Digest)) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("fetch of a damaged object = %v", err)
				}
				for _, p := range []string{dst, dst + PartialSuffix} {
					if _, err := os.Stat(p); !os.IsNotExist(err) {
						t.Errorf("%s exists after a refused fetch", p)
					}
				}
			})
		}
	})
}

func TestFetchOfAMissingObject(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		o := Object{Digest: digestOfBytes([]byte("gone")), Size: 4}
		err := Fetch(context.Background(), s, o, filepath.Join(t.TempDir(), "x"), nil)
		if err == nil || !strings.Contains(err.Error(), "is not there") {
			t.Fatalf("fetch of a missing object = %v", err)
		}
	})
}

func TestFetchStoreUnreachable(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s := b.unreachable(t)
			o := Object{Digest: digestOfBytes([]byte("x")), Size: 1}
			err := Fetch(context.Background(), s, o, filepath.Join(t.TempDir(), "x"), nil)
			if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), s.String()) || !strings.Contains(err.Error(), b.hint) {
				t.Fatalf("fetch from an absent store = %v", err)
			}
		})
	}
}

func TestConcurrentFetchesOfTheSameFile(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s Store) {
		b := content(t, 6<<20)
		o := put(t, s, b)
		dst := filepath.Join(t.TempDir(), "rootfs.ext4")
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = Fetch(context.Background(), s, o, dst, nil)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mustRead(t, dst), b) {
			t.Fatal("fetched file differs from the object")
		}
	})
}
