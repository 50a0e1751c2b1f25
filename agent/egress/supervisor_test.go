package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/posixacl"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/units"
)

// Bad configs are refused before anything is created, naming the field.
func TestSupervisorConfigRefused(t *testing.T) {
	good := SupervisorConfig{Units: &units.Manager{}, Executable: "/usr/bin/kibotos", SocketDir: "/run/kibotos/node-egress",
		StateDir: "/var/lib/kibotos/storage/state", Scope: "abc", TCPListen: "0.0.0.0:15001", DNSListen: "169.254.100.254:5300"}
	if err := good.validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for want, edit := range map[string]func(*SupervisorConfig){
		"no unit manager":             func(c *SupervisorConfig) { c.Units = nil },
		`executable "kibotos"`:        func(c *SupervisorConfig) { c.Executable = "kibotos" },
		"must not contain each other": func(c *SupervisorConfig) { c.SocketDir = c.StateDir + "/egress" },
		`scope "a/b"`:                 func(c *SupervisorConfig) { c.Scope = "a/b" },
		"want a fixed port":           func(c *SupervisorConfig) { c.TCPListen = "0.0.0.0:0" },
		"want a specific address":     func(c *SupervisorConfig) { c.DNSListen = "0.0.0.0:5300" },
	} {
		c := good
		edit(&c)
		if err := c.validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

// The node checks, never grants, that the egress user can reach its
// socket directory and binary.
func TestSupervisorReachCheck(t *testing.T) {
	testenv.RequireRoot(t, "to give a directory to another user")
	base, err := os.MkdirTemp("", "kibotos-egress-reach-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	dir, sock := base+"/node", base+"/node/sock"
	a := account{name: "someone", uid: 54321, gid: 54321, groups: []uint32{54321}}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := a.prepareSocketDir(sock); err != nil {
		t.Fatal(err)
	}
	err = a.checkReach(sock)
	if err == nil || !strings.Contains(err.Error(), "cannot reach "+sock+": "+dir+" (mode 0700, owner 0:0)") {
		t.Fatalf("reach through a 0700 directory: %v", err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := a.checkReach(sock); err != nil {
		t.Fatalf("reach through a searchable directory: %v", err)
	}

	// An ACL that lets another account in (the VMM's, which the node
	// grants on a storage root under /root) does not let this one in;
	// one that names it does.
	if err := os.Chmod(dir, 0o710); err != nil {
		t.Fatal(err)
	}
	setACL := func(ents ...posixacl.Entry) {
		t.Helper()
		ents = append(ents, posixacl.FromMode(0o710)...)
		ents = append(ents, posixacl.Entry{Tag: posixacl.Mask, Perm: posixacl.Execute, ID: posixacl.NoID})
		if err := unix.Setxattr(dir, posixacl.Xattr, posixacl.Encode(ents), 0); err != nil {
			t.Fatalf("set an ACL on %s: %v", dir, err)
		}
	}
	setACL(posixacl.Entry{Tag: posixacl.User, Perm: posixacl.Execute, ID: 54320})
	err = a.checkReach(sock)
	if err == nil || !strings.Contains(err.Error(), "cannot reach "+sock+": "+dir+" (mode 0710, owner 0:0, an ACL without it)") {
		t.Fatalf("reach through a directory whose ACL names another account: %v", err)
	}
	setACL(posixacl.Entry{Tag: posixacl.User, Perm: posixacl.Execute, ID: 54320}, posixacl.Entry{Tag: posixacl.User, Perm: posixacl.Execute, ID: 54321})
	if err := a.checkReach(sock); err != nil {
		t.Fatalf("reach through a directory whose ACL names the account: %v", err)
	}

	// A program it may not execute is named as such.
	exe := filepath.Join(base, "kibotos")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	err = a.checkReach(exe)
	if err == nil || !strings.Contains(err.Error(), "account someone (uid 54321) cannot execute "+exe+": "+exe+" (mode 0700, owner 0:0)") {
		t.Fatalf("a 0700 program: %v", err)
	}
}

// The process runs exactly while there are routes, in the unit the seed
// describes: kibotos-egress, no capabilities, no new privileges, a
// read-only file system but its socket directory, the state directory
// hidden. Routes gone, it drains, and ends with its last connection.
func TestSupervisorRunsWhileThereAreRoutes(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, Config{}); err != nil {
		t.Fatal(err)
	}
	if gs := s.Generations(); len(gs) != 0 {
		t.Fatalf("generations without routes: %+v", gs)
	}

	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	g := serving(t, s)
	if g.Number != 1 || g.Unit != UnitName("suptest", 1) || g.Adopted {
		t.Fatalf("first generation %+v", g)
	}
	u, err := h.m.Get(ctx, g.Unit)
	if err != nil {
		t.Fatal(err)
	}
	if u.Slice != units.EgressSlice || u.User != DefaultUser || !u.NoNewPrivileges || u.CapabilityBoundingSet != 0 ||
		u.ProtectSystem != "strict" || !slices.Equal(u.ReadWritePaths, []string{h.cfg.SocketDir}) ||
		!slices.Equal(u.InaccessiblePaths, []string{h.cfg.StateDir}) {
		t.Errorf("unit %+v", u)
	}
	acct, err := user.Lookup(DefaultUser)
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.hostPID(t, g)))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nUid:\t" + acct.Uid + "\t", "\nCapEff:\t0000000000000000\n", "\nCapBnd:\t0000000000000000\n", "\nNoNewPrivs:\t1\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("/proc status of the egress process lacks %q:\n%s", want, status)
		}
	}
	fi, err := os.Stat(h.cfg.SocketDir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); strconv.Itoa(int(st.Uid)) != acct.Uid || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory %v owned by %d, want 0700 owned by %s", fi.Mode(), st.Uid, acct.Uid)
	}
	fi, err = os.Stat(GenerationFile(h.cfg.StateDir))
	if b, _ := os.ReadFile(GenerationFile(h.cfg.StateDir)); err != nil || string(b) != "1\n" || fi.Mode().Perm() != 0o600 {
		t.Errorf("generation counter %q (%v), want \"1\\n\" mode 0600", b, err)
	}

	c := h.connect(t, "through generation 1")
	if st, err := s.Stats(ctx); err != nil || st.Accepted != 1 || st.Routes != 1 {
		t.Fatalf("stats %+v, %v", st, err)
	}

	// No routes: it drains, the open connection goes on until it ends.
	if err := s.Apply(ctx, Config{}); err != nil {
		t.Fatal(err)
	}
	if gs := s.Generations(); len(gs) != 1 || !gs[0].Draining {
		t.Fatalf("generations after the routes went: %+v", gs)
	}
	echo(t, c, "while draining")
	c.Close()
	h.ended(t, g, 10*time.Second)
	testenv.WaitFor(t, 5*time.Second, "the supervisor to forget generation 1", func() (bool, string) {
		gs := s.Generations()
		return len(gs) == 0, fmt.Sprintf("generations %+v", gs)
	})
	if !h.logLine("egress generation ended", "generation=1", "reason=\"drained") {
		t.Errorf("no drained line in the log:\n%s", h.logs)
	}
}

