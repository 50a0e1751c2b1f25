package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/agent/runtime"
)

// The node's own records say their format; a newer one is refused in the
// upgrade seed's words, before anything of it is used; the incarnation
// written as a bare number by older builds is read and written back in
// its versioned form.
func TestNodeRecordFormats(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "incarnation")
	os.WriteFile(path, []byte("7\n"), 0o600)
	if n, err := nextIncarnation(dir); err != nil || n != 8 {
		t.Fatalf("after a bare 7: %d, %v", n, err)
	}
	if b, _ := os.ReadFile(path); string(b) != `{"format_version":1,"incarnation":8}`+"\n" {
		t.Fatalf("incarnation record written back as %q", b)
	}
	if n, err := nextIncarnation(dir); err != nil || n != 9 {
		t.Fatalf("after 8: %d, %v", n, err)
	}
	os.WriteFile(path, []byte(`{"format_version":2,"incarnation":40}`), 0o600)
	if _, err := nextIncarnation(dir); err == nil || !strings.Contains(err.Error(), path+" has version 2, this build reads [0 1]") {
		t.Fatalf("a newer incarnation record: %v", err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), `"incarnation":40`) {
		t.Fatalf("a refused record was changed: %q", b)
	}

	root := t.TempDir()
	vc := filepath.Join(runtime.RegistryDir(root), runtime.VolumeCommandsFile)
	os.MkdirAll(filepath.Dir(vc), 0o700)
	os.WriteFile(vc, []byte(`{"format_version":2,"commands":[]}`), 0o600)
	if _, err := openCommandLog(root); err == nil || err.Error() != vc+" has version 2, this build reads [1]: a newer kibotos wrote it; run that release again (there is no rollback)" {
		t.Fatalf("a newer volume-commands.json: %v", err)
	}
}
