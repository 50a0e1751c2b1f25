package dataplane

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// loop is a client that connects again and again to a data-plane address
// and runs echo on every connection, counting what failed.
type loop struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	ok      int
	failed  []string
	slowest time.Duration
}

// startLoop connects to addr() as ws/inst until finished. Each round is a
// new TCP and TLS connection, a credential check and an exec of echo.
func startLoop(t testing.TB, p *pki, addr func() string, ws, inst string) *loop {
	t.Helper()
	tok, err := credential.Sign(p.signKey, credential.Claims{WorkspaceID: ws, InstanceID: inst, NodeID: p.nodeID,
		IssuedAt: time.Now(), ExpiresAt: time.Now().Add(30 * time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			default:
			}
			cred := api.DataPlaneCredential{WorkspaceID: ws, InstanceID: inst, NodeID: p.nodeID, Address: addr(), Credential: tok}
			t0 := time.Now()
			err := echoOnce(cred, p.pool, fmt.Sprint("loop-", n))
			el := time.Since(t0)
			l.mu.Lock()
			l.slowest = max(l.slowest, el)
			if err != nil {
				l.failed = append(l.failed, fmt.Sprintf("%s: %v", t0.Format("15:04:05.000"), err))
			} else {
				l.ok++
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() { l.finish() })
	return l
}

// echoOnce connects with cred and runs echo word.
func echoOnce(cred api.DataPlaneCredential, roots *x509.CertPool, word string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Connect(ctx, cred, roots)
	if err != nil {
		return err
	}
	defer c.Close()
	return echoOn(ctx, c, word)
}

// echoOn runs echo word on c.
func echoOn(ctx context.Context, c *guestproto.Client, word string) error {
	p, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"echo", word}})
	if err != nil {
		return err
	}
	defer p.Close()
	var out bytes.Buffer
	go io.Copy(io.Discard, p.Stderr)
	io.Copy(&out, p.Stdout)
	exit, err := p.Wait()
	if err != nil {
		return err
	}
	if exit.ExitCode != 0 || out.String() != word+"\n" {
		return fmt.Errorf("echo %s: %q, exit %+v", word, out.String(), exit)
	}
	return nil
}

// finish stops the loop and returns its counts.
func (l *loop) finish() (ok int, failed []string, slowest time.Duration) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok, l.failed, l.slowest
}

func (l *loop) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok + len(l.failed)
}

// waitMore waits until the loop made n more rounds.
func (l *loop) waitMore(t testing.TB, n int) {
	t.Helper()
	want := l.count() + n
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d more rounds of the connecting loop", n), func() (bool, string) {
		got := l.count()
		return got >= want, fmt.Sprintf("%d rounds, want %d", got, want)
	})
}

// handOverInProcess does what Ensure does for a same-address switch, with
// two in-process generations: the new one gets the old one's state and
// listening socket, then the old one drains.
func handOverInProcess(t *testing.T, old *dpServer, grace time.Duration) *dpServer {
	t.Helper()
	ctx := ctxT(t)
	st, ok, err := ExportState(ctx, old.dir, old.gen)
	if err != nil || !ok {
		t.Fatalf("export state: %v, %v", ok, err)
	}
	ln, err := TakeListener(ctx, old.dir, old.gen)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	next := startServer(t, grace, func(c *Config) {
		c.SocketDir, c.Generation, c.AwaitListener, c.Predecessor = old.dir, old.gen+1, true, old.gen
	})
	if h, err := AskHello(ctx, next.dir, next.gen); err != nil || h.Listening {
		t.Fatalf("new generation before the hand-over: %+v, %v (want it waiting for the socket)", h, err)
	}
	next.push(t, st)
	if err := SendListener(ctx, next.dir, next.gen, ln); err != nil {
		t.Fatal(err)
	}
	if err := Drain(ctx, old.dir, old.gen); err != nil {
		t.Fatal(err)
	}
	return next
}