// A node restart: Close leaves the process serving, a new Supervisor
// adopts the same generation and PID with its config and connections.
func TestSupervisorAdoptsAfterClose(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	before := serving(t, s)
	c := h.connect(t, "before the restart")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	echo(t, c, "while no node runs")

	s2 := h.open(t)
	g := serving(t, s2)
	if g.Number != before.Number || g.MainPID != before.MainPID || !g.Adopted || len(s2.Generations()) != 1 {
		t.Fatalf("after the restart %+v, want generation %d (PID %d) adopted alone", s2.Generations(), before.Number, before.MainPID)
	}
	st, err := s2.Stats(ctx)
	if err != nil || !st.Configured || !st.Listening || st.Routes != 1 || st.Active != 1 {
		t.Fatalf("adopted stats %+v, %v", st, err)
	}
	echo(t, c, "after the restart")
	// The node applies its config again: same process.
	if err := s2.Apply(ctx, h.routes(2)); err != nil {
		t.Fatal(err)
	}
	if g := serving(t, s2); g.Number != before.Number || g.MainPID != before.MainPID {
		t.Fatalf("Apply after adoption replaced the process: %+v", g)
	}
	h.connect(t, "a new connection after the restart")
	if !h.logLine("egress generation adopted", "generation=1") {
		t.Errorf("no adoption line in the log:\n%s", h.logs)
	}
}

