package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// recorder stands in for a *testing.T so the test can see which of Skip
// and Fatalf Skipf chose without stopping itself.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Name() string                 { return "TestX" }
func (r *recorder) Skip(args ...any)             { r.skipped = args[0].(string) }
func (r *recorder) Fatalf(f string, args ...any) { r.failed = fmt.Sprintf(f, args...) }

func TestSkipfSkipsByDefault(t *testing.T) {
	t.Setenv(RequireAllEnv, "")
	r := &recorder{TB: t}
	Skipf(r, "missing %s", "qemu")
	if r.skipped != "missing qemu" || r.failed != "" {
		t.Fatalf("skipped %q failed %q; want a skip saying what is missing", r.skipped, r.failed)
	}
}

func TestSkipfFailsUnderRequireAll(t *testing.T) {
	t.Setenv(RequireAllEnv, "1")
	r := &recorder{TB: t}
	Skipf(r, "missing %s", "qemu")
	if r.skipped != "" || !strings.Contains(r.failed, RequireAllEnv) {
		t.Fatalf("skipped %q failed %q; want a failure naming %s", r.skipped, r.failed, RequireAllEnv)
	}
}

func TestLookPathMissingTool(t *testing.T) {
	t.Setenv(RequireAllEnv, "1")
	r := &recorder{TB: t}
	if p := LookPath(r, "kibotos-no-such-tool", "nope"); p != "" {
		t.Fatalf("path %q for a missing tool", p)
	}
	if r.failed == "" {
		t.Fatal("a missing tool under KIBOTOS_REQUIRE_ALL=1 did not fail")
	}
}

func TestRequireRoot(t *testing.T) {
	t.Setenv(RequireAllEnv, "1")
	r := &recorder{TB: t}
	RequireRoot(r, "to make a network namespace")
	if os.Geteuid() == 0 {
		if r.failed != "" || r.skipped != "" {
			t.Fatalf("as root: skipped %q failed %q", r.skipped, r.failed)
		}
		return
	}
	if !strings.Contains(r.failed, "needs root to make a network namespace") {
		t.Fatalf("not root, under %s=1: failure %q; want one saying what needs root", RequireAllEnv, r.failed)
	}
}
