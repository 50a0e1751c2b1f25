package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// artifacts gc removes the objects no catalog entry references any more
// (a template's earlier build, once it was published again; a deleted
// template's image), only once older than --older-than (default a day),
// lists without removing under --dry-run, and keeps what the catalog
// references.
func TestArtifactsGC(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	store := t.TempDir()
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, Artifacts: store})
	n2 := e.c.Members[1]
	publish := func(version string) string {
		t.Helper()
		src := t.TempDir() // builds are reproducible: another file, another image
		os.WriteFile(filepath.Join(src, "version"), []byte(version), 0o644)
		if _, err := template.Build(context.Background(), template.Options{StorageRoot: n2.Dir.StorageRoot(), Name: "gc-me", FromDir: src, SizeMiB: 8}); err != nil {
			t.Fatal(err)
		}
		clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
			n2.Agent.PushReport()
			n, err := e.c.Node(e.c.Members[0], "node-2")
			return err == nil && len(n.Report.Templates) == 1, "template not reported yet"
		})
		e.mustRun("template", "publish", "gc-me")
		return e.catalogEntry("gc-me").Digest
	}
	inStore := func(d string) bool {
		_, err := os.Stat(filepath.Join(store, "objects", "sha256", strings.TrimPrefix(d, "sha256:")))
		return err == nil
	}
	first := publish("1")
	second := publish("2")
	if first == second || !inStore(first) || !inStore(second) {
		t.Fatalf("two builds published: %s and %s, in the store %v %v", first, second, inStore(first), inStore(second))
	}

	if out := e.mustRun("artifacts", "gc"); !strings.Contains(out, first[:19]) || !strings.Contains(out, api.GCKeptYoung) || strings.Contains(out, second[:19]) {
		t.Fatalf("gc of a fresh earlier build: %q, want it kept as too young and the published one not listed", out)
	}
	if out := e.mustRun("artifacts", "gc", "--dry-run", "--older-than", "0s", "-q"); out != first+"\n" || !inStore(first) {
		t.Fatalf("gc --dry-run: %q (still in the store: %v)", out, inStore(first))
	}
	if out := e.mustRun("artifacts", "gc", "--older-than", "0s", "-q"); out != first+"\n" || inStore(first) || !inStore(second) {
		t.Fatalf("gc: %q; earlier build in the store: %v, published one: %v", out, inStore(first), inStore(second))
	}
	if out := e.mustRun("artifacts", "gc", "--older-than", "0s", "-q"); out != "" {
		t.Fatalf("gc again: %q, want nothing", out)
	}
	e.expectExit(api.ExitInvalidArgument, "is negative", "artifacts", "gc", "--older-than=-1s")

	e.mustRun("template", "delete", "gc-me")
	if out := e.mustRun("artifacts", "gc", "--older-than", "0s", "-q"); out != second+"\n" || inStore(second) {
		t.Fatalf("gc after the template's delete: %q (still in the store: %v)", out, inStore(second))
	}
}
