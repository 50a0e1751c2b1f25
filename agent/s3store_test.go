package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/s3test"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/template"
)

// The S3 path of the artifact store, node to node, as members open it
// from [artifacts]: node-a publishes a template and exports a stopped
// Workspace (its layer and a Volume with a file) into the bucket; node-b
// fetches the template and imports the Transfer: the same image bytes,
// its layer over its own copy of the template, the Volume's file as it
// was.
func TestNodesThroughAnS3Store(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	testenv.LookPath(t, "qemu-img", "qemu-utils")
	testenv.LookPath(t, "debugfs", "e2fsprogs")
	srv := s3test.Start(t)
	open := func(node string) artifacts.Store {
		s, err := artifacts.Open(artifacts.Config{URL: srv.URL("kibotos"), Endpoint: srv.Endpoint, CredentialsFile: srv.CredentialsFile}, node)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dir := t.TempDir()
	agentOf := func(node string) *Agent {
		return recording(t, &Agent{cfg: Config{NodeID: node, DataDir: datadir.Dir(filepath.Join(dir, node)), Artifacts: open(node)}, log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))})
	}
	a, b := agentOf("node-a"), agentOf("node-b")
	ctx := context.Background()

	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "motd"), []byte("hello\n"), 0o644)
	tpl, err := template.Build(ctx, template.Options{StorageRoot: a.cfg.DataDir.StorageRoot(), Name: "solo", FromDir: src, SizeMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	img, err := a.PublishTemplate(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	got, refusal, err := b.templateFor(ctx, api.WorkspaceTask{Template: "solo", Published: &img})
	if err != nil || refusal != "" {
		t.Fatalf("fetch over S3: %q %v", refusal, err)
	}
	if want, _ := os.ReadFile(tpl.Image()); !bytes.Equal(mustReadFile(t, got.Image()), want) {
		t.Fatal("the fetched image differs from the published one")
	}

	ws := "ws-" + strings.Repeat("c", 26)
	layer, _ := a.layerPath("", ws)
	os.MkdirAll(filepath.Dir(layer), 0o700)
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", tpl.Image(), layer).CombinedOutput(); err != nil {
		t.Fatalf("layer: %v %s", err, out)
	}
	volID := "vol-" + strings.Repeat("d", 26)
	volPath, err := a.volumePath("", volID)
	if err != nil {
		t.Fatal(err)
	}
	if err := storagepool.CreateVolume(ctx, "node-a", volPath, 16<<20); err != nil {
		t.Fatal(err)
	}
	note := filepath.Join(t.TempDir(), "note")
	os.WriteFile(note, []byte("written on node-a\n"), 0o644)
	if out, err := exec.Command("debugfs", "-w", "-R", "write "+note+" note", volPath).CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v %s", err, out)
	}
	id := "tr-" + strings.Repeat("e", 26)
	shape := api.TransferShape{Template: "solo", CPU: 1000, MemoryBytes: 256 << 20, Volumes: []api.TransferVolume{{Path: "/data", SizeBytes: 16 << 20}}}
	res, err := a.ExportTransfer(ctx, api.TransferExportTask{TransferID: id, WorkspaceID: ws, Namespace: "default", Volumes: []api.TaskVolume{{VolumeID: volID, Path: "/data", SizeBytes: 16 << 20}}, Shape: shape})
	if err != nil {
		t.Fatal(err)
	}
	if res.TemplateID != tpl.ID {
		t.Fatalf("export names template build %q, want %s", res.TemplateID, tpl.ID)
	}

	wsB := "ws-" + strings.Repeat("f", 26)
	layerB, _ := b.layerPath("", wsB)
	imp := &api.WorkspaceImport{TransferID: id, Key: api.TransferArchiveKey("default", id), Digest: res.Digest, SizeBytes: res.SizeBytes, TemplateID: res.TemplateID}
	im, err := b.importTransfer(ctx, api.WorkspaceTask{WorkspaceID: wsB, Import: imp}, got, layerB)
	if err != nil {
		t.Fatal(err)
	}
	defer im.cleanup()
	if info, err := qcowInfo(ctx, layerB); err != nil || info.BackingFilename != got.Image() {
		t.Fatalf("imported layer %+v %v; want it over node-b's %s", info, err, got.Image())
	}
	volB := filepath.Join(t.TempDir(), "vol.img")
	if err := storagepool.ImportVolume(ctx, "node-b", volB, 16<<20, im.volumes["/data"]); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("debugfs", "-R", "cat note", volB).Output()
	if err != nil || string(out) != "written on node-a\n" {
		t.Fatalf("the Volume's file after the import: %q %v", out, err)
	}
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
