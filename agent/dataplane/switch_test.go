package dataplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime/runtimetest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
	"github.com/kibotos/kibotos/vmm/units"
	"github.com/kibotos/kibotos/vmm/units/privsd"
)

// switchEnv is a private systemd, a guest and a node's supervisor config
// for the startup-table tests: every generation is a real unit running a
// kibotos binary built from this tree with the release a test names.
type switchEnv struct {
	t     *testing.T
	ctx   context.Context
	m     *units.Manager
	dir   string
	logs  *testenv.Buffer
	base  SupervisorConfig
	p     *pki
	state State
}

func newSwitchEnv(t *testing.T) *switchEnv {
	t.Helper()
	if err := privsd.Available(); err != nil {
		testenv.Skipf(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	_, m := runtimetest.Systemd(t, filepath.Join(dir, "sd"))
	e := &switchEnv{t: t, ctx: ctx, m: m, dir: dir, logs: &testenv.Buffer{}, p: newPKI(t, "node-a")}
	e.base = SupervisorConfig{Units: m, Scope: ScopeFor(filepath.Join(dir, "run")), SocketDir: filepath.Join(dir, "dp"),
		Listen: "127.0.0.1:0", Grace: 3 * time.Second, Logger: slog.New(slog.NewTextHandler(e.logs, nil))}
	e.state = e.p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: startGuest(t, dir, "inst-1")})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", e.logs.String())
		}
		StopScope(context.Background(), m, e.base.Scope)
	})
	return e
}

// build is the node's config for the build of release and revision.
func (e *switchEnv) build(release, revision string) SupervisorConfig {
	cfg := e.base
	cfg.Executable = buildRelease(e.t, release, revision)
	cfg.Release, cfg.Revision = release, revision
	return cfg
}

