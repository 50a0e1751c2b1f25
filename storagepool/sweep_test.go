package storagepool

import (
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

// tree makes files (paths relative to root) and returns root.
func tree(t *testing.T, files ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func left(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return nil
	})
	sort.Strings(out)
	return out
}

// The seed's table: local directories and standalone pools lose every
// temporary file, a shared pool only this node's; real files always stay.
func TestSweepByLocationAndPrefix(t *testing.T) {
	files := []string{
		"volumes/data/vol-1.raw",
		"volumes/data/.node-a.import-1438876543.tmp",
		"volumes/data/.node-b.import-2222222222.tmp",
		"volumes/data/.node-a.move-vol-06gdxke0wxw4xezwfa185wp24w-2004318071.tmp",
		"volumes/data/.import-1438876543.tmp", // an older release: no node id
		"layers/ws-1.qcow2",
		"layers/.node-ab.layer-ws-2-1.tmp", // another node whose id starts like ours
	}
	shared := tree(t, files...)
	n, err := SweepPool(shared, true, "node-a")
	if err != nil || n != 2 {
		t.Errorf("shared pool: swept %d, %v; want node-a's 2", n, err)
	}
	if got, want := left(t, shared), []string{
		"layers/.node-ab.layer-ws-2-1.tmp", "layers/ws-1.qcow2",
		"volumes/data/.import-1438876543.tmp", "volumes/data/.node-b.import-2222222222.tmp", "volumes/data/vol-1.raw",
	}; !slices.Equal(got, want) {
		t.Errorf("shared pool keeps %v, want %v", got, want)
	}

	standalone := tree(t, files...)
	if n, err := SweepPool(standalone, false, "node-a"); err != nil || n != 5 {
		t.Errorf("standalone pool: swept %d, %v; want all 5", n, err)
	}
	if got := left(t, standalone); !slices.Equal(got, []string{"layers/ws-1.qcow2", "volumes/data/vol-1.raw"}) {
		t.Errorf("standalone pool keeps %v", got)
	}

	local := tree(t, "registry/.record-2826134621.tmp", "registry/inst-1.json", "runtime/instances/i/.launch.json-ab12.tmp", "runtime/instances/i/launch.json")
	if n, err := SweepLocal(filepath.Join(local, "registry"), filepath.Join(local, "runtime"), filepath.Join(local, "missing")); err != nil || n != 2 {
		t.Errorf("local: swept %d, %v", n, err)
	}
	if got := left(t, local); !slices.Equal(got, []string{"registry/inst-1.json", "runtime/instances/i/launch.json"}) {
		t.Errorf("local keeps %v", got)
	}
	if _, err := SweepPool(shared, true, ""); err == nil {
		t.Error("a shared pool was swept without a node id")
	}
}

// A sweep follows no symbolic link and stops at the depth bound.
func TestSweepBounds(t *testing.T) {
	outside := tree(t, ".x.tmp")
	root := tree(t, "a/b/c/d/e/.deep.tmp", "a/.shallow.tmp")
	os.Symlink(outside, filepath.Join(root, "link"))
	if n, err := SweepPool(root, false, "node-a"); err != nil || n != 1 {
		t.Errorf("swept %d, %v; want the shallow one only", n, err)
	}
	if got := left(t, outside); !slices.Equal(got, []string{".x.tmp"}) {
		t.Errorf("a sweep went through a link: %v", got)
	}
}
