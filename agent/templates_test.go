package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// published builds a template elsewhere, puts its image into store and
// returns the catalog entry and the image bytes.
func published(t *testing.T, store artifacts.Store, name string) (api.TemplateImage, []byte) {
	t.Helper()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "motd"), []byte("hello\n"), 0o644)
	tp, err := template.Build(context.Background(), template.Options{StorageRoot: t.TempDir(), Name: name, FromDir: src, SizeMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(tp.Image())
	if err != nil {
		t.Fatal(err)
	}
	o, err := store.Put(context.Background(), bytes.NewReader(img), "")
	if err != nil {
		t.Fatal(err)
	}
	return api.TemplateImage{Name: name, TemplateID: tp.ID, Digest: string(o.Digest), SizeBytes: o.Size, ImageFormat: api.ImageFormatExt4}, img
}

// A start of a template the node lacks fetches the published image from
// the artifact store, logs its progress, installs it as a template of its
// own and reports holding it; an unreachable store is a refusal (ctrl
// places elsewhere), a damaged object an error naming it.
func TestTemplateFetchOnStart(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	dir := t.TempDir()
	store, err := artifacts.NewDir(filepath.Join(dir, "store"), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	img, want := published(t, store, "solo")
	var logs bytes.Buffer
	a := recording(t, &Agent{cfg: Config{NodeID: "node-b", DataDir: datadir.Dir(filepath.Join(dir, "data")), Artifacts: store}, log: slog.New(slog.NewTextHandler(&logs, nil))})

	if _, _, err := a.templateFor(context.Background(), api.WorkspaceTask{Template: "solo"}); err == nil || !strings.Contains(err.Error(), "kibo template publish solo") {
		t.Fatalf("unpublished template: %v", err)
	}
	tp, refusal, err := a.templateFor(context.Background(), api.WorkspaceTask{Template: "solo", Published: &img})
	if err != nil || refusal != "" {
		t.Fatalf("fetch: %q, %v", refusal, err)
	}
	got, err := os.ReadFile(tp.Image())
	if err != nil || !bytes.Equal(got, want) || tp.ID != img.TemplateID || tp.ImageDigest != img.Digest {
		t.Fatalf("installed template %+v: %v", tp, err)
	}
	for _, line := range []string{"template fetch started", "template fetch progress", "template fetched"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("node log lacks %q:\n%s", line, logs.String())
		}
	}
	if l := a.templateNames(); len(l.digests) != 1 || l.digests[0] != img.Digest || len(l.names) != 1 {
		t.Fatalf("report after the fetch: %+v", l)
	}
	if entries, _ := os.ReadDir(template.Dir(a.cfg.DataDir.StorageRoot())); len(entries) != 1 {
		t.Fatalf("templates/ holds %v, want the installed template alone", entries)
	}

	// Another node: the store is not mounted there.
	unmounted, _ := artifacts.NewDir(filepath.Join(dir, "not-mounted"), "node-c")
	c := recording(t, &Agent{cfg: Config{NodeID: "node-c", DataDir: datadir.Dir(filepath.Join(dir, "c")), Artifacts: unmounted}, log: slog.New(slog.DiscardHandler)})
	if _, refusal, err := c.templateFor(context.Background(), api.WorkspaceTask{Template: "solo", Published: &img}); err != nil || !strings.Contains(refusal, "template solo could not be fetched") || !strings.Contains(refusal, "mounted") {
		t.Fatalf("unreachable store: refusal %q, %v", refusal, err)
	}
	c.cfg.Artifacts = nil
	if _, refusal, _ := c.templateFor(context.Background(), api.WorkspaceTask{Template: "solo", Published: &img}); !strings.Contains(refusal, "no artifact store") {
		t.Fatalf("no store: refusal %q", refusal)
	}

	// A damaged object is never installed.
	p := filepath.Join(dir, "store", "objects", "sha256", strings.TrimPrefix(img.Digest, "sha256:"))
	os.Chmod(p, 0o600)
	want[len(want)/2] ^= 1
	os.WriteFile(p, want, 0o600)
	d := recording(t, &Agent{cfg: Config{NodeID: "node-d", DataDir: datadir.Dir(filepath.Join(dir, "d")), Artifacts: store}, log: slog.New(slog.DiscardHandler)})
	if _, _, err := d.templateFor(context.Background(), api.WorkspaceTask{Template: "solo", Published: &img}); err == nil || !strings.Contains(err.Error(), img.Digest) {
		t.Fatalf("damaged object: %v", err)
	}
	if _, err := template.Get(d.cfg.DataDir.StorageRoot(), "solo"); err == nil {
		t.Fatal("a damaged object was installed")
	}
	if entries, _ := os.ReadDir(template.Dir(d.cfg.DataDir.StorageRoot())); len(entries) != 0 {
		t.Fatalf("a refused fetch left %v", entries)
	}
}