func (e *switchEnv) ensure(cfg SupervisorConfig) *Handle {
	e.t.Helper()
	h, err := Ensure(e.ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := h.Push(e.ctx, e.state); err != nil {
		e.t.Fatal(err)
	}
	return h
}

// units lists the scope's active data-plane units, as
// `systemctl list-units 'kibotos-dataplane-*'` would.
func (e *switchEnv) units() []string {
	e.t.Helper()
	listed, err := e.m.List(e.ctx, unitPrefix+"*")
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, u := range listed {
		if u.Active() {
			out = append(out, u.Name)
		}
	}
	slices.Sort(out)
	return out
}

func (e *switchEnv) wantUnits(what string, gens ...uint64) {
	e.t.Helper()
	var want []string
	for _, g := range gens {
		want = append(want, UnitName(e.base.Scope, g))
	}
	slices.Sort(want)
	if got := e.units(); !slices.Equal(got, want) {
		e.t.Fatalf("%s: data-plane units %v, want %v", what, got, want)
	}
}

// waitGone waits for unit to end by itself and returns how long it took.
func (e *switchEnv) waitGone(unit string, within time.Duration) time.Duration {
	e.t.Helper()
	return testenv.WaitFor(e.t, within, unit+" to end", func() (bool, string) {
		u, err := e.m.Get(e.ctx, unit)
		return errors.Is(err, units.ErrNotFound) || (err == nil && !u.Active() && u.ActiveState != "deactivating"), fmt.Sprintf("%+v, %v", u, err)
	})
}

func (e *switchEnv) connect(addr string) *guestproto.Client {
	e.t.Helper()
	c := connect(e.t, e.p, e.p.cred(e.t, addr, "ws-a", "inst-1"))
	if err := echoOn(e.ctx, c, "hello"); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// finishOld checks that a connection to the generation a switch made
// drain still answers, and that the process started on it before the
// switch reads its input and exits 0.
func (e *switchEnv) finishOld(held *guestproto.Client, proc *guestproto.Process) {
	e.t.Helper()
	if err := echoOn(e.ctx, held, "during"); err != nil {
		e.t.Fatalf("the old generation's connection after the switch: %v", err)
	}
	proc.Stdin.Write([]byte("it\n"))
	proc.Stdin.Close()
	if exit, err := proc.Wait(); err != nil || exit.ExitCode != 0 {
		e.t.Fatalf("the process started before the switch: %+v, %v", exit, err)
	}
}

func (e *switchEnv) logHas(t *testing.T, parts ...string) {
	t.Helper()
	for _, line := range strings.Split(e.logs.String(), "\n") {
		found := true
		for _, p := range parts {
			found = found && strings.Contains(line, p)
		}
		if found {
			return
		}
	}
	t.Fatalf("no node log line has all of %q", parts)
}

// TestSupervisorHandOver: the startup table's second row and the rule of
// at most one draining generation, with real units. Another build of the
// release line takes over the listening socket while a client connects in
// a loop: none is refused, the old generation's open connection and the
// process on it go on, and the old unit exits by itself once that
// connection ended; two units run only meanwhile. Then changed TLS
// settings switch again while a generation drains: that one is ended, its
// connection dropped, with the log line.
func TestSupervisorHandOver(t *testing.T) {
	e := newSwitchEnv(t)
	a := e.build("0.2.0", "dataplane-test-a")
	b := e.build("0.2.1", "dataplane-test-b")

	h1 := e.ensure(a)
	if h1.Adopted || h1.Generation != 1 || h1.Hello.Release != "0.2.0" || h1.Hello.Revision != "dataplane-test-a" {
		t.Fatalf("first Ensure: %+v", h1)
	}
	addr := h1.Address()
	held1 := e.connect(addr)
	proc, err := held1.Exec(e.ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	// Four clients connect in a loop; lp is one of them.
	lp := startLoop(t, e.p, func() string { return addr }, "ws-a", "inst-1")
	var others []*loop
	for range 3 {
		others = append(others, startLoop(t, e.p, func() string { return addr }, "ws-a", "inst-1"))
	}
	lp.waitMore(t, 20)

	// Another build of the line: generation 2 takes the socket over.
	rounds := func() int {
		n := lp.count()
		for _, o := range others {
			n += o.count()
		}
		return n
	}
	t0, before := time.Now(), rounds()
	h2 := e.ensure(b)
	took, during := time.Since(t0), rounds()-before
	if h2.Adopted || h2.Generation != 2 || h2.Address() != addr || !strings.Contains(h2.Switched, "another build on the release line") {
		t.Fatalf("Ensure with another build of the line: %+v (switched %q), want generation 2 on %s", h2, h2.Switched, addr)
	}
	if d := h2.Draining(); len(d) != 1 || d[0].Generation != 1 {
		t.Fatalf("draining after the switch: %+v, want generation 1", d)
	}
	e.wantUnits("while generation 1 drains", 1, 2)
	// A node restart meanwhile adopts generation 2 and leaves generation
	// 1 draining.
	if h := e.ensure(b); !h.Adopted || h.Generation != 2 || len(h.Draining()) != 1 || h.Draining()[0].Generation != 1 {
		t.Fatalf("Ensure while generation 1 drains: %+v, draining %+v", h, h.Draining())
	}
	// The node reads both generations' counters (it sums them for
	// /metrics): generation 1's connections still count.
	if hs := h2.Hellos(e.ctx); len(hs) != 2 || hs[1].Generation != 1 || !hs[1].Draining || hs[1].Counters.Connections == 0 {
		t.Fatalf("hellos while generation 1 drains: %+v", hs)
	}
	lp.waitMore(t, 50)
	e.finishOld(held1, proc)
	held1.Close()
	gone1 := e.waitGone(h1.Unit, 15*time.Second)
	e.wantUnits("after generation 1's last connection ended", 2)
	lp.waitMore(t, 30)
	ok, failed, slowest := lp.finish()
	for _, o := range others {
		n, f, sl := o.finish()
		ok, failed, slowest = ok+n, append(failed, f...), max(slowest, sl)
	}
	t.Logf("same-line hand-over: Ensure took %v (%d loop connections finished meanwhile); generation 1 exited %v after its last connection; 4 client loops: %d connections, %d refused or failed, slowest %v",
		took.Round(time.Millisecond), during, gone1.Round(time.Millisecond), ok+len(failed), len(failed), slowest.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Fatalf("connections refused or failed during the hand-over: %q", failed)
	}
	// The node forgets the generation that finished, with a log line.
	if hs := h2.Hellos(e.ctx); len(hs) != 1 || hs[0].Generation != 2 {
		t.Fatalf("hellos after generation 1 exited: %+v", hs)
	}
	e.logHas(t, `msg="data-plane generation ended"`, "generation=1", `reason="its connections ended"`)

	// The same build again: adopted.
	if h := e.ensure(b); !h.Adopted || h.Generation != 2 {
		t.Fatalf("Ensure with the same build: %+v, want generation 2 adopted", h)
	}

	// Changed TLS settings hand over too, and generation 2 drains with a
	// connection open.
	held2 := e.connect(addr)
	b12 := b
	b12.TLS = TLSSettings{MinVersion: "1.2"}
	h3 := e.ensure(b12)
	if h3.Generation != 3 || !strings.Contains(h3.Switched, "the TLS settings changed from min 1.3 to min 1.2") || h3.Hello.TLS == nil || h3.Hello.TLS.MinVersion != "1.2" {
		t.Fatalf("Ensure with new TLS settings: %+v (switched %q)", h3, h3.Switched)
	}
	e.wantUnits("while generation 2 drains", 2, 3)
	held3 := e.connect(addr)
	// Another switch while generation 2 drains: it is ended at once.
	h4 := e.ensure(a) // back to the other build of the line
	if h4.Generation != 4 || len(h4.Draining()) != 1 || h4.Draining()[0].Generation != 3 {
		t.Fatalf("third switch: %+v, draining %+v, want generation 4 with 3 draining", h4, h4.Draining())
	}
	waitClosed(t, held2.Done(), 5*time.Second, "the ended generation 2's connection to be dropped")
	e.logHas(t, `msg="data-plane generation ended"`, "generation=2", `reason="a newer generation is about to drain"`)
	e.wantUnits("after the third switch", 3, 4)
	if testing.Verbose() {
		t.Logf("node log:\n%s", e.logs.String())
	}
	if err := echoOn(e.ctx, held3, "still"); err != nil {
		t.Fatalf("generation 3's connection after the third switch: %v", err)
	}
	held3.Close()
	e.waitGone(h3.Unit, 15*time.Second)
	e.wantUnits("at the end", 4)
	if err := echoOnce(e.p.cred(t, addr, "ws-a", "inst-1"), e.p.pool, "last"); err != nil {
		t.Fatal(err)
	}
}

// TestSupervisorAddressChange: the same release line on a new address.
// The new generation binds it; the old one stops accepting on the old
// address but serves its connection there until it ends, then exits.
func TestSupervisorAddressChange(t *testing.T) {
	e := newSwitchEnv(t)
	a := e.build("0.2.0", "dataplane-test-a")
	a.Listen = testenv.LoopbackAddr(t)
	h1 := e.ensure(a)
	held := e.connect(h1.Address())

	moved := a
	moved.Listen = testenv.LoopbackAddr(t)
	h2 := e.ensure(moved)
	if h2.Generation != 2 || h2.Address() != moved.Listen || !strings.Contains(h2.Switched, "the listen address changed") {
		t.Fatalf("Ensure on a new address: %+v (switched %q)", h2, h2.Switched)
	}
	e.wantUnits("while generation 1 drains on the old address", 1, 2)
	if err := echoOnce(e.p.cred(t, moved.Listen, "ws-a", "inst-1"), e.p.pool, "new"); err != nil {
		t.Fatalf("the new address: %v", err)
	}
	if err := echoOn(e.ctx, held, "old"); err != nil {
		t.Fatalf("the old address's connection: %v", err)
	}
	if c, err := net.DialTimeout("tcp", a.Listen, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts after the move", a.Listen)
	}
	held.Close()
	e.waitGone(h1.Unit, 15*time.Second)
	e.wantUnits("after the old address's last connection", 2)
}

// TestSupervisorAcrossLines: another release line. The old generation is
// ended first (its connection cut), then a new one binds the address.
func TestSupervisorAcrossLines(t *testing.T) {
	e := newSwitchEnv(t)
	a := e.build("0.2.0", "dataplane-test-a")
	a.Listen = testenv.LoopbackAddr(t)
	h1 := e.ensure(a)
	held := e.connect(h1.Address())

	c := e.build("0.3.0", "dataplane-test-c")
	c.Listen = a.Listen
	h2 := e.ensure(c)
	if h2.Adopted || h2.Generation != 2 || h2.Switched != "" || len(h2.Draining()) != 0 || h2.Address() != a.Listen {
		t.Fatalf("Ensure across lines: %+v, draining %+v", h2, h2.Draining())
	}
	waitClosed(t, held.Done(), 5*time.Second, "the old line's connection to be cut")
	e.logHas(t, `msg="data-plane generation ended"`, "generation=1", `reason="another release line: it runs 0.2.0`)
	e.wantUnits("after the switch across lines", 2)
	if err := echoOnce(e.p.cred(t, a.Listen, "ws-a", "inst-1"), e.p.pool, "new line"); err != nil {
		t.Fatal(err)
	}
	// A pre-release is on no line either, even of the same MAJOR.MINOR.
	beta := e.build("0.3.1-beta.1", "dataplane-test-d")
	beta.Listen = a.Listen
	h3 := e.ensure(beta)
	if h3.Generation != 3 || h3.Switched != "" || len(h3.Draining()) != 0 {
		t.Fatalf("Ensure to a pre-release: %+v", h3)
	}
}

// TestDecide is the startup table as decide reads it from a hello.
func TestDecide(t *testing.T) {
	node := SupervisorConfig{Release: "0.2.1", Revision: "rev-b", Listen: "10.0.0.1:7002", TLS: DefaultTLS()}
	same := Hello{Release: "0.2.1", Revision: "rev-b", Protocol: ControlProtocol, Listen: "10.0.0.1:7002", TLS: &TLSSettings{MinVersion: "1.3"}}
	with := func(f func(*Hello)) Hello { h := same; f(&h); return h }
	for _, c := range []struct {
		name string
		h    Hello
		want plan
		says string
	}{
		{"same build, address and TLS", same, planAdopt, ""},
		{"an earlier build of this revision says no TLS settings: the default", with(func(h *Hello) { h.TLS = nil }), planAdopt, ""},
		{"another build of the line", with(func(h *Hello) { h.Release, h.Revision = "0.2.0", "rev-a" }), planHandOver, "another build on the release line"},
		{"another release stamped on the same revision", with(func(h *Hello) { h.Release = "0.2.0" }), planHandOver, "another build on the release line: it runs 0.2.0 (revision rev-b)"},
		{"across MINOR on the same revision", with(func(h *Hello) { h.Release = "0.3.0" }), planReplace, "another release line: it runs 0.3.0 (revision rev-b)"},
		{"new TLS settings", with(func(h *Hello) { h.TLS = &TLSSettings{MinVersion: "1.2"} }), planHandOver, "TLS settings changed from min 1.2 to min 1.3"},
		{"another build and new TLS settings", with(func(h *Hello) { h.Revision, h.TLS = "rev-a", &TLSSettings{MinVersion: "1.2"} }), planHandOver, "release line: it runs 0.2.1 (revision rev-a), this node 0.2.1 (revision rev-b); the TLS settings changed"},
		{"new address", with(func(h *Hello) { h.Listen = "10.0.0.1:7003" }), planMove, "listen address changed from 10.0.0.1:7003 to 10.0.0.1:7002"},
		{"another build on a new address", with(func(h *Hello) { h.Revision, h.Listen = "rev-a", "10.0.0.1:7003" }), planMove, "listen address changed"},
		{"across MINOR", with(func(h *Hello) { h.Release, h.Revision = "0.3.0", "rev-c" }), planReplace, "another release line: it runs 0.3.0"},
		{"a pre-release", with(func(h *Hello) { h.Release, h.Revision = "0.2.2-beta.1", "rev-d" }), planReplace, "another release line"},
		{"unreleased builds", with(func(h *Hello) { h.Release, h.Revision = "unreleased", "rev-e" }), planReplace, "another release line"},
		{"an earlier build without a release", with(func(h *Hello) { h.Release, h.Revision, h.Protocol = "", "rev-f", 0 }), planReplace, "it runs a build without a release"},
		{"this revision without the hand-over protocol", with(func(h *Hello) { h.Release, h.Protocol, h.Listen = "", 0, "10.0.0.1:7003" }), planReplace, "cannot hand over its listening socket (control protocol 0)"},
	} {
		got, why := decide(c.h, node)
		if got != c.want || !strings.Contains(why, c.says) {
			t.Errorf("%s: plan %d (%q), want %d saying %q", c.name, got, why, c.want, c.says)
		}
	}
	// An unreleased build hands over to itself, here for a new address.
	unreleased := node
	unreleased.Release = "unreleased"
	if got, why := decide(with(func(h *Hello) { h.Release, h.Listen = "unreleased", "10.0.0.1:7003" }), unreleased); got != planMove || !strings.Contains(why, "listen address changed") {
		t.Errorf("this revision unreleased, new address: plan %d (%q), want %d", got, why, planMove)
	}
}

// TestTLSSettings: what the process accepts as settings.
func TestTLSSettings(t *testing.T) {
	if !(TLSSettings{}).Equal(DefaultTLS()) || (TLSSettings{MinVersion: "1.2"}).Equal(DefaultTLS()) {
		t.Fatal("zero settings are the default, 1.2 is not")
	}
	for _, bad := range []TLSSettings{{MinVersion: "1.1"}, {MinVersion: "1.3", CipherSuites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}}, {MinVersion: "1.2", CipherSuites: []string{"TLS_RSA_WITH_RC4_128_SHA"}}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := (TLSSettings{MinVersion: "1.2", CipherSuites: []string{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestTLSSettingsServed: the minimum version is what the listener serves.
func TestTLSSettingsServed(t *testing.T) {
	p := newPKI(t, "node-a")
	for _, c := range []struct {
		settings TLSSettings
		tls12    bool
	}{{DefaultTLS(), false}, {TLSSettings{MinVersion: "1.2"}, true}} {
		s := startServer(t, time.Second, func(cfg *Config) { cfg.TLS = c.settings })
		s.push(t, p.state())
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS12, NextProtos: []string{ALPN}})
		if err == nil {
			conn.Close()
		}
		if (err == nil) != c.tls12 {
			t.Errorf("%s: a TLS 1.2 handshake: %v", c.settings, err)
		}
		if h, _ := AskHello(ctxT(t), s.dir, s.gen); h.TLS == nil || !h.TLS.Equal(c.settings) {
			t.Errorf("%s: hello says %+v", c.settings, h.TLS)
		}
	}
}

// TestSupervisorServingDiesWhileOneDrains: the serving generation goes
// away while an older one drains; the node starts a new one on the
// address, which borrows the draining one's guest session, and the
// draining one's connection is unaffected.
func TestSupervisorServingDiesWhileOneDrains(t *testing.T) {
	e := newSwitchEnv(t)
	a := e.build("0.2.0", "dataplane-test-a")
	a.Listen = testenv.LoopbackAddr(t)
	b := e.build("0.2.1", "dataplane-test-b")
	b.Listen = a.Listen
	e.ensure(a)
	held := e.connect(a.Listen)
	h2 := e.ensure(b)
	if h2.Generation != 2 {
		t.Fatalf("switch: %+v", h2)
	}
	if err := e.m.Stop(e.ctx, h2.Unit); err != nil {
		t.Fatal(err)
	}
	h3 := e.ensure(b)
	if h3.Generation != 3 || h3.Adopted || h3.Address() != a.Listen || len(h3.Draining()) != 1 || h3.Draining()[0].Generation != 1 {
		t.Fatalf("Ensure after the serving generation died: %+v, draining %+v", h3, h3.Draining())
	}
	e.wantUnits("generation 3 serves, 1 drains", 1, 3)
	if err := echoOnce(e.p.cred(t, a.Listen, "ws-a", "inst-1"), e.p.pool, "new"); err != nil {
		t.Fatalf("a new connection while generation 1 holds the guest: %v", err)
	}
	if err := echoOn(e.ctx, held, "held"); err != nil {
		t.Fatal(err)
	}
	held.Close()
	e.waitGone(UnitName(e.base.Scope, 1), 15*time.Second)
	if err := echoOnce(e.p.cred(t, a.Listen, "ws-a", "inst-1"), e.p.pool, "after"); err != nil {
		t.Fatal(err)
	}
}

// TestSupervisorAdoptsFromAnEarlierSocketDir: an upgrade that moved the
// socket directory. A generation an earlier build started in the old
// directory, with an exec open through it, is handed over from there to
// a generation of this build in the new directory: the new one takes the
// listening socket, the old one's open connection goes on, the numbers go
// on from the old counter, and once the old generation exits by itself
// neither its link nor the old directory is left.
func TestSupervisorAdoptsFromAnEarlierSocketDir(t *testing.T) {
	e := newSwitchEnv(t)
	old := e.build("0.2.0", "dataplane-test-a")
	h1 := e.ensure(old)
	addr := h1.Address()
	held := e.connect(addr)
	proc, err := held.Exec(e.ctx, guestproto.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}

	cur := e.build("0.2.1", "dataplane-test-b")
	earlier := cur.SocketDir
	cur.SocketDir, cur.EarlierSocketDirs = filepath.Join(e.dir, "run", "dataplane"), []string{earlier}
	h2 := e.ensure(cur)
	if h2.Adopted || h2.Generation != 2 || h2.Address() != addr || !strings.Contains(h2.Switched, "another build on the release line") {
		t.Fatalf("Ensure of this build with the moved directory: %+v (switched %q), want generation 2 taking over %s", h2, h2.Switched, addr)
	}
	if d := h2.Draining(); len(d) != 1 || d[0].Generation != 1 {
		t.Fatalf("draining after the switch: %+v, want generation 1", d)
	}
	e.logHas(t, "data-plane generation found in an earlier socket directory", "generation=1")
	if _, err := os.Stat(ControlSocket(cur.SocketDir, 2)); err != nil {
		t.Fatalf("generation 2's control socket is not in the new directory: %v", err)
	}
	if gen, err := units.ReadGenerationCounter(generationFile(cur.SocketDir)); err != nil || gen != 2 {
		t.Fatalf("the new directory's generation counter: %d, %v; want 2", gen, err)
	}
	e.connect(h2.Address()).Close()

	// The old generation's connection and exec go on, then end, and the
	// generation with them.
	e.finishOld(held, proc)
	held.Close()
	e.waitGone(h1.Unit, 15*time.Second)
	// The node learns it at its next look at its generations.
	h2.Hellos(e.ctx)
	if d := h2.Draining(); len(d) != 0 {
		t.Fatalf("draining once generation 1 exited: %+v", d)
	}
	if _, err := os.Lstat(ControlSocket(cur.SocketDir, 1)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the link to generation 1's control socket is left: %v", err)
	}
	if _, err := os.Stat(earlier); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the earlier socket directory is left: %v", err)
	}
	// A node restart adopts generation 2 there, and removes a link a
	// node that stopped before its generation ended left behind.
	stray := ControlSocket(cur.SocketDir, 1)
	if err := os.Symlink(ControlSocket(earlier, 1), stray); err != nil {
		t.Fatal(err)
	}
	if h := e.ensure(cur); !h.Adopted || h.Generation != 2 {
		t.Fatalf("Ensure after the upgrade: %+v", h)
	}
	if _, err := os.Lstat(stray); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a link to an ended generation's control socket is left after Ensure: %v", err)
	}
}
