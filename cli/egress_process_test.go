package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// The egress role is hidden from help and refuses root without the test
// flag: the production unit runs it as kibotos-egress without capabilities.
func TestEgressCommandRefusesRootAndIsHidden(t *testing.T) {
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		devnull, _ := os.Open(os.DevNull)
		defer devnull.Close()
		code := Main(context.Background(), "kibotos", args, devnull, &out, &errb)
		return out.String() + errb.String(), code
	}
	if help, _ := run("egress", "--help"); strings.Contains(help, "serve") {
		t.Fatalf("egress serve shows in help:\n%s", help)
	}
	if os.Geteuid() != 0 {
		t.Skip("the root refusal needs root")
	}
	out, code := run("egress", "serve", "--socket-dir", t.TempDir(), "--generation", "1")
	if code != api.ExitInternal || !strings.Contains(out, "running as root") {
		t.Fatalf("egress serve as root: exit %d: %s", code, out)
	}
}
