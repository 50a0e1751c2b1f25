package kibotos

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kibotos/kibotos/agent"
)

func TestWorkspaceRootIsTheNodes(t *testing.T) {
	if workspaceRoot != agent.WorkspaceRoot {
		t.Fatalf("the SDK runs commands under %s, the node mounts Workspaces at %s", workspaceRoot, agent.WorkspaceRoot)
	}
}

// List's script, run by the shells of this host that Templates bring
// too (dash, bash, busybox) on a directory with the names that break
// parsers: spaces, a newline, dot files, a glob character, a dangling link.
func TestListScriptNamesEveryEntryOnce(t *testing.T) {
	var shells [][]string
	for _, sh := range [][]string{{"sh"}, {"bash"}, {"busybox", "sh"}} {
		if _, err := exec.LookPath(sh[0]); err == nil {
			shells = append(shells, sh)
		}
	}
	if len(shells) == 0 {
		t.Skip("no shell on this host")
	}
	dir := t.TempDir()
	want := []string{" lead", ".hidden", "*", "a b", "line\nbreak", "sub"}
	for _, n := range want[:len(want)-1] {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/nonexistent", filepath.Join(dir, "dangling")); err != nil {
		t.Fatal(err)
	}
	want = append(want, "dangling")
	slices.Sort(want)
	for _, sh := range shells {
		run := func(d string) []string {
			out, err := exec.Command(sh[0], append(sh[1:], "-c", listScript, "sh", d)...).Output()
			if err != nil {
				t.Fatalf("%s: list script in %s: %v", sh, d, err)
			}
			names := parseNames(out)
			slices.Sort(names)
			return names
		}
		if got := run(dir); !slices.Equal(got, want) {
			t.Errorf("%s listed %q; want %q", sh, got, want)
		}
		if got := run(filepath.Join(dir, "sub")); len(got) != 0 {
			t.Errorf("%s: an empty directory listed %q; want nothing (an unmatched glob is no name)", sh, got)
		}
	}
}

func TestParseNamesDropsANameCutShort(t *testing.T) {
	if got := parseNames([]byte("a\x00b c\x00\x00partial")); !slices.Equal(got, []string{"a", "b c"}) {
		t.Fatalf("parsed %q", got)
	}
}