// TestHandOverKeepsConnections: the listening socket moves to a new
// generation while a client connects in a loop; no connection is refused,
// the old generation's open connection keeps working (its Instance's guest
// session lent to the new one meanwhile), and the old one returns by
// itself once that connection ended.
func TestHandOverKeepsConnections(t *testing.T) {
	p := newPKI(t, "node-a")
	dir := t.TempDir()
	sock := startGuest(t, dir, "inst-1") // one client at a time, as QEMU serves it
	other := startGuest(t, dir, "inst-2")
	const grace = 5 * time.Second
	g1 := startServer(t, grace)
	g1.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock},
		Target{WorkspaceID: "ws-b", InstanceID: "inst-2", DataSocket: other}))
	addr := g1.Addr()
	held := connect(t, p, p.cred(t, addr, "ws-a", "inst-1"))
	if out, _, _ := run(t, held, nil, "echo", "before"); out != "before\n" {
		t.Fatalf("exec before the hand-over: %q", out)
	}
	// A process on the held connection runs across the switch.
	long, err := held.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}

	lp := startLoop(t, p, func() string { return addr }, "ws-a", "inst-1")
	lpOther := startLoop(t, p, func() string { return addr }, "ws-b", "inst-2")
	lp.waitMore(t, 20)
	t0 := time.Now()
	g2 := handOverInProcess(t, g1, grace)
	took := time.Since(t0)
	lp.waitMore(t, 50)
	lpOther.waitMore(t, 20)

	if g2.Addr() != addr {
		t.Fatalf("generation 2 listens on %s, want the handed-over %s", g2.Addr(), addr)
	}
	h1, err := AskHello(ctxT(t), g1.dir, 1)
	if err != nil || !h1.Draining || h1.Listening || h1.Connections != 1 {
		t.Fatalf("generation 1 after the hand-over: %+v, %v (want draining with its one connection)", h1, err)
	}
	// The held connection and its process are unaffected.
	if out, _, _ := run(t, held, nil, "echo", "during"); out != "during\n" {
		t.Fatalf("exec on the old generation's connection after the hand-over: %q", out)
	}
	if !g1.running() {
		t.Fatal("generation 1 returned while a connection was open")
	}
	fmt.Fprintln(long.Stdin, "it")
	long.Stdin.Close()
	b, _ := io.ReadAll(long.Stdout)
	if exit, err := long.Wait(); err != nil || exit.ExitCode != 0 || string(b) != "got it\n" {
		t.Fatalf("the process started before the hand-over: %q, %+v, %v", b, exit, err)
	}
	held.Close()
	t1 := time.Now()
	g1.returned(t, 10*time.Second, "generation 1 to return once its last connection ended")
	exitAfter := time.Since(t1)
	if !strings.Contains(g1.logs.String(), "data-plane generation drained") {
		t.Errorf("generation 1 did not log its drain:\n%s", g1.logs.String())
	}
	// The new generation owns the guest session now (the lent one was
	// given back) and goes on serving.
	lp.waitMore(t, 30)
	ok, failed, slowest := lp.finish()
	okOther, failedOther, _ := lpOther.finish()
	t.Logf("hand-over took %v; generation 1 returned %v after its last connection; loop: %d ok, %d failed, slowest round %v; other workspace: %d ok, %d failed",
		took.Round(time.Microsecond), exitAfter.Round(time.Millisecond), ok, len(failed), slowest.Round(time.Millisecond), okOther, len(failedOther))
	if len(failed)+len(failedOther) > 0 {
		t.Fatalf("connections failed during the hand-over: %q %q", failed, failedOther)
	}
	logs := g2.logs.String()
	if !strings.Contains(logs, "data-plane guest session borrowed from the previous generation") {
		t.Errorf("generation 2 never borrowed the held Instance's session:\n%s", logs)
	}
	c := connect(t, p, p.cred(t, addr, "ws-a", "inst-1"))
	if err := echoOn(ctxT(t), c, "after"); err != nil {
		t.Fatal(err)
	}
	if g2.counters().Connections == 0 || g2.counters().BytesOut == 0 {
		t.Errorf("generation 2 counters %+v: want its connections counted", g2.counters())
	}
}

