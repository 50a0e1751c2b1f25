package template

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testenv"
)

func requireMkfs(t *testing.T) {
	t.Helper()
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	testenv.LookPath(t, "debugfs", "e2fsprogs")
}

func tree(t *testing.T) string {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc", "kibotos-template"), []byte("coding\n"), 0o644)
	os.Symlink("etc/kibotos-template", filepath.Join(dir, "marker"))
	return dir
}

// debugfsCat reads a file out of an ext4 image without mounting it.
func debugfsCat(t *testing.T, img, path string) string {
	out, err := exec.Command("debugfs", "-R", "cat "+path, img).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v", path, err)
	}
	return string(out)
}

func TestBuildFromDirAndTarSameContentSameID(t *testing.T) {
	requireMkfs(t)
	root := t.TempDir()
	ctx := context.Background()
	src := tree(t)
	a, err := Build(ctx, Options{StorageRoot: root, Name: "kibotos-coding", FromDir: src})
	if err != nil {
		t.Fatal(err)
	}
	if got := debugfsCat(t, a.Image(), "/etc/kibotos-template"); got != "coding\n" {
		t.Fatalf("image content %q", got)
	}
	again, err := Build(ctx, Options{StorageRoot: root, Name: "kibotos-coding", FromDir: src})
	if err != nil || again.ID != a.ID || again.CreatedAt != a.CreatedAt {
		t.Fatalf("rebuild of the same content: %+v, %v; want the same template reused", again, err)
	}
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if b, err := exec.Command("tar", "-cf", tarball, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	fromTar, err := Build(ctx, Options{StorageRoot: root, Name: "kibotos-coding", FromTar: tarball})
	if err != nil || fromTar.ID != a.ID {
		t.Fatalf("same tree from a tarball: %+v, %v; want id %s", fromTar, err, a.ID)
	}
	os.WriteFile(filepath.Join(src, "etc", "kibotos-template"), []byte("changed\n"), 0o644)
	b, err := Build(ctx, Options{StorageRoot: root, Name: "kibotos-coding", FromDir: src})
	if err != nil || b.ID == a.ID {
		t.Fatalf("changed content: %+v, %v; want a new id", b, err)
	}
	if got, _ := Get(root, "kibotos-coding"); got == nil || got.ID != b.ID {
		t.Fatalf("Get returns %+v, want the newest build %s", got, b.ID)
	}
	if l, _ := List(root); len(l) != 2 {
		t.Fatalf("List: %d templates, want 2", len(l))
	}
	if n, err := Delete(root, "kibotos-coding"); n != 2 || err != nil {
		t.Fatalf("Delete: %d, %v", n, err)
	}
	if _, err := Get(root, "kibotos-coding"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("Get after delete: %v", err)
	}
	if left, _ := os.ReadDir(Dir(root)); len(left) != 0 {
		t.Fatalf("left in %s: %v", Dir(root), left)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	requireMkfs(t)
	root := t.TempDir()
	for _, o := range []Options{
		{Name: "Bad Name", FromDir: "/"},
		{Name: "x"},
		{Name: "x", FromDir: "/", FromTar: "/x.tar"},
		{Name: "x", FromTar: "/does/not/exist.tar"},
	} {
		o.StorageRoot = root
		if _, err := Build(context.Background(), o); err == nil {
			t.Errorf("Build(%+v) succeeded", o)
		}
	}
	if left, _ := os.ReadDir(Dir(root)); len(left) != 0 {
		t.Fatalf("failed builds left %v", left)
	}
}

// The image digest recorded at publish or fetch comes back with the
// template; a damaged digest file reads as none (no verified copy).
func TestImageDigestRecord(t *testing.T) {
	requireMkfs(t)
	root := t.TempDir()
	tp, err := Build(context.Background(), Options{StorageRoot: root, Name: "kibotos-coding", FromDir: tree(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.SetImageDigest("sha256:../../etc"); err == nil {
		t.Fatal("a digest that is not one was recorded")
	}
	d := "sha256:" + strings.Repeat("ab", 32)
	if err := tp.SetImageDigest(d); err != nil {
		t.Fatal(err)
	}
	if got, err := Get(root, "kibotos-coding"); err != nil || got.ImageDigest != d {
		t.Fatalf("loaded digest %q, %v", got.ImageDigest, err)
	}
	p := filepath.Join(tp.Dir, ImageDigestFile)
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("sha256:zz\n"), 0o600)
	if got, err := Get(root, "kibotos-coding"); err != nil || got.ImageDigest != "" {
		t.Fatalf("damaged digest file read as %q, %v", got.ImageDigest, err)
	}
}
