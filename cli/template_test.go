package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

func runCLI(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", args, nil, &out, &errb)
	return out.String(), errb.String(), code
}

func TestTemplateCommands(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	src, root := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(src, "etc"), 0o755)
	os.WriteFile(filepath.Join(src, "etc", "motd"), []byte("hello\n"), 0o644)

	out, errs, code := runCLI("template", "build", "kibotos-coding", "--from-dir", src, "--storage-root", root)
	if code != 0 || !strings.HasPrefix(out, "sha256-") {
		t.Fatalf("build: exit %d, %q %q", code, out, errs)
	}
	id := strings.TrimSpace(out)
	if out, _, code := runCLI("template", "list", "--storage-root", root); code != 0 || !strings.Contains(out, "kibotos-coding") || !strings.Contains(out, id[:19]) {
		t.Fatalf("list: %d %q", code, out)
	}
	if out, _, code := runCLI("template", "get", "kibotos-coding", "--storage-root", root, "--json"); code != 0 || !strings.Contains(out, `"id": "`+id+`"`) {
		t.Fatalf("get --json: %d %q", code, out)
	}
	if _, errs, code := runCLI("template", "get", "nope", "--storage-root", root); code != api.ExitNotFound || !strings.Contains(errs, "template nope not found") {
		t.Fatalf("get unknown: %d %q", code, errs)
	}
	if _, errs, code := runCLI("template", "build", "Bad Name", "--from-dir", src, "--storage-root", root); code != api.ExitInvalidArgument || !strings.Contains(errs, "not valid") {
		t.Fatalf("bad name: %d %q", code, errs)
	}
	if _, _, code := runCLI("template", "delete", "kibotos-coding", "--storage-root", root); code != 0 {
		t.Fatalf("delete: %d", code)
	}
	if out, _, _ := runCLI("template", "list", "--storage-root", root); strings.Contains(out, "kibotos-coding") {
		t.Fatalf("list after delete: %q", out)
	}
}

func TestTemplateBuildSourceFlags(t *testing.T) {
	src, root := t.TempDir(), t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"kibotos-coding"}, "give exactly one of --from-dir DIR, --from-tar FILE, --from-oci FILE, --from-registry REF, --debootstrap and --busybox"},
		{[]string{"kibotos-coding", "--from-registry", "localhost:5000/app:1", "--from-dir", src}, "give exactly one of"},
		{[]string{"kibotos-coding", "--from-registry", "localhost:5000/app:1", "--oci-ref", "app:1"}, "--oci-ref goes with --from-oci"},
		{[]string{"kibotos-coding", "--from-registry", "Not A Ref"}, "is not an image reference"},
		{[]string{"kibotos-coding", "--from-oci", "/dev/null"}, "neither a docker save tarball (manifest.json) nor an OCI image-layout archive"},
		{[]string{"kibotos-coding", "--busybox", "--debootstrap"}, "give exactly one of"},
		{[]string{"kibotos-coding", "--busybox", "--size", "2GiB"}, "--size goes with --from-dir, --from-tar, --from-oci, --from-registry or --debootstrap"},
		{[]string{"kibotos-coding", "--from-dir", src, "--debootstrap"}, "give exactly one of"},
		{[]string{"kibotos-coding", "--from-dir", src, "--suite", "trixie"}, "--suite, --mirror, --include, --variant, --user and --sudo go with --debootstrap"},
		{[]string{"kibotos-coding", "--from-oci", "/dev/null", "--user", "user"}, "go with --debootstrap"},
		{[]string{"kibotos-coding", "--busybox", "--sudo"}, "go with --debootstrap"},
		{[]string{"kibotos-coding", "--debootstrap", "--sudo"}, "sudo is for the default user: name one (--user NAME)"},
		{[]string{"kibotos-coding", "--debootstrap", "--user", "root", "--sudo"}, `user name "root" is a system account`},
		{[]string{"kibotos-coding", "--debootstrap", "--user", "John.Doe"}, `user name "John.Doe" is not valid`},
		{[]string{"kibotos-coding", "--from-dir", src, "--include", "git"}, "go with --debootstrap"},
		{[]string{"kibotos-coding", "--debootstrap", "--variant", "huge"}, "variant \"huge\" is not one of minbase, buildd, standard"},
		{[]string{"kibotos-coding", "--debootstrap", "--include", "git,Bad_Pkg"}, "\"Bad_Pkg\" is not a Debian package name"},
		{[]string{"kibotos-coding", "--debootstrap", "--mirror", "deb.debian.org/debian"}, "not an http, https or file URL"},
		{[]string{"Bad", "--debootstrap"}, "not valid"},
	} {
		args := append([]string{"template", "build", "--storage-root", root}, c.args...)
		_, errs, code := runCLI(args...)
		if code != api.ExitInvalidArgument || !strings.Contains(errs, c.want) || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit %d saying %q on one line", c.args, code, errs, api.ExitInvalidArgument, c.want)
		}
	}
}

// --busybox builds the template kibotos dev builds, on a host where only
// the package is installed (no kibotos dev), and lists it like any other.
func TestTemplateBuildBusybox(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	if _, err := os.Stat("/bin/busybox"); err != nil {
		testenv.Skipf(t, "missing /bin/busybox (Debian package busybox-static)")
	}
	root := t.TempDir()
	out, errs, code := runCLI("template", "build", "kibotos-base", "--busybox", "--storage-root", root)
	if code != 0 || !strings.HasPrefix(out, "sha256-") {
		t.Fatalf("template build --busybox: exit %d: %s%s", code, out, errs)
	}
	if out, _, _ := runCLI("template", "list", "--storage-root", root, "-q"); strings.TrimSpace(out) != "kibotos-base" {
		t.Fatalf("template list -q: %q", out)
	}
}

// --from-oci builds from a docker save tarball and prints the template
// as other builds do; no progress when stderr is no terminal. A registry
// that is not there is unavailable, a tag it lacks not found.
func TestTemplateBuildOCI(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	root := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Mode: 0o644, Size: 6, Typeflag: tar.TypeReg})
	tw.Write([]byte("hello\n"))
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	saved := filepath.Join(t.TempDir(), "hello.tar")
	if err := tarball.WriteToFile(saved, name.MustParseReference("hello:1"), img); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCLI("template", "build", "hello", "--from-oci", saved, "--size", "16MiB", "--storage-root", root, "--json")
	var res struct{ Result struct{ ID, Source string } }
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || !strings.HasPrefix(res.Result.ID, "sha256-") || res.Result.Source != "oci:"+saved || errs != "" {
		t.Fatalf("build --from-oci --json: exit %d, %q %q", code, out, errs)
	}

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	missing := strings.TrimPrefix(srv.URL, "http://") + "/hello:2"
	if _, errs, code := runCLI("template", "build", "hello", "--from-registry", missing, "--storage-root", root); code != api.ExitNotFound || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
		t.Errorf("a tag the registry lacks: exit %d, %q; want %d on one line", code, errs, api.ExitNotFound)
	}
	gone := testenv.LoopbackAddr(t) + "/hello:1" // nothing listens
	if _, errs, code := runCLI("template", "build", "hello", "--from-registry", gone, "--storage-root", root); code != api.ExitUnavailable || !strings.Contains(errs, "template hello: ") {
		t.Errorf("a registry that is not there: exit %d, %q; want %d", code, errs, api.ExitUnavailable)
	}
}
