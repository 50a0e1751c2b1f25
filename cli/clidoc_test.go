package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// docs/reference/cli.md is, like a golden file (-update rewrites it), the CLI's own description (cliReference): a
// command, flag, help text or example changed without the reference is a
// failure here, not a stale page.
func TestCLIReferenceUpToDate(t *testing.T) {
	want, err := cliReference()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "docs", "reference", "cli.md")
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `go test ./cli -run TestCLIReferenceUpToDate -update`", err)
	}
	if string(got) != want {
		t.Fatalf("docs/reference/cli.md is not what the CLI's command tree renders: run `go test ./cli -run TestCLIReferenceUpToDate -update`")
	}
}