// An upgrade that moved the socket directory: the node restarted with
// a new SocketDir still adopts the running process, whose control socket
// is in the earlier build's directory, and a switch drains it there (its
// open connection goes on) while the new generation uses the new one;
// nothing of it is left in the earlier directory.
func TestSupervisorAdoptsFromAnEarlierSocketDir(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	earlier := h.cfg.SocketDir
	h.cfg.SocketDir = filepath.Join(filepath.Dir(earlier), "kibotos-egress-suptest")
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	before := serving(t, s)
	c := h.connect(t, "before the upgrade")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	h.cfg.SocketDir, h.cfg.EarlierSocketDirs = earlier, []string{h.cfg.SocketDir}
	s2 := h.open(t)
	if g := serving(t, s2); g.Number != before.Number || g.MainPID != before.MainPID || !g.Adopted {
		t.Fatalf("after the upgrade %+v, want generation %d (PID %d) adopted", s2.Generations(), before.Number, before.MainPID)
	}
	echo(t, c, "after the upgrade")
	// As the node does: its routes first, then the switch to its build.
	if err := s2.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	if err := s2.Switch(ctx); err != nil {
		t.Fatal(err)
	}
	g2 := serving(t, s2)
	if g2.Number != before.Number+1 {
		t.Fatalf("after the switch %+v, want generation %d serving", s2.Generations(), before.Number+1)
	}
	if _, err := os.Stat(ControlSocket(earlier, g2.Number)); err != nil {
		t.Errorf("the new generation's control socket is not in the socket directory %s: %v", earlier, err)
	}
	h.connect(t, "on the new generation")
	echo(t, c, "on the adopted generation while it drains")
	c.Close()
	h.ended(t, before, 10*time.Second)
	testenv.WaitFor(t, 5*time.Second, "the supervisor to forget the adopted generation", func() (bool, string) {
		gs := s2.Generations()
		return len(gs) == 1, fmt.Sprintf("generations %+v", gs)
	})
	if !h.logLine("egress generation ended", fmt.Sprintf("generation=%d", before.Number), "reason=\"drained") {
		t.Errorf("no drained line for the adopted generation:\n%s", h.logs)
	}
	// Its directory goes with its last socket when nothing else is left
	// there: here the test binary's own log (serve-N.log) stays.
	left, err := os.ReadDir(h.cfg.EarlierSocketDirs[0])
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), "serve-") {
			t.Errorf("the earlier build's socket directory still holds %s", e.Name())
		}
	}
}

