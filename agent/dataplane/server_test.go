package dataplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// run execs argv through c with stdin and returns stdout, stderr and the exit.
func run(t *testing.T, c *guestproto.Client, stdin []byte, argv ...string) (string, string, guestproto.ExecExit) {
	t.Helper()
	p, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: argv, Stdin: stdin != nil})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	defer p.Close()
	if stdin != nil {
		go func() {
			p.Stdin.Write(stdin)
			p.Stdin.Close()
		}()
	}
	var out, errb bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errb, p.Stderr); close(done) }()
	io.Copy(&out, p.Stdout)
	<-done
	exit, err := p.Wait()
	if err != nil {
		t.Fatalf("exec %q: wait: %v", argv, err)
	}
	return out.String(), errb.String(), exit
}

func TestExecThroughDataPlane(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	s := startServer(t, time.Second)
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))

	if info := c.Info(); info.BootID != "boot-inst-1" || info.Has(guestproto.CapConfigure) || info.Has(guestproto.CapStop) || !info.Has(guestproto.CapExec) {
		t.Fatalf("handshake info %+v: want the guest's boot id, exec, and no configure/stop", info)
	}
	if out, _, exit := run(t, c, nil, "echo", "hello"); out != "hello\n" || exit.ExitCode != 0 {
		t.Fatalf("echo: %q, exit %+v", out, exit)
	}
	if _, errOut, exit := run(t, c, nil, "sh", "-c", "echo oops >&2; exit 7"); exit.ExitCode != 7 || errOut != "oops\n" {
		t.Fatalf("exit code passthrough: exit %+v, stderr %q", exit, errOut)
	}
	// Binary-safe stdin/stdout, larger than yamux's window.
	in := make([]byte, 3<<20+17)
	rand.NewChaCha8([32]byte{1}).Read(in)
	out, _, exit := run(t, c, in, "cat")
	if exit.ExitCode != 0 || sha256.Sum256([]byte(out)) != sha256.Sum256(in) {
		t.Fatalf("cat: %d bytes back of %d, exit %+v", len(out), len(in), exit)
	}
	// A signal reaches the process.
	proc, err := c.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, proc.Stdout)
	go io.Copy(io.Discard, proc.Stderr)
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("sleep did not end after SIGTERM")
	}
	if exit, _ := proc.Wait(); exit.Signal != int(syscall.SIGTERM) {
		t.Fatalf("sleep after SIGTERM: exit %+v", exit)
	}
	// Files and stat.
	path := filepath.Join(t.TempDir(), "f")
	if _, err := c.WriteFile(ctxT(t), path, 0o640, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.Stat(ctxT(t), path); err != nil || fi.Size != 4 || fi.Mode.Perm() != 0o640 {
		t.Fatalf("stat: %+v, %v", fi, err)
	}
	if _, err := c.Stat(ctxT(t), path+".missing"); !isCode(err, guestproto.CodeNotFound) {
		t.Fatalf("stat of a missing file: %v, want not_found", err)
	}
	// guest-info is answered with the data plane's view too.
	if info, err := c.GuestInfo(ctxT(t)); err != nil || info.Has(guestproto.CapConfigure) || info.BootID != "boot-inst-1" {
		t.Fatalf("guest-info: %+v, %v", info, err)
	}
	// Calls that act on the whole guest are not relayed.
	if err := c.Configure(ctxT(t), guestproto.ConfigureRequest{Hostname: "x"}); !isCode(err, guestproto.CodeUnsupported) {
		t.Fatalf("configure through the data plane: %v, want unsupported", err)
	}
	if _, err := c.Stop(ctxT(t), 0); !isCode(err, guestproto.CodeUnsupported) {
		t.Fatalf("stop through the data plane: %v, want unsupported", err)
	}
	// The guest is still there after the refused stop.
	if out, _, _ := run(t, c, nil, "echo", "still"); out != "still\n" {
		t.Fatalf("after refused stop: %q", out)
	}
	// Two client connections share the one guest session.
	c2 := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c2, nil, "echo", "two"); out != "two\n" {
		t.Fatalf("second connection: %q", out)
	}
}

func isCode(err error, code string) bool {
	var ge *guestproto.Error
	return errors.As(err, &ge) && ge.Code == code
}

