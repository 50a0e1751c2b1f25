package template

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// member is one entry of a test layer.
type member struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func file(name, body string) member {
	return member{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string) member { return member{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeSymlink}
}
func hardlink(name, target string) member {
	return member{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

// layerTar is the tar of the members, written as they are: names are not
// cleaned, so a test can write what a hostile image would.
func layerTar(t *testing.T, members ...member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range members {
		h := &tar.Header{Name: m.name, Linkname: m.link, Typeflag: m.typ, Mode: m.mode, Uid: m.uid, Gid: m.gid, ModTime: time.Unix(1_700_000_000, 0), Format: tar.FormatPAX}
		if m.typ == tar.TypeReg {
			h.Size = int64(len(m.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, m.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layer(t *testing.T, members ...member) v1.Layer {
	t.Helper()
	b := layerTar(t, members...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func image(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

var testConfig = v1.Config{Env: []string{"PATH=/usr/bin:/bin", "GREETING=hello from the image"}, WorkingDir: "/app", User: "app"}

// testImage has a second layer that deletes a file with a whiteout,
// hides a directory's lower content with an opaque marker, and adds a
// file in a directory whose entry comes only in the lower layer.
func testImage(t *testing.T) v1.Image {
	owned := file("app/owned.txt", "mine\n")
	owned.uid, owned.gid, owned.mode = 1000, 1000, 0o640
	return image(t, testConfig,
		layer(t, dir("app/"), file("app/a.txt", "alpha\n"), file("app/b.txt", "beta\n"), owned,
			symlink("app/link", "a.txt"), hardlink("app/hard", "app/a.txt"),
			dir("etc/"), file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"),
			dir("opq/"), file("opq/old.txt", "old\n")),
		layer(t, file("app/.wh.b.txt", ""), dir("opq/"), file("opq/.wh..wh..opq", ""), file("opq/new.txt", "new\n"),
			file("app/c.txt", "gamma\n")))
}

// debugfsList lists a directory of an ext4 image: name -> "mode uid gid".
func debugfsList(t *testing.T, img, path string) map[string]string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "ls -p "+path, img).Output()
	if err != nil {
		t.Fatalf("debugfs ls %s: %v", path, err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(strings.Trim(l, "/"), "/")
		if len(f) >= 5 && f[4] != "." && f[4] != ".." {
			got[f[4]] = f[1] + " " + f[2] + " " + f[3]
		}
	}
	return got
}

// checkTestImage checks a template built from testImage.
func checkTestImage(t *testing.T, tp *Template) {
	t.Helper()
	img := tp.Image()
	app := debugfsList(t, img, "/app")
	names := make([]string, 0, len(app))
	for n := range app {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := []string{"a.txt", "c.txt", "hard", "link", "owned.txt"}; !slices.Equal(names, want) {
		t.Errorf("/app holds %v, want %v (b.txt whited out)", names, want)
	}
	if app["owned.txt"] != "100640 1000 1000" {
		t.Errorf("/app/owned.txt is %q, want mode 100640 owned by 1000:1000", app["owned.txt"])
	}
	if got := debugfsCat(t, img, "/app/a.txt") + debugfsCat(t, img, "/app/c.txt") + debugfsCat(t, img, "/app/hard"); got != "alpha\ngamma\nalpha\n" {
		t.Errorf("contents %q", got)
	}
	if opq := debugfsList(t, img, "/opq"); len(opq) != 1 || opq["new.txt"] == "" {
		t.Errorf("/opq holds %v, want only new.txt (opaque whiteout)", opq)
	}
	if got := debugfsList(t, img, "/etc/kibotos")["image-config.json"]; got != "100644 0 0" {
		t.Errorf("image-config.json is %q, want mode 100644 owned by root", got)
	}
	var ic guestproto.ImageConfig
	if err := json.Unmarshal([]byte(debugfsCat(t, img, guestproto.ImageConfigPath)), &ic); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ic.Env, testConfig.Env) || ic.WorkingDir != "/app" || ic.User != "app" {
		t.Errorf("image config %+v, want %+v", ic, testConfig)
	}
}

// writeLayoutArchive writes img as an OCI image layout and tars it.
func writeLayoutArchive(t *testing.T, img v1.Image, refName string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": refName})); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "app-oci.tar")
	if b, err := exec.Command("tar", "-cf", archive, "-C", dir, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	return archive
}

func TestBuildOCIFromDockerSaveAndLayout(t *testing.T) {
	requireMkfs(t)
	root := t.TempDir()
	ctx := context.Background()
	img := testImage(t)

	saved := filepath.Join(t.TempDir(), "app.tar")
	if err := tarball.WriteToFile(saved, name.MustParseReference("example.com/app:1"), img); err != nil {
		t.Fatal(err)
	}
	var last OCIProgress
	fromSave, err := BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "app", File: saved, Progress: func(p OCIProgress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, fromSave)
	if fromSave.Source != "oci:"+saved {
		t.Errorf("source %q", fromSave.Source)
	}
	if last.Layers != 2 || last.LayersDone != 2 || last.Bytes == 0 {
		t.Errorf("last progress %+v, want 2 of 2 layers done", last)
	}

	fromLayout, err := BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", File: writeLayoutArchive(t, img, "1")})
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, fromLayout)
	if fromLayout.ID != fromSave.ID {
		t.Fatalf("the same image as an OCI layout is template %s, as a docker save tarball %s", fromLayout.ID, fromSave.ID)
	}
	if left, _ := filepath.Glob(filepath.Join(Dir(root), ".oci-*")); len(left) != 0 {
		t.Fatalf("build left %v", left)
	}
}

// A file of several images needs --oci-ref, and the error lists them.
func TestBuildOCIPicksAnImage(t *testing.T) {
	requireMkfs(t)
	root := t.TempDir()
	ctx := context.Background()
	one := image(t, v1.Config{}, layer(t, file("which", "one\n")))
	two := image(t, v1.Config{}, layer(t, file("which", "two\n")))
	saved := filepath.Join(t.TempDir(), "both.tar")
	tags := map[name.Tag]v1.Image{name.MustParseReference("app:1").(name.Tag): one, name.MustParseReference("app:2").(name.Tag): two}
	if err := tarball.MultiWriteToFile(saved, tags); err != nil {
		t.Fatal(err)
	}
	_, err := BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "app", File: saved})
	if err == nil || !strings.Contains(err.Error(), "holds 2 images") || !strings.Contains(err.Error(), "app:1") || !strings.Contains(err.Error(), "--oci-ref") {
		t.Fatalf("two images, no ref: %v", err)
	}
	tp, err := BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "app", File: saved, Ref: "app:2"})
	if err != nil || debugfsCat(t, tp.Image(), "/which") != "two\n" {
		t.Fatalf("--oci-ref app:2: %v", err)
	}
	if _, err := BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "app", File: saved, Ref: "app:3"}); err == nil || !strings.Contains(err.Error(), "no image tagged app:3") {
		t.Fatalf("--oci-ref app:3: %v", err)
	}

	gz := filepath.Join(t.TempDir(), "app.tar.gz")
	os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0}, 0o644)
	if _, err := BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "app", File: gz}); err == nil || !strings.Contains(err.Error(), "gzip-compressed") {
		t.Fatalf("a gzip file: %v", err)
	}
}

