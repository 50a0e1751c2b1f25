package cli

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

func runCLI(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", args, nil, &out, &errb)
	return out.String(), errb.String(), code
}

func TestTemplateCommands(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 missing (Debian package e2fsprogs)")
	}
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