func TestPortForwardThroughDataPlane(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	s := startServer(t, time.Second)
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if !c.Info().Has(guestproto.CapPortForward) {
		// The guest here is this build's own agent (guest.Serve), which
		// announces port-forward: not announcing it is a regression.
		t.Fatalf("the in-process guest agent does not announce %s: %v", guestproto.CapPortForward, c.Info().Capabilities)
	}
	// A server in the "guest" (the in-process agent runs on this host)
	// that answers after the client finished sending: the half-close has
	// to cross the relay.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn)
		conn.Write(bytes.ToUpper(b))
	}()
	fc, err := c.PortForward(ctxT(t), "", ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	fc.Write([]byte("ping"))
	fc.Close() // half-close: the answer still comes
	fc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(fc)
	if err != nil || string(b) != "PING" {
		t.Fatalf("port forward answered %q, %v", b, err)
	}
}

func TestFileRoundTrip100MiB(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	s := startServer(t, time.Second)
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))

	const size = 100 << 20
	path := filepath.Join(t.TempDir(), "big")
	sum := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{7}), size), sum)
	t0 := time.Now()
	fi, err := c.WriteFile(ctxT(t), path, 0o600, src)
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(t0)
	if fi.Size != size {
		t.Fatalf("wrote %d bytes, want %d", fi.Size, size)
	}
	// Counted as relayed, client to guest: the file and its framing.
	if in := s.counters().BytesIn; in < size {
		t.Errorf("bytes in after a 100 MiB write: %d", in)
	}
	back := sha256.New()
	t0 = time.Now()
	if _, err := c.ReadFile(ctxT(t), path, back); err != nil {
		t.Fatal(err)
	}
	read := time.Since(t0)
	if !bytes.Equal(sum.Sum(nil), back.Sum(nil)) {
		t.Fatal("the file read back differs from the file written")
	}
	onDisk, _ := os.ReadFile(path)
	if d := sha256.Sum256(onDisk); !bytes.Equal(d[:], sum.Sum(nil)) {
		t.Fatal("the file on disk differs from the file written")
	}
	mib := float64(size) / (1 << 20)
	t.Logf("100 MiB through the data plane: write %v (%.0f MiB/s), read %v (%.0f MiB/s)",
		wrote.Round(time.Millisecond), mib/wrote.Seconds(), read.Round(time.Millisecond), mib/read.Seconds())
}