func TestBuildOCIFromRegistry(t *testing.T) {
	requireMkfs(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	img := testImage(t)
	ref := host + "/app:1"
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(parsed, img); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tp, err := BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", Registry: ref})
	if err != nil {
		t.Fatal(err)
	}
	checkTestImage(t, tp)
	digest, _ := img.Digest()
	if want := "registry:" + ref + "@" + digest.String(); tp.Source != want {
		t.Errorf("source %q, want %q", tp.Source, want)
	}
	saved := filepath.Join(t.TempDir(), "app.tar")
	tarball.WriteToFile(saved, name.MustParseReference("app:1"), img)
	if fromFile, err := BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", File: saved}); err != nil || fromFile.ID != tp.ID {
		t.Fatalf("the same image from a file: %v, %v; want template %s", fromFile, err, tp.ID)
	}

	_, err = BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", Registry: host + "/app:2"})
	if !errors.Is(err, ErrImageNotFound) {
		t.Errorf("a tag the registry lacks: %v, want ErrImageNotFound", err)
	}
	closed := testenv.LoopbackAddr(t) // nothing listens
	_, err = BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", Registry: closed + "/app:1"})
	if !errors.Is(err, ErrImageUnavailable) || !strings.HasPrefix(err.Error(), "template app: ") {
		t.Errorf("a registry that is not there: %v, want ErrImageUnavailable", err)
	}
	if _, err := BuildOCI(ctx, OCIOptions{StorageRoot: t.TempDir(), Name: "app", Registry: "Not A Ref"}); err == nil || errors.Is(err, ErrImageUnavailable) {
		t.Errorf("a bad reference: %v", err)
	}
}

