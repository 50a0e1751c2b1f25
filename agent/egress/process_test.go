package egress

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// SIGTERM drains with the grace as deadline: with nothing open the
// process exits 0 at once. It runs as nobody and passes its own
// privilege check (no root, no capabilities).
func TestProcessDrainsOnSIGTERM(t *testing.T) {
	testenv.RequireRoot(t, "to start the process as another user")
	p := startProcess(t, "", nobody, 7, time.Minute)
	c := p.dial(t)
	if c.Hello.Generation != 7 || c.Hello.Protocol != ProtocolVersion {
		t.Fatalf("hello %+v", c.Hello)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.wait(t, 10*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.log())
	}
	if !strings.Contains(p.log(), "egress signalled: draining") {
		t.Fatalf("log:\n%s", p.log())
	}
	if _, err := os.Stat(p.socket); !os.IsNotExist(err) {
		t.Fatalf("control socket left behind: %v", err)
	}
}