func TestRefusedCredentials(t *testing.T) {
	p := newPKI(t, "node-a")
	dir := t.TempDir()
	sockA := startGuest(t, dir, "inst-a")
	s := startServer(t, time.Second)
	s.push(t, p.state(
		Target{WorkspaceID: "ws-a", InstanceID: "inst-a", DataSocket: sockA},
		Target{WorkspaceID: "ws-b", InstanceID: "inst-b", DataSocket: filepath.Join(dir, "inst-b.sock")},
	))
	other := newPKI(t, "node-a") // another cluster: same node name, other CA key
	now := time.Now()
	claims := func(ws, inst, node string, iat, exp time.Time) credential.Claims {
		return credential.Claims{WorkspaceID: ws, InstanceID: inst, NodeID: node, IssuedAt: iat, ExpiresAt: exp}
	}
	valid := claims("ws-a", "inst-a", "node-a", now, now.Add(time.Minute))
	tests := []struct {
		name string
		key  []byte
		c    credential.Claims
		mut  func(string) string
		code string
		says string
	}{
		{"forged", other.signKey, valid, nil, CodeForged, "not signed by this cluster's ctrl"},
		{"tampered", p.signKey, valid, func(tok string) string { return tok[:len(tok)-3] + "AAA" }, CodeForged, "bad signature"},
		{"expired", p.signKey, claims("ws-a", "inst-a", "node-a", now.Add(-time.Hour), now.Add(-time.Minute)), nil, CodeExpired, "request a new one"},
		{"malformed", p.signKey, valid, func(string) string { return "not-a-credential" }, CodeMalformed, "malformed"},
		{"wrong workspace: A naming B's instance", p.signKey, claims("ws-a", "inst-b", "node-a", now, now.Add(time.Minute)), nil, CodeNoTarget, "workspace ws-a runs instance inst-a"},
		{"unknown workspace", p.signKey, claims("ws-z", "inst-a", "node-a", now, now.Add(time.Minute)), nil, CodeNoTarget, "workspace ws-z has no running instance on node node-a"},
		{"other node", p.signKey, claims("ws-a", "inst-a", "node-b", now, now.Add(time.Minute)), nil, CodeWrongNode, "credential is for node node-b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cred := p.credWith(t, tc.key, s.Addr(), tc.c)
			if tc.mut != nil {
				cred.Credential = tc.mut(cred.Credential)
			}
			cred.NodeID = "node-a" // the address is node-a's: TLS passes, the credential is judged
			c, err := Connect(ctxT(t), cred, p.pool)
			if err == nil {
				c.Close()
				t.Fatal("connection accepted")
			}
			var re *RefusedError
			if !errors.As(err, &re) || re.Code != tc.code {
				t.Fatalf("Connect = %v, want refusal %s", err, tc.code)
			}
			if !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("refusal %q does not say %q in one line", err, tc.says)
			}
		})
	}
	t.Run("server of another node", func(t *testing.T) {
		// A valid credential for node-b sent to node-a's address never
		// leaves the client: the certificate is not node-b's.
		cred := p.credWith(t, p.signKey, s.Addr(), claims("ws-a", "inst-a", "node-b", now, now.Add(time.Minute)))
		_, err := Connect(ctxT(t), cred, p.pool)
		if err == nil || !strings.Contains(err.Error(), "the address belongs to node node-a, not to node node-b") {
			t.Fatalf("Connect to the wrong node = %v", err)
		}
	})
	t.Run("server of another cluster", func(t *testing.T) {
		_, err := Connect(ctxT(t), p.cred(t, s.Addr(), "ws-a", "inst-a"), other.pool)
		if err == nil || !strings.Contains(err.Error(), "is not valid for this cluster") {
			t.Fatalf("Connect with another cluster's CA = %v", err)
		}
	})
	// The good credential still works after all that.
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-a"))
	if out, _, _ := run(t, c, nil, "echo", "ok"); out != "ok\n" {
		t.Fatalf("echo: %q", out)
	}
	// Every refusal was counted by its code, and the hello carries it.
	want := map[string]uint64{CodeForged: 2, CodeExpired: 1, CodeMalformed: 1, CodeNoTarget: 2, CodeWrongNode: 1}
	got := s.hello().Counters
	for code, n := range want {
		if got.Refused[code] != n {
			t.Errorf("refusals %s: %d, want %d (all: %v)", code, got.Refused[code], n, got.Refused)
		}
	}
	if got.Connections < uint64(len(want)+1) || got.BytesOut == 0 {
		t.Errorf("counters %+v: want every connection and the echo's output counted", got)
	}
}

func TestNoStateYet(t *testing.T) {
	p := newPKI(t, "node-a")
	s := startServer(t, time.Second)
	// Without a certificate the TLS handshake cannot complete.
	if _, err := Connect(ctxT(t), p.cred(t, s.Addr(), "ws-a", "inst-a"), p.pool); err == nil {
		t.Fatal("connection accepted before the node delivered any state")
	}
	// A state the process cannot use is refused whole, with the reason.
	bad := p.state()
	bad.PublicKey = bad.PublicKey[:5]
	if err := PushState(ctxT(t), s.dir, 1, bad); err == nil || !strings.Contains(err.Error(), "verification key is 5 bytes") {
		t.Fatalf("push of a bad key = %v", err)
	}
	h, err := AskHello(ctxT(t), s.dir, 1)
	if err != nil || h.StateApplied || h.Generation != 1 || h.Address != s.Addr() || h.PID != os.Getpid() {
		t.Fatalf("hello = %+v, %v", h, err)
	}
}