// kill -9 of the process (by the PID its unit reports): the watch loop
// starts a new generation with new sockets and the last config within
// seconds.
func TestSupervisorReplacesKilledProcess(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	old := serving(t, s)
	c := h.connect(t, "before the kill")
	if err := syscall.Kill(h.hostPID(t, old), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	var g Generation
	testenv.WaitFor(t, 10*time.Second, "a new generation", func() (bool, string) {
		gs := s.Generations()
		if len(gs) == 1 && gs[0].Number > old.Number {
			g = gs[0]
			return true, ""
		}
		return false, fmt.Sprintf("generations %+v", gs)
	})
	took := time.Since(t0)
	t.Logf("generation %d serves %v after the kill", g.Number, took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the replacement took %v", took)
	}
	if g.Number != 2 || g.MainPID == old.MainPID {
		t.Fatalf("replacement %+v after %+v", g, old)
	}
	st, err := s.Stats(ctx)
	if err != nil || !st.Configured || !st.Listening || st.Routes != 1 {
		t.Fatalf("replacement stats %+v, %v", st, err)
	}
	closed(t, c, 5*time.Second) // its process died with it
	h.connect(t, "through the replacement")
	if _, err := os.Lstat(ControlSocket(h.cfg.SocketDir, old.Number)); !os.IsNotExist(err) {
		t.Errorf("the killed generation's control socket is left: %v", err)
	}
	if !h.logLine("egress generation ended", "generation=1", "exited unexpectedly") || !h.logLine("egress generation replaced the one that ended", "generation=2") {
		t.Errorf("log lacks the end and the replacement:\n%s", h.logs)
	}
}

// Switch: the new generation takes the sockets and the config, the old
// one drains and exits with its last connection. Switching again while a
// generation still drains ends that one at once.
func TestSupervisorSwitch(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	g1 := serving(t, s)
	c1 := h.connect(t, "on generation 1")
	if tot := s.Totals(ctx); tot.Accepted != 1 || tot.Active != 1 {
		t.Fatalf("totals before the switch %+v, want the one connection", tot)
	}
	guest := netip.MustParseAddr("127.0.0.1")
	if gt := s.GuestTotals(ctx); !reflect.DeepEqual(gt, map[netip.Addr]GuestStats{guest: {Guest: guest, Accepted: 1}}) {
		t.Fatalf("guest totals before the switch %+v, want the one connection", gt)
	}
	if err := s.Switch(ctx); err != nil {
		t.Fatal(err)
	}
	gs := s.Generations()
	if len(gs) != 2 || gs[0].Number != 1 || !gs[0].Draining || gs[1].Number != 2 || gs[1].Draining {
		t.Fatalf("after the switch %+v", gs)
	}
	h.connect(t, "on generation 2")
	if st, err := s.Stats(ctx); err != nil || st.Accepted != 1 || st.Routes != 1 {
		t.Fatalf("generation 2 stats %+v, %v: want the new connection there", st, err)
	}
	echo(t, c1, "on generation 1 while it drains")
	c1.Close()
	h.ended(t, g1, 10*time.Second)
	testenv.WaitFor(t, 5*time.Second, "the supervisor to forget generation 1", func() (bool, string) {
		gs := s.Generations()
		return len(gs) == 1, fmt.Sprintf("generations %+v", gs)
	})
	if !h.logLine("egress generation ended", "generation=1", "reason=\"drained") {
		t.Errorf("no drained line for generation 1:\n%s", h.logs)
	}
	// Summed over both generations, the ended one included: counters
	// never go down across a switch.
	if tot := s.Totals(ctx); tot.Accepted != 2 || tot.Active != 1 {
		t.Errorf("totals after generation 1 ended %+v, want both connections accepted, generation 2's active", tot)
	}
	if gt := s.GuestTotals(ctx); !reflect.DeepEqual(gt, map[netip.Addr]GuestStats{guest: {Guest: guest, Accepted: 2}}) {
		t.Errorf("guest totals after generation 1 ended %+v, want both connections of the guest", gt)
	}

	// Generation 2 carries a connection; two switches in a row: 2 drains,
	// then is ended at once when 3 is about to drain.
	c2 := h.connect(t, "on generation 2, before two switches")
	g2 := serving(t, s)
	if err := s.Switch(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Switch(ctx); err != nil {
		t.Fatal(err)
	}
	gs = s.Generations()
	if len(gs) != 2 || gs[0].Number != 3 || !gs[0].Draining || gs[1].Number != 4 {
		t.Fatalf("after two switches %+v", gs)
	}
	if !h.logLine("egress generation ended", "generation=2", "reason=\""+ReasonNewerDrains+"\"") {
		t.Errorf("no line for generation 2 ended at once:\n%s", h.logs)
	}
	h.ended(t, g2, time.Second)
	closed(t, c2, 5*time.Second)
	h.connect(t, "on generation 4")
	if b, _ := os.ReadFile(GenerationFile(h.cfg.StateDir)); string(b) != "4\n" {
		t.Errorf("generation counter %q, want 4", b)
	}
	// A guest the node no longer routes (its Instance ended) is forgotten,
	// also in the generations that carried it.
	other := netip.MustParseAddr("10.0.0.3")
	if err := s.Apply(ctx, Config{Routes: []Route{{Guest: other, Resolver: &Resolver{Name: "r1", Upstreams: []string{"192.0.2.1"}}}}}); err != nil {
		t.Fatal(err)
	}
	if gt := s.GuestTotals(ctx); !reflect.DeepEqual(gt, map[netip.Addr]GuestStats{other: {Guest: other}}) {
		t.Errorf("guest totals once only %s is routed: %+v", other, gt)
	}
}

// A node restart while a switch's old generation drains: the new
// Supervisor adopts both, and the draining one still ends with its last
// connection.
// A build of another release line takes the sockets and ends the old
// generation at once (its open connection closed), no drain.
func TestSupervisorReplace(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	g1 := serving(t, s)
	if g1.Release == "" {
		t.Errorf("generation 1 reports no release: %+v", g1)
	}
	c1 := h.connect(t, "on generation 1")
	if err := s.Replace(ctx); err != nil {
		t.Fatal(err)
	}
	if gs := s.Generations(); len(gs) != 1 || gs[0].Number != 2 || gs[0].Draining {
		t.Fatalf("after the replace %+v: want generation 2 alone", gs)
	}
	h.ended(t, g1, 10*time.Second)
	closed(t, c1, 5*time.Second)
	if !h.logLine("egress generation ended", "generation=1", "reason=\""+ReasonOtherLine+"\"") {
		t.Errorf("no line for generation 1 ended:\n%s", h.logs)
	}
	h.connect(t, "on generation 2")
}

func TestSupervisorAdoptsADrainingGeneration(t *testing.T) {
	h := newSupHarness(t)
	ctx := ctxT(t)
	s := h.open(t)
	if err := s.Apply(ctx, h.routes(1)); err != nil {
		t.Fatal(err)
	}
	c1 := h.connect(t, "on generation 1")
	if err := s.Switch(ctx); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2 := h.open(t)
	gs := s2.Generations()
	if len(gs) != 2 || gs[0].Number != 1 || !gs[0].Draining || !gs[0].Adopted || gs[1].Number != 2 || gs[1].Draining || !gs[1].Adopted {
		t.Fatalf("adopted %+v, want generation 1 draining and 2 serving", gs)
	}
	echo(t, c1, "on generation 1 after the restart")
	c1.Close()
	testenv.WaitFor(t, 10*time.Second, "generation 1 to end", func() (bool, string) {
		gs := s2.Generations()
		return len(gs) == 1, fmt.Sprintf("generations %+v", gs)
	})
	if st, err := s2.Stats(ctx); err != nil || !st.Listening || st.Routes != 1 {
		t.Fatalf("generation 2 stats %+v, %v", st, err)
	}
}
