package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

// What the server sends is shown escaped: an address, a label or an error
// message with terminal escapes or bidi overrides cannot rewrite the
// operator's screen or disguise itself.
const hostile = "evil\x1b[2J\x1b[31m\r\u202Eexe.txt"

func checkShown(t *testing.T, what, out string) {
	t.Helper()
	if strings.ContainsAny(out, "\x1b\r\u202E") {
		t.Errorf("%s shows control or bidi characters raw: %q", what, out)
	}
	if !strings.Contains(out, `evil\x1b[2J\x1b[31m\r\u202eexe.txt`) {
		t.Errorf("%s does not show the escaped text: %q", what, out)
	}
}

func TestHumanOutputEscapesServerText(t *testing.T) {
	var b bytes.Buffer
	renderNode(&b, &api.Node{NodeID: "node-a", Status: api.NodeReady, Address: hostile, AdmittedAt: time.Unix(0, 0)}, false)
	checkShown(t, "node get", b.String())

	b.Reset()
	renderWorkspace(&b, &api.Workspace{WorkspaceID: "ws-1", State: api.WorkspaceAvailable, Labels: map[string]string{"app": hostile}, Network: &api.NetworkPolicy{}}, false)
	checkShown(t, "workspace get", b.String())

	b.Reset()
	tb := newTable(&b, "NAME", "ADDRESS")
	tb.row("node-a", hostile)
	tb.flush()
	checkShown(t, "a table", b.String())

	b.Reset()
	g := &Globals{stdout: &b, stderr: &b}
	g.printf("Address: %s\n", hostile)
	checkShown(t, "printf", b.String())

	b.Reset()
	code := reportError(&b, "kibo", api.Errorf(api.CodeNotFound, "workspace %s not found", hostile))
	checkShown(t, "an error", b.String())
	if code != api.ExitNotFound {
		t.Errorf("exit code %d; want %d", code, api.ExitNotFound)
	}

	// A message of several lines keeps its lines.
	b.Reset()
	reportError(&b, "kibo", errors.New("first\nsecond"))
	if b.String() != "kibo: error: first\nsecond\n" {
		t.Errorf("a two-line error is shown as %q", b.String())
	}
}
