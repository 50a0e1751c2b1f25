package egress

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/agent/generations"
	"github.com/kibotos/kibotos/vmm/units"
)

// Unit naming: kibotos-egress-<scope>-<generation>.service.
const unitPrefix = "kibotos-egress-"

// UnitName is the unit of generation gen of scope.
func UnitName(scope string, gen uint64) string { return units.GenerationUnit(unitPrefix, scope, gen) }

// GenerationFile is the egress generation counter in the node's state
// directory. Unlike the data plane's it lives on persistent storage, next
// to the credential files a restarted node restores egress from; a
// counter that survives reboots never hands out a number twice.
func GenerationFile(stateDir string) string { return filepath.Join(stateDir, "egress-generation") }

// newSeries is the generations of cfg's egress process.
func newSeries(cfg SupervisorConfig) *generations.Series {
	return &generations.Series{Units: cfg.Units, Prefix: unitPrefix, Scope: cfg.Scope, Counter: GenerationFile(cfg.StateDir),
		Who: "egress", StopTimeout: stopWait}
}

// generation is one egress process the Supervisor runs or adopted.
type generation struct {
	num      uint64
	unit     string
	mainPID  uint32
	revision string
	release  string
	adopted  bool
	// socketDir holds its control socket: the supervisor's SocketDir,
	// or for one adopted from an earlier build one of EarlierSocketDirs.
	socketDir string
	deadline  time.Time // of its drain; zero while it serves
	client    *Client   // nil until dialed, or after a failed redial
	misses    int       // control checks failed in a row (watch)
	// noGuests: it refused guest-stats (a build before them); it is not
	// asked again, which would log a warning there at every scrape.
	noGuests bool
}

func (g *generation) describe() Generation {
	return Generation{Number: g.num, Unit: g.unit, MainPID: g.mainPID, Revision: g.revision, Release: g.release,
		Adopted: g.adopted, Draining: !g.deadline.IsZero(), Deadline: g.deadline}
}

func (g *generation) closeClient() {
	if g.client != nil {
		g.client.Close()
	}
}

// controlSocket is the path of g's control socket.
func (s *Supervisor) controlSocket(g *generation) string {
	return ControlSocket(cmp.Or(g.socketDir, s.cfg.SocketDir), g.num)
}

// findSocketDir sets where an adopted generation's control socket is:
// SocketDir, else the first of EarlierSocketDirs that has it (a process
// an earlier build started); SocketDir when none has, for the dial to
// say what is missing.
func (s *Supervisor) findSocketDir(g *generation) {
	g.socketDir = s.cfg.SocketDir
	for _, dir := range append([]string{s.cfg.SocketDir}, s.cfg.EarlierSocketDirs...) {
		if _, err := os.Lstat(ControlSocket(dir, g.num)); err == nil {
			g.socketDir = dir
			return
		}
	}
}

// dial connects to g's control socket and checks it is g that answers.
func (s *Supervisor) dial(ctx context.Context, g *generation) error {
	c, err := Dial(ctx, s.controlSocket(g))
	if err != nil {
		return err
	}
	if c.Hello.Generation != g.num {
		c.Close()
		return fmt.Errorf("egress: control socket of generation %d answers as generation %d", g.num, c.Hello.Generation)
	}
	g.closeClient()
	g.client, g.revision, g.release = c, c.Hello.Revision, c.Hello.Release
	return nil
}

// call runs f (one idempotent request) on g's control connection. A
// connection that broke (a call cut short, or an old one the process
// already dropped) is dialed again once; an error the process answered
// is returned as it is.
func (s *Supervisor) call(ctx context.Context, g *generation, f func(*Client) error) error {
	if g.client != nil && !g.client.Broken() {
		err := f(g.client)
		if err == nil || !g.client.Broken() || ctx.Err() != nil {
			return err
		}
	}
	if err := s.dial(ctx, g); err != nil {
		return err
	}
	return f(g.client)
}
