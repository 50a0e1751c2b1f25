package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
		{[]string{"kibotos-coding"}, "give exactly one of --from-dir DIR, --from-tar FILE, --debootstrap and --busybox"},
		{[]string{"kibotos-coding", "--busybox", "--debootstrap"}, "give exactly one of"},
		{[]string{"kibotos-coding", "--busybox", "--size", "2GiB"}, "--size goes with --from-dir, --from-tar or --debootstrap"},
		{[]string{"kibotos-coding", "--from-dir", src, "--debootstrap"}, "give exactly one of"},
		{[]string{"kibotos-coding", "--from-dir", src, "--suite", "trixie"}, "--suite, --mirror, --include and --variant go with --debootstrap"},
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
