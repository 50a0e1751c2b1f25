package artifacts

import (
	"bytes"
	"context"
	"path/filepath"
	"syscall"
	"testing"
)

// A mostly-zero object (a template image: the room a Workspace gets,
// barely written) costs the directory store and the fetching node only its
// data blocks, reads back byte for byte, keeps its digest, and a fetch
// interrupted inside a hole continues to the same bytes.
func TestSparseObjects(t *testing.T) {
	b := make([]byte, 32<<20)
	copy(b, content(t, 1<<20))             // files at the start
	copy(b[17<<20+123:], content(t, 5000)) // a few, unaligned, in the middle
	b[len(b)-holeBlock-1] = 1              // and one byte before a trailing hole
	forEachBackend(t, func(t *testing.T, s Store) {
		o := put(t, s, b)
		if o.Digest != digestOfBytes(b) || o.Size != int64(len(b)) {
			t.Fatalf("Put = %+v", o)
		}
		if d, ok := s.(*Dir); ok {
			if used := allocated(t, d.object(o.Digest).at); used > 4<<20 {
				t.Errorf("the store's copy of a 32 MiB object with 1 MiB of data uses %d bytes of disk", used)
			}
		}
		dst := filepath.Join(t.TempDir(), "image")
		cut := &breaking{Store: s, limit: 20 << 20} // lost inside the hole after the middle's data
		if err := Fetch(context.Background(), cut, o, dst, nil); err == nil {
			t.Fatal("a fetch whose connection was lost succeeded")
		}
		cut.limit = -1
		if err := Fetch(context.Background(), cut, o, dst, nil); err != nil {
			t.Fatal(err)
		}
		if got := mustRead(t, dst); !bytes.Equal(got, b) {
			t.Fatalf("fetched %d bytes that differ from the object's %d", len(got), len(b))
		}
		if used := allocated(t, dst); used > 4<<20 {
			t.Errorf("the fetched copy of a 32 MiB object with 1 MiB of data uses %d bytes of disk", used)
		}
	})
}

// allocated is the disk space the file at p uses.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