func TestTargetRemovedClosesConnections(t *testing.T) {
	p := newPKI(t, "node-a")
	dir := t.TempDir()
	sockA, sockB := startGuest(t, dir, "inst-a"), startGuest(t, dir, "inst-b")
	s := startServer(t, time.Second)
	ta := Target{WorkspaceID: "ws-a", InstanceID: "inst-a", DataSocket: sockA}
	tb := Target{WorkspaceID: "ws-b", InstanceID: "inst-b", DataSocket: sockB}
	s.push(t, p.state(ta, tb))
	ca := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-a"))
	cb := connect(t, p, p.cred(t, s.Addr(), "ws-b", "inst-b"))
	// A running exec on the connection that loses its target ends too.
	proc, err := ca.Exec(ctxT(t), guestproto.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Close()

	s.push(t, p.state(tb))
	waitClosed(t, ca.Done(), 10*time.Second, "the connection of the removed target to close")
	waitClosed(t, proc.Done(), 10*time.Second, "the exec of the removed target to end on the client")
	if _, err := Connect(ctxT(t), p.cred(t, s.Addr(), "ws-a", "inst-a"), p.pool); err == nil || !strings.Contains(err.Error(), "no running instance") {
		t.Fatalf("connect to the removed target = %v", err)
	}
	// The other Workspace is untouched.
	if out, _, _ := run(t, cb, nil, "echo", "b"); out != "b\n" {
		t.Fatalf("other workspace: %q", out)
	}
	// A new execution of ws-b (new instance) cuts the old one's connections.
	s.push(t, p.state(Target{WorkspaceID: "ws-b", InstanceID: "inst-b2", DataSocket: sockB}))
	waitClosed(t, cb.Done(), 10*time.Second, "the connection to the replaced instance to close")
	if s.Connections() != 0 {
		testenv.WaitFor(t, 20*time.Second, "no connections left", func() (bool, string) {
			n := s.Connections()
			return n == 0, fmt.Sprintf("%d connections", n)
		})
	}
}

func TestGracefulStop(t *testing.T) {
	p := newPKI(t, "node-a")
	sock := startGuest(t, t.TempDir(), "inst-1")
	const grace = 2 * time.Second
	s := startServer(t, grace)
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: sock}))
	stays := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	leaves := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	addr := s.Addr()

	t0 := time.Now()
	s.cancel()
	// No new connections once stopping ...
	testenv.WaitFor(t, 20*time.Second, "the listener to close", func() (bool, string) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true, ""
		}
		c.Close()
		return false, "a dial of " + addr + " connected"
	})
	// ... but the open ones keep working during the grace.
	if out, _, _ := run(t, stays, nil, "echo", "during grace"); out != "during grace\n" {
		t.Fatalf("exec during the grace: %q", out)
	}
	leaves.Close() // ends on its own: not counted as closed
	waitClosed(t, stays.Done(), grace+10*time.Second, "the remaining connection to be closed")
	if el := time.Since(t0); el < grace {
		t.Fatalf("the remaining connection was closed after %v, before the grace of %v", el, grace)
	}
	s.returned(t, 10*time.Second, "Run to return after the grace")
	logs := s.logs.String()
	if !strings.Contains(logs, `msg="data-plane connections closed"`) || !strings.Contains(logs, "closed=1 ") {
		t.Fatalf("log does not report one closed connection:\n%s", logs)
	}
	if _, err := os.Stat(ControlSocket(s.dir, 1)); !os.IsNotExist(err) {
		t.Fatalf("control socket left behind: %v", err)
	}
}

func TestGuestRestartRedials(t *testing.T) {
	p := newPKI(t, "node-a")
	path := filepath.Join(t.TempDir(), "inst-1.sock")
	_, stopGuest := startGuestAt(t, path, "boot-1")
	s := startServer(t, time.Second, func(c *Config) { c.GuestTimeout = time.Second })
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: path}))
	c1 := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c1, nil, "echo", "one"); out != "one\n" {
		t.Fatalf("exec: %q", out)
	}
	// The guest goes away: connections relaying to its session end.
	stopGuest()
	waitClosed(t, c1.Done(), 10*time.Second, "the connection to end with the guest session")
	if _, err := Connect(ctxT(t), p.cred(t, s.Addr(), "ws-a", "inst-1"), p.pool); err == nil {
		t.Fatal("connected with no guest")
	} else if re := (*RefusedError)(nil); !errors.As(err, &re) || re.Code != CodeUnavailable {
		t.Fatalf("connect with no guest = %v, want %s", err, CodeUnavailable)
	}
	// It comes back (same socket): the next connection gets a new session.
	startGuestAt(t, path, "boot-2")
	c2 := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if c2.Info().BootID != "boot-2" {
		t.Fatalf("boot id %q, want the new guest's", c2.Info().BootID)
	}
	if out, _, _ := run(t, c2, nil, "echo", "two"); out != "two\n" {
		t.Fatalf("exec after the guest came back: %q", out)
	}
}

