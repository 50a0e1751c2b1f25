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
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// An archive is untrusted: its layer is re-pointed at this node's build
// of the template, a Volume image that refers to another file (which
// qemu-img would read into the Workspace) is refused, so is a member that
// is not part of a Transfer and a layer over another build; nothing stays
// staged.
func TestImportTransferChecksTheArchive(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	testenv.LookPath(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	store, err := artifacts.NewDir(filepath.Join(dir, "store"), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "motd"), []byte("hello\n"), 0o644)
	tpl, err := template.Build(context.Background(), template.Options{StorageRoot: filepath.Join(dir, "tpl"), Name: "solo", FromDir: src, SizeMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	qemuImgT := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v %s", args, err, out)
		}
	}
	layer := filepath.Join(dir, "layer.qcow2")
	qemuImgT("create", "-q", "-u", "-f", "qcow2", "-F", "raw", "-b", "/elsewhere/rootfs.ext4", layer, "8M")
	vol := filepath.Join(dir, "vol.qcow2")
	qemuImgT("create", "-q", "-f", "qcow2", vol, "16M")
	sneaky := filepath.Join(dir, "sneaky.qcow2")
	qemuImgT("create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/shadow", sneaky, "16M")

	id := "tr-" + strings.Repeat("a", 26)
	manifest := api.TransferManifest{FormatVersion: api.TransferFormat, TransferID: id,
		Shape: api.TransferShape{Template: "solo", TemplateID: tpl.ID, CPU: 1000, MemoryBytes: 256 << 20, Volumes: []api.TransferVolume{{Path: "/data", SizeBytes: 16 << 20}}}}
	publish := func(members ...archiveMember) *api.WorkspaceImport {
		var buf bytes.Buffer
		if err := writeTransferArchive(&buf, manifest, members); err != nil {
			t.Fatal(err)
		}
		key := api.TransferArchiveKey("default", id)
		o, err := store.PutNamed(context.Background(), key, &buf)
		if err != nil {
			t.Fatal(err)
		}
		return &api.WorkspaceImport{TransferID: id, Key: key, Digest: string(o.Digest), SizeBytes: o.Size, TemplateID: tpl.ID}
	}
	a := &Agent{cfg: Config{NodeID: "node-b", DataDir: datadir.Dir(filepath.Join(dir, "data")), Artifacts: store}, log: slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))}
	staging := filepath.Join(DefaultPoolPath(a.cfg.DataDir), stagingDir)
	try := func(imp *api.WorkspaceImport) (*imported, string, error) {
		ws := "ws-" + strings.Repeat("b", 26)
		dst, _ := a.layerPath("", ws)
		os.Remove(dst)
		im, err := a.importTransfer(context.Background(), api.WorkspaceTask{WorkspaceID: ws, Import: imp}, tpl, dst)
		return im, dst, err
	}
	for name, c := range map[string]struct {
		members []archiveMember
		want    string
	}{
		"volume with a backing file": {[]archiveMember{{transferLayerName, layer}, {"volumes/0.qcow2", sneaky}}, "refers to another file"},
		"a stranger":                 {[]archiveMember{{transferLayerName, layer}, {"../../etc/passwd", vol}}, "not part of a Transfer"},
		"a volume too many":          {[]archiveMember{{transferLayerName, layer}, {"volumes/1.qcow2", vol}}, "beyond its 1 Volumes"},
		"no layer":                   {[]archiveMember{{"volumes/0.qcow2", vol}}, "holds no layer.qcow2"},
	} {
		_, _, err := try(publish(c.members...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if ents, _ := os.ReadDir(staging); len(ents) != 0 {
			t.Errorf("%s: %d files left in staging", name, len(ents))
		}
	}
	other := publish(archiveMember{transferLayerName, layer})
	other.TemplateID = "sha256-" + strings.Repeat("f", 64)
	if _, _, err := try(other); err == nil || !strings.Contains(err.Error(), "publish the build it was made with") {
		t.Errorf("another build: %v", err)
	}

	// A manifest with the largest environment a Workspace may have,
	// several times that size escaped in JSON, is read whole.
	v := strings.Repeat("\x01", api.MaxWorkspaceEnvBytes/2-8)
	manifest.Env, manifest.FormatVersion = []string{"A=" + v, "B=" + v}, api.TransferFormatEnv
	im, dst, err := try(publish(archiveMember{transferLayerName, layer}, archiveMember{"volumes/0.qcow2", vol}))
	if err != nil {
		t.Fatal(err)
	}
	defer im.cleanup()
	info, err := qcowInfo(context.Background(), dst)
	if err != nil || info.BackingFilename != tpl.Image() {
		t.Fatalf("imported layer %+v, %v; want it over %s", info, err, tpl.Image())
	}
	if staged := im.volumes["/data"]; staged == "" || !strings.HasPrefix(filepath.Base(staged), ".node-b.import-0-") {
		t.Fatalf("staged volumes %v", im.volumes)
	}
}
