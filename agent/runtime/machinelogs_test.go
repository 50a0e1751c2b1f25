package runtime

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Past the quota, whole Instances' log tails go, oldest first, never the
// one just copied; within it nothing goes.
func TestPruneMachineLogs(t *testing.T) {
	root := t.TempDir()
	base := time.Now().Add(-time.Hour)
	put := func(id string, age time.Duration, size int) {
		t.Helper()
		dir := filepath.Join(root, id)
		os.MkdirAll(dir, 0o700)
		for _, name := range []string{"console.log", "vmm.log"} {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
				t.Fatal(err)
			}
			os.Chtimes(p, base.Add(-age), base.Add(-age))
		}
	}
	put("old", 3*time.Minute, 100)    // 200 bytes
	put("older", 5*time.Minute, 100)  // 200 bytes
	put("new", time.Minute, 100)      // 200 bytes
	put("fresh", 10*time.Minute, 100) // oldest files, but just copied
	left := func() []string {
		es, _ := os.ReadDir(root)
		var out []string
		for _, e := range es {
			out = append(out, e.Name())
		}
		return out
	}
	if n, _, err := pruneMachineLogs(root, 800, ""); err != nil || n != 0 {
		t.Fatalf("within the quota: removed %d, %v", n, err)
	}
	n, freed, err := pruneMachineLogs(root, 450, "fresh")
	if err != nil || n != 2 || freed != 400 {
		t.Fatalf("over the quota: removed %d (%d bytes), %v; want the two oldest but the kept one", n, freed, err)
	}
	if got := left(); !slices.Equal(got, []string{"fresh", "new"}) {
		t.Errorf("left %v, want fresh (kept) and new", got)
	}
	if n, _, err := pruneMachineLogs(filepath.Join(root, "missing"), 1, ""); err != nil || n != 0 {
		t.Errorf("missing directory: %d, %v", n, err)
	}
}