// Hostile layers: nothing lands outside the tree. Names climbing out are
// refused, absolute names are taken inside the tree, writes through a
// symbolic link of the layer are dropped by mutate.Extract (and contained
// by the unpacker, TestUnpackerContainsLinks), and hard links to host
// paths lead nowhere.
func TestBuildOCIContainsHostileLayers(t *testing.T) {
	requireMkfs(t)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host file\n"), 0o644)
	root := t.TempDir()
	ctx := context.Background()
	build := func(members ...member) (*Template, error) {
		t.Helper()
		saved := filepath.Join(t.TempDir(), "evil.tar")
		if err := tarball.WriteToFile(saved, name.MustParseReference("evil:1"), image(t, v1.Config{}, layer(t, members...))); err != nil {
			t.Fatal(err)
		}
		return BuildOCI(ctx, OCIOptions{StorageRoot: root, Name: "evil", File: saved})
	}
	if _, err := build(file("../evil", "x")); err == nil || !strings.Contains(err.Error(), "template evil: ") || !strings.Contains(err.Error(), "../evil") {
		t.Errorf("a member named ../evil: %v", err)
	}
	tp, err := build(file("/abs.txt", "abs\n"), symlink("toroot", "/"), file("toroot/etc/through.txt", "through\n"),
		symlink("out", outside), file("out/victim", "overwritten\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := debugfsCat(t, tp.Image(), "/abs.txt"); got != "abs\n" {
		t.Errorf("absolute name: %q, want it inside the image", got)
	}
	if _, err := build(symlink("out", outside), hardlink("stolen", "out/victim")); err == nil || !strings.Contains(err.Error(), "no such file in the image") {
		t.Errorf("a hard link through a link out of the tree: %v", err)
	}
	if _, err := build(hardlink("stolen", victim)); err == nil || !strings.Contains(err.Error(), "no such file in the image") {
		t.Errorf("a hard link to a host path: %v", err)
	}
	checkUntouched(t, outside, victim)
}

// checkUntouched fails unless outside holds only victim, as it was.
func checkUntouched(t *testing.T, outside, victim string) {
	t.Helper()
	if b, _ := os.ReadFile(victim); string(b) != "host file\n" {
		t.Errorf("the host file now holds %q", b)
	}
	if st, err := os.Stat(victim); err != nil || st.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("the host file has other links now: %v", err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("outside the tree: %v", entries)
	}
}

// The unpacker follows a symbolic link the archive made only inside the
// tree: a link to / is the tree's top, a link to a host directory is a
// path inside the tree that does not exist.
func TestUnpackerContainsLinks(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host file\n"), 0o644)
	unpack := func(members ...member) (string, error) {
		tree := t.TempDir()
		u, err := newUnpacker(tree, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		return tree, u.unpack(context.Background(), bytes.NewReader(layerTar(t, members...)))
	}
	tree, err := unpack(symlink("toroot", "/"), file("toroot/etc/through.txt", "through\n"), file("/abs.txt", "abs\n"))
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"etc/through.txt": "through\n", "abs.txt": "abs\n"} {
		if b, err := os.ReadFile(filepath.Join(tree, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", p, b, err)
		}
	}
	// Refused or written inside the tree; which does not matter as long
	// as the host's files stay as they were.
	for _, members := range [][]member{
		{symlink("out", outside), file("out/victim", "overwritten\n")},
		{symlink("out", outside), file("out/new", "new\n")},
		{symlink("out", outside), hardlink("stolen", "out/victim")},
		{symlink("victim", victim), file("victim", "overwritten\n")},
	} {
		unpack(members...)
	}
	tree, err = unpack(symlink("up", "../../../../../../.."), file("up"+victim, "overwritten\n"))
	if b, rerr := os.ReadFile(filepath.Join(tree, victim)); err != nil || string(b) != "overwritten\n" {
		t.Errorf("a write through a link climbing out: %v, %v; want it inside the tree", err, rerr)
	}
	checkUntouched(t, outside, victim)
}

// The unpacker alone: what mutate.Extract would filter out before it
// (names with ..) is refused by the unpacker too, and the bounds hold.
func TestUnpackerRefusesAndBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []member
		setup   func(u *unpacker)
		err     string
	}{
		{name: "dot-dot", members: []member{file("a/../../evil", "x")}, err: "climbs out of the tree"},
		{name: "too big", members: []member{file("big", strings.Repeat("x", 2<<20))}, setup: func(u *unpacker) { u.maxBytes = 1 << 20 }, err: "exceed 1 MiB: give a larger --size"},
		{name: "too many", members: []member{file("a", ""), file("b", ""), file("c", "")}, setup: func(u *unpacker) { u.maxMembers = 2 }, err: "more than 2 members"},
		{name: "device as non-root", members: []member{{name: "dev/null", typ: tar.TypeChar, mode: 0o666}}, setup: func(u *unpacker) { u.asRoot = false }, err: "only root may make"},
	} {
		tree := t.TempDir()
		u, err := newUnpacker(tree, 0)
		if err != nil {
			t.Fatal(err)
		}
		if tc.setup != nil {
			tc.setup(u)
		}
		err = u.unpack(context.Background(), bytes.NewReader(layerTar(t, tc.members...)))
		u.Close()
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(tree), "evil")); err == nil {
			t.Errorf("%s: wrote outside the tree", tc.name)
		}
	}
	if os.Geteuid() == 0 {
		tree := t.TempDir()
		u, _ := newUnpacker(tree, 0)
		defer u.Close()
		null := member{name: "dev/null", typ: tar.TypeChar, mode: 0o666}
		if err := u.unpack(context.Background(), bytes.NewReader(layerTar(t, null))); err != nil {
			t.Fatalf("a device node as root: %v", err)
		}
		if fi, err := os.Lstat(filepath.Join(tree, "dev/null")); err != nil || fi.Mode()&os.ModeCharDevice == 0 || fi.Mode().Perm() != 0o666 {
			t.Fatalf("dev/null: %v, %v", fi, err)
		}
	}
}

// Plain http goes to a loopback registry only.
func TestLoopbackHTTPOnly(t *testing.T) {
	rt := loopbackHTTPOnly{roundTripFunc(func(*http.Request) (*http.Response, error) { return &http.Response{StatusCode: 200}, nil })}
	for url, ok := range map[string]bool{
		"http://127.0.0.1:5000/v2/": true, "http://localhost:5000/v2/": true, "http://[::1]:5000/v2/": true,
		"https://10.0.0.5/v2/": true, "http://10.0.0.5:5000/v2/": false, "http://registry.local/v2/": false, "http://127.0.0.1.example.com/v2/": false,
	} {
		req, _ := http.NewRequest("GET", url, nil)
		if _, err := rt.RoundTrip(req); (err == nil) != ok {
			t.Errorf("%s: %v, want allowed %v", url, err, ok)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