// TestEndClosesConnections: a generation the node ends closes its
// connections at once and returns, saying how many it closed.
func TestEndClosesConnections(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	s := startServer(t, time.Minute)
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if err := End(ctxT(t), s.dir, s.gen); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c.Done(), 5*time.Second, "the connection to be closed")
	s.returned(t, 5*time.Second, "an ended generation to return")
	if logs := s.logs.String(); !strings.Contains(logs, "closed=1 ") || !strings.Contains(logs, "the node ended this generation") {
		t.Fatalf("log does not report one closed connection:\n%s", logs)
	}
}

// TestDrainWithoutConnections: a draining generation with nothing open
// returns at once; one waiting for its socket takes none once draining.
func TestDrainWithoutConnections(t *testing.T) {
	s := startServer(t, time.Minute)
	if err := Drain(ctxT(t), s.dir, s.gen); err != nil {
		t.Fatal(err)
	}
	s.returned(t, 5*time.Second, "an idle drained generation to return")
}

// TestListenerChecked: a generation takes only a listening TCP socket of
// its own address.
func TestListenerChecked(t *testing.T) {
	a := startServer(t, time.Second)
	b := startServer(t, time.Second, func(c *Config) {
		c.SocketDir, c.Generation, c.AwaitListener, c.Listen = a.dir, 2, true, "127.0.0.1:1"
	})
	ln, err := TakeListener(ctxT(t), a.dir, a.gen)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = SendListener(ctxT(t), b.dir, b.gen, ln)
	if err == nil || !strings.Contains(err.Error(), "not to 127.0.0.1:1") {
		t.Fatalf("a socket of another address = %v", err)
	}
	if h, _ := AskHello(ctxT(t), b.dir, b.gen); h.Listening {
		t.Fatal("the generation listens on a socket it refused")
	}
}

// TestThirdSwitchEndsTheDrainingOne: with generation 1 draining and
// lending its guest session to generation 2, a switch to generation 3
// ends generation 1 (its connection is cut); generation 2's own connection
// moves from the lost lent session to a session of its own with the same
// guest boot, then lends it to generation 3 while it drains.
func TestThirdSwitchEndsTheDrainingOne(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	const grace = 5 * time.Second
	g1 := startServer(t, grace)
	g1.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	addr := g1.Addr()
	held1 := connect(t, p, p.cred(t, addr, "ws-a", "inst-1"))
	if err := echoOn(ctxT(t), held1, "one"); err != nil {
		t.Fatal(err)
	}
	g2 := handOverInProcess(t, g1, grace)
	held2 := connect(t, p, p.cred(t, addr, "ws-a", "inst-1"))
	if err := echoOn(ctxT(t), held2, "two"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(g2.logs.String(), "borrowed from the previous generation") {
		t.Fatalf("generation 2 did not borrow generation 1's session:\n%s", g2.logs.String())
	}

	// The node ends generation 1 before generation 2 drains.
	if err := End(ctxT(t), g1.dir, g1.gen); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, held1.Done(), 5*time.Second, "generation 1's connection to be cut")
	g1.returned(t, 5*time.Second, "the ended generation 1 to return")
	if err := echoOn(ctxT(t), held2, "moved"); err != nil {
		t.Fatalf("generation 2's connection after generation 1 ended: %v", err)
	}
	select {
	case <-held2.Done():
		t.Fatal("generation 2's connection was closed with generation 1's lent session")
	default:
	}

	lp := startLoop(t, p, func() string { return addr }, "ws-a", "inst-1")
	lp.waitMore(t, 10)
	g3 := handOverInProcess(t, g2, grace)
	lp.waitMore(t, 30)
	if err := echoOn(ctxT(t), held2, "draining"); err != nil {
		t.Fatal(err)
	}
	held2.Close()
	g2.returned(t, 10*time.Second, "generation 2 to return once its connection ended")
	lp.waitMore(t, 30)
	ok, failed, slowest := lp.finish()
	t.Logf("loop across the second hand-over: %d ok, %d failed, slowest round %v", ok, len(failed), slowest.Round(time.Millisecond))
	if len(failed) > 0 {
		t.Fatalf("connections failed: %q", failed)
	}
	if !strings.Contains(g3.logs.String(), "borrowed from the previous generation") {
		t.Errorf("generation 3 did not borrow generation 2's session:\n%s", g3.logs.String())
	}
}