// A guest that restarted is not served until the node has reconfigured
// it and pushed its new boot: its filesystem is not mounted before, and
// an exec would find no shell. A connection that waits meanwhile is
// served once the push comes.
func TestRestartedGuestServedOnceReconfigured(t *testing.T) {
	p := newPKI(t, "node-a")
	path := filepath.Join(t.TempDir(), "inst-1.sock")
	_, stopGuest := startGuestAt(t, path, "boot-1")
	s := startServer(t, time.Second, func(c *Config) { c.GuestTimeout = 2 * time.Second })
	target := Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: path, GuestBoot: "boot-1"}
	s.push(t, p.state(target))
	c1 := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c1, nil, "echo", "one"); out != "one\n" {
		t.Fatalf("exec: %q", out)
	}
	stopGuest()
	waitClosed(t, c1.Done(), 10*time.Second, "the connection to end with the guest session")
	startGuestAt(t, path, "boot-2")
	_, err := Connect(ctxT(t), p.cred(t, s.Addr(), "ws-a", "inst-1"), p.pool)
	if re := (*RefusedError)(nil); !errors.As(err, &re) || re.Code != CodeUnavailable || !strings.Contains(err.Error(), "restarted (boot boot-2) and its node has not reconfigured it yet") {
		t.Fatalf("connect to the restarted guest before the node reconfigured it = %v; want %s saying it restarted", err, CodeUnavailable)
	}
	// A connection waiting when the node pushes the new boot is served.
	type connected struct {
		c   *guestproto.Client
		err error
	}
	waiting := make(chan connected, 1)
	cred := p.cred(t, s.Addr(), "ws-a", "inst-1")
	go func() {
		c, err := Connect(ctxT(t), cred, p.pool)
		waiting <- connected{c, err}
	}()
	target.GuestBoot = "boot-2"
	s.push(t, p.state(target))
	r := <-waiting
	if r.err != nil {
		t.Fatalf("connect across the push of the new boot: %v", r.err)
	}
	defer r.c.Close()
	if out, _, _ := run(t, r.c, nil, "echo", "two"); out != "two\n" {
		t.Fatalf("exec on the reconfigured guest: %q", out)
	}
}

// A hello the guest never answers (a guest agent that closes its port
// drops what the port held) costs a second hello on the same connection,
// not the connection: a virtio-serial port behind QEMU's socket delivers
// the next one, and a new connection's hello can reach the guest before
// the end of the old one does, which ends the session the guest just
// began for it (an exec failed 25 s later, at the keepalive).
func TestLostHelloSentAgainOnTheSameConnection(t *testing.T) {
	p := newPKI(t, "node-a")
	path := filepath.Join(t.TempDir(), "inst-1.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	// The chardev serves one client; the port is the guest's end of it.
	var (
		mu   sync.Mutex
		host net.Conn
	)
	var accepted atomic.Int32
	dropped := make(chan int, 1)
	opener := func() (io.ReadWriteCloser, error) { // the agent opens from one goroutine
		mu.Lock()
		h := host
		mu.Unlock()
		if h == nil {
			c, err := ln.Accept()
			if err != nil {
				return nil, err
			}
			mu.Lock()
			host, h = c, c
			mu.Unlock()
			accepted.Add(1)
			go func() { // a second connection is counted, never served
				if c, err := ln.Accept(); err == nil {
					accepted.Add(1)
					c.Close()
				}
			}()
			// The first open: the hello arrives, the port is closed
			// unread (the agent saw no host a moment before), and what
			// it held is gone.
			b := make([]byte, guestproto.HelloSize)
			n, _ := io.ReadFull(h, b)
			dropped <- n
		}
		return portEnd{h}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- guest.Serve(ctx, opener, guest.Options{BootID: "boot-1"}) }()
	t.Cleanup(func() {
		cancel()
		mu.Lock()
		if host != nil {
			host.Close() // the port's close leaves the host end open
		}
		mu.Unlock()
		ln.Close()
		<-done
	})
	s := startServer(t, time.Second, func(c *Config) { c.GuestTimeout = 4 * time.Second })
	s.push(t, p.state(Target{WorkspaceID: "ws-a", InstanceID: "inst-1", DataSocket: path}))
	c := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-1"))
	if out, _, _ := run(t, c, nil, "echo", "answered"); out != "answered\n" {
		t.Fatalf("exec: %q", out)
	}
	if n := <-dropped; n != guestproto.HelloSize {
		t.Errorf("the first hello: %d bytes dropped, want %d", n, guestproto.HelloSize)
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("the data plane made %d connections to the socket, want 1", n)
	}
}

// portEnd is the guest's end of a virtio-serial port over the host's
// connection: closing it does not disconnect the host.
type portEnd struct{ net.Conn }

func (portEnd) Close() error { return nil }
