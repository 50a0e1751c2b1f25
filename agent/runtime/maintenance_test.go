package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/storagepool"
)

// check-maintenance remove: a Volume file blocks it like a layer does, in
// a standalone pool always, in a shared one only while its holder record
// names this node.
func TestHeldItemsVolumes(t *testing.T) {
	standalone, shared := t.TempDir(), t.TempDir()
	vol := func(pool, name, holder string) string {
		dir := filepath.Join(pool, "volumes", "data")
		os.MkdirAll(dir, 0o700)
		p := filepath.Join(dir, name)
		os.WriteFile(p, nil, 0o600)
		if holder != "" {
			if err := storagepool.WriteHolder(p, storagepool.Holder{NodeID: holder, Grant: "i-1"}); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	mine := vol(standalone, "vol-1.img", "")
	held := vol(shared, "vol-2.img", "node-a")
	vol(shared, "vol-3.img", "node-b")
	vol(shared, "vol-4.img", "")
	os.WriteFile(filepath.Join(standalone, "volumes", "data", ".node-a.import-1.tmp"), nil, 0o600)
	items := heldItems(Config{NodeID: "node-a", Pools: []PoolDir{{ID: "p1", Path: standalone}, {ID: "p2", Path: shared, Shared: true}}})
	var got []string
	for _, it := range items {
		if !it.Blocking || it.State != "volume" || !strings.Contains(it.Detail, "Volume file in pool") {
			t.Errorf("item %+v", it)
		}
		got = append(got, it.Object)
	}
	if strings.Join(got, " ") != mine+" "+held {
		t.Errorf("blocking volume files %v; want %s (standalone) and %s (holder names this node)", got, mine, held)
	}
}
