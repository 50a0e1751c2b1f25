package guest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// tcpServer listens on 127.0.0.1 in the test process (the "guest" of the
// in-process agent) and hands each accepted connection to serve.
func tcpServer(t *testing.T, serve func(c *net.TCPConn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// forwardGoroutines counts the goroutines of port forwards: the agent's
// relays and the test servers' connection handlers. Counting by stack, not
// runtime.NumGoroutine, so goroutines the runtime or other tests start
// meanwhile (signal handling, a harness winding down) do not count.
func forwardGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:goruntime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "guest.relay") || strings.Contains(g, "guest.(*agent).portForward") || strings.Contains(g, "guest.tcpServer.func2.1") {
			n++
		}
	}
	return n
}

// refusedPort is a loopback port nothing listens on.
func refusedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

func guestErr(err error) *guestproto.Error {
	var ge *guestproto.Error
	if errors.As(err, &ge) {
		return ge
	}
	return nil
}

// Port forward over both channels: bytes both ways, each direction's
// half-close passed on while the other stays open, refused and invalid
// ports, and nothing left running afterwards.
func TestPortForward(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	node := h.dial()
	data := h.dialOn(h.plugData())
	for _, c := range []*guestproto.Client{node, data} {
		if !c.Info().Has(guestproto.CapPortForward) {
			t.Fatalf("capabilities %v lack %s", c.Info().Capabilities, guestproto.CapPortForward)
		}
	}
	ctx := ctxT(t)

	// The node writes, then half-closes; the server answers only after
	// it read EOF, so the answer proves the guest's CloseWrite.
	type got struct {
		n   int
		err error
	}
	received := make(chan got, 4)
	echoAfterEOF := tcpServer(t, func(c *net.TCPConn) {
		b, err := io.ReadAll(c)
		received <- got{len(b), err}
		fmt.Fprintf(c, "read %d bytes: %x", len(b), b[:min(len(b), 8)])
	})
	// This one writes and half-closes first.
	afterEOF := make(chan string, 1)
	bannerFirst := tcpServer(t, func(c *net.TCPConn) {
		c.Write([]byte("banner"))
		c.CloseWrite()
		b, _ := io.ReadAll(c)
		afterEOF <- string(b)
	})

	payload := make([]byte, 1<<20) // more than a yamux window
	rand.Read(payload)
	for _, c := range []*guestproto.Client{node, data} {
		conn, err := c.PortForward(ctx, "", echoAfterEOF)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(payload); err != nil {
			t.Fatal(err)
		}
		if n := forwardGoroutines(); n == 0 {
			t.Fatal("no forward goroutine counted while a forward is open: forwardGoroutines no longer matches their stacks")
		}
		conn.Close() // FIN: the write half only
		answer, done := collect(conn)
		wait(t, done, "the server's answer")
		if r := <-received; r.n != len(payload) || r.err != nil {
			t.Fatalf("server read %d bytes, %v; want %d then EOF", r.n, r.err, len(payload))
		}
		if want := fmt.Sprintf("read %d bytes: %x", len(payload), payload[:8]); answer.String() != want {
			t.Fatalf("answer %q, want %q", answer.String(), want)
		}
	}

	// The server half-closes first: the node reads to EOF and can still
	// write, and the server gets those bytes and then EOF.
	conn, err := data.PortForward(ctx, "127.0.0.1", bannerFirst)
	if err != nil {
		t.Fatal(err)
	}
	banner, done := collect(conn)
	wait(t, done, "EOF after the banner")
	if banner.String() != "banner" {
		t.Fatalf("banner %q", banner.String())
	}
	if _, err := conn.Write([]byte("still open")); err != nil {
		t.Fatalf("write after the guest side's EOF: %v", err)
	}
	conn.Close()
	select {
	case s := <-afterEOF:
		if s != "still open" {
			t.Fatalf("server read %q after its half-close, want %q", s, "still open")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server never saw the node's bytes and EOF")
	}

	// A port nobody listens on, and one out of range.
	_, err = data.PortForward(ctx, "", refusedPort(t))
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeFailed || !strings.Contains(ge.Message, "connection refused") {
		t.Fatalf("refused port: %v, want code %s and connection refused", err, guestproto.CodeFailed)
	}
	_, err = node.PortForward(ctx, "", 0)
	if ge := guestErr(err); ge == nil || ge.Code != guestproto.CodeInvalid {
		t.Fatalf("port 0: %v, want code %s", err, guestproto.CodeInvalid)
	}

	// Every relay and server goroutine ended.
	testenv.WaitFor(t, 20*time.Second, "the forwards' goroutines to end", func() (bool, string) {
		n := forwardGoroutines()
		return n == 0, fmt.Sprintf("%d forward goroutines", n)
	})
	out, _, _ := run(t, data, nil, "echo", "still serving")
	if out != "still serving\n" {
		t.Fatalf("exec after the forwards: %q", out)
	}
}

// A session that ends under a forward whose server stays silent and keeps
// its end open must not leave the relay behind: the guest closes the TCP
// connection and every goroutine of the forward ends.
func TestPortForwardSessionEnds(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The agent up (a node session answered), its data channel waiting
	// for a client.
	if _, err := h.dial().GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	data := h.dialOn(h.plugData())
	conn, err := data.PortForward(ctxT(t), "", l.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	// The connection waits in the listen backlog: accepting it here, not
	// in a goroutine of its own, keeps the goroutine count comparable.
	srv, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if _, err := conn.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(srv, b); err != nil || b[0] != 'x' {
		t.Fatalf("server read %q, %v", b, err)
	}
	data.Close()
	srv.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := srv.Read(b); err != io.EOF {
		t.Fatalf("server read %d bytes, %v after the session ended; want EOF", n, err)
	}
	testenv.WaitFor(t, 20*time.Second, "the forward's goroutines to end", func() (bool, string) {
		n := forwardGoroutines()
		return n == 0, fmt.Sprintf("%d forward goroutines", n)
	})

	// The data channel takes the next client.
	data2 := h.dialOn(h.plugData())
	if out, _, _ := run(t, data2, nil, "echo", "next"); out != "next\n" {
		t.Fatalf("exec on the next data session: %q", out)
	}
}

// Both channels at once with one process table; the data channel refuses
// the node's calls and announces only what it serves.
func TestDataChannel(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	node := h.dial()
	data := h.dialOn(h.plugData())
	ctx := ctxT(t)

	di := data.Info()
	for _, c := range []string{guestproto.CapExec, guestproto.CapPTY, guestproto.CapFiles, guestproto.CapPortForward} {
		if !di.Has(c) {
			t.Errorf("data channel capabilities %v lack %s", di.Capabilities, c)
		}
	}
	for _, c := range []string{guestproto.CapConfigure, guestproto.CapBindMount, guestproto.CapFreeze, guestproto.CapStop,
		guestproto.CapMountSerial, guestproto.CapGrowFS} {
		if di.Has(c) {
			t.Errorf("data channel announces %s, which it does not serve", c)
		}
		if !node.Info().Has(c) {
			t.Errorf("node channel capabilities %v lack %s", node.Info().Capabilities, c)
		}
	}
	if gi, err := data.GuestInfo(ctx); err != nil || gi.Has(guestproto.CapStop) || gi.BootID != "test-boot" {
		t.Errorf("guest-info on the data channel: %+v, %v", gi, err)
	}

	// exec and its exec-attach streams (stdin, stdout, stderr).
	out, errs, exit := run(t, data, []byte("in\n"), "sh", "-c", "echo data; cat; echo err >&2; exit 4")
	if out != "data\nin\n" || errs != "err\n" || exit.ExitCode != 4 {
		t.Fatalf("exec on the data channel: %q %q %+v", out, errs, exit)
	}
	// Files.
	if _, err := data.WriteFile(ctx, t.TempDir()+"/f", 0o600, strings.NewReader("file")); err != nil {
		t.Errorf("file-write on the data channel: %v", err)
	}

	// The node's calls are refused, by name, and refusing stop stops
	// nothing. The agent runs in the test process: the arguments would
	// change nothing of this host should a regression serve them.
	refused := map[string]error{}
	missing := t.TempDir() + "/missing"
	refused[guestproto.CallConfigure] = data.Configure(ctx, guestproto.ConfigureRequest{})
	refused[guestproto.CallSync] = data.Sync(ctx)
	refused[guestproto.CallFreeze] = data.Freeze(ctx, missing)
	refused[guestproto.CallThaw] = data.Thaw(ctx, missing)
	_, refused[guestproto.CallStop] = data.Stop(ctx, time.Second)
	_, refused[guestproto.CallGrowFS] = data.GrowFS(ctx, guestproto.GrowFSRequest{Path: missing})
	// Too little entropy: served by mistake, it would be refused for that
	// and touch nothing.
	refused[guestproto.CallIdentity] = data.SetIdentity(ctx, guestproto.IdentityRequest{Entropy: make([]byte, 8)})
	for call, err := range refused {
		ge := guestErr(err)
		want := call + " is only served on the node channel"
		if ge == nil || ge.Code != guestproto.CodeUnsupported || !strings.Contains(ge.Message, want) || strings.Contains(ge.Message, "\n") {
			t.Errorf("%s on the data channel: %v; want code %s and %q", call, err, guestproto.CodeUnsupported, want)
		}
	}
	if err := node.Sync(ctx); err != nil {
		t.Errorf("sync on the node channel: %v", err)
	}

	// One process table: a process started over the data channel is one
	// the node's Stop ends.
	p, err := data.Exec(ctx, guestproto.ExecRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := node.Stop(ctx, 5*time.Second)
	if err != nil || res.Terminated != 1 {
		t.Fatalf("stop over the node channel: %+v, %v; want the data channel's sleep terminated", res, err)
	}
	if exit, err := p.Wait(); err != nil || exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("the data channel's sleep: %+v, %v; want SIGTERM", exit, err)
	}
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("serve after stop: %v", err)
		}
		h.done <- nil // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not end after Stop with the data channel connected")
	}
}

