package runtime

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// The ring never holds more than the cap on disk and always the newest
// half of it, whatever the write sizes.
func TestConsoleRingCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	const cap = 64 << 10
	r, err := openConsoleRing(path, cap)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var all bytes.Buffer
	for i := range 5000 {
		line := []byte(fmt.Sprintf("line %d %s\n", i, bytes.Repeat([]byte("x"), i%97)))
		if i == 4000 {
			line = bytes.Repeat([]byte("B"), 100<<10) // one write larger than the cap
		}
		all.Write(line)
		if _, err := r.Write(line); err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, p := range []string{path, path + ".1"} {
			if st, err := os.Stat(p); err == nil {
				total += st.Size()
			}
		}
		if total > cap {
			t.Fatalf("after write %d: %d bytes on disk, cap %d", i, total, cap)
		}
	}
	tail, err := readConsoleTail(path, cap/2)
	if err != nil {
		t.Fatal(err)
	}
	if want := all.Bytes()[all.Len()-cap/2:]; !bytes.Equal(tail, want) {
		t.Errorf("tail of %d bytes is not the last %d written", len(tail), cap/2)
	}
}
