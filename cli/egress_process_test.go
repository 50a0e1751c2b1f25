package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
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
	testenv.RequireRoot(t, "to see egress serve refuse to run as root")
	out, code := run("egress", "serve", "--socket-dir", t.TempDir(), "--generation", "1")
	if code != api.ExitInternal || !strings.Contains(out, "running as root") {
		t.Fatalf("egress serve as root: exit %d: %s", code, out)
	}
}

// Started without --warm-connections (by hand, or by a node that does not
// pass it), the process keeps the product's warm pool.
func TestEgressServeWarmDefault(t *testing.T) {
	var c EgressServeCmd
	p, err := kong.New(&c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse([]string{"--socket-dir", "/run/x", "--generation", "1"}); err != nil {
		t.Fatal(err)
	}
	if c.Warm != egress.DefaultWarmConnections {
		t.Fatalf("--warm-connections defaults to %d; egress.DefaultWarmConnections is %d", c.Warm, egress.DefaultWarmConnections)
	}
}