// Either channel's sessions end and restart without disturbing the other:
// a process attached over the node channel keeps talking while the data
// channel's client goes and comes back, and the other way round.
func TestChannelsRestartIndependently(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	ctx := ctxT(t)
	node := h.dial()
	dataHost := h.plugData()
	data := h.dialOn(dataHost)

	// A cat over the node channel, echoing line by line.
	p, err := node.Exec(ctx, guestproto.ExecRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, _ := collect(p.Stdout)
	echo := func(line string) {
		t.Helper()
		if _, err := io.WriteString(p.Stdin, line+"\n"); err != nil {
			t.Fatalf("write to cat: %v", err)
		}
		testenv.WaitFor(t, 20*time.Second, "cat to echo "+line, func() (bool, string) {
			s := out.String()
			return strings.Contains(s, line+"\n"), fmt.Sprintf("%q", s)
		})
	}
	echo("before")

	// The data plane's process goes away: its session and connection end.
	data.Close()
	dataHost.Close()
	testenv.WaitFor(t, 20*time.Second, "the data session to end", func() (bool, string) {
		return strings.Contains(h.logs.String(), `msg="guest agent session ended" channel=data`), ""
	})
	echo("data gone")
	if r, _, _ := run(t, node, nil, "echo", "node"); r != "node\n" {
		t.Fatalf("exec on the node channel after the data channel ended: %q", r)
	}
	data = h.dialOn(h.plugData())
	if r, _, _ := run(t, data, nil, "echo", "data back"); r != "data back\n" {
		t.Fatalf("exec on the reconnected data channel: %q", r)
	}

	// And the node goes away while the data plane stays.
	node.Close()
	testenv.WaitFor(t, 20*time.Second, "the node session to end", func() (bool, string) {
		return strings.Contains(h.logs.String(), `msg="guest agent session ended" channel=node`), ""
	})
	if r, _, _ := run(t, data, nil, "echo", "node gone"); r != "node gone\n" {
		t.Fatalf("exec on the data channel after the node's session ended: %q", r)
	}
	node = h.dial()
	if r, _, _ := run(t, node, nil, "echo", "node back"); r != "node back\n" {
		t.Fatalf("exec on the node's next session: %q", r)
	}
}
