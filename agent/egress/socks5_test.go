package egress

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// socksServer is a tiny SOCKS5 server that records every byte of each
// handshake it saw, answers success and then echoes.
type socksServer struct {
	ln         net.Listener
	user, pass string
	mu         sync.Mutex
	seen       [][]byte
	accepted   int
	open       int // connections not yet closed by either side
	// holdGreetings, when set, holds every greeting's answer until that
	// many greetings are waiting at once (see holdUntil).
	holdGreetings int
	greeted       int
	held          *sync.Cond // on mu
}

// holdUntil makes s answer no greeting until n of them wait at once: a
// client that dials one at a time never gets an answer.
func (s *socksServer) holdUntil(t testing.TB, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdGreetings, s.held = n, sync.NewCond(&s.mu)
	t.Cleanup(func() { // let the held ones go
		s.mu.Lock()
		s.holdGreetings = 0
		s.held.Broadcast()
		s.mu.Unlock()
	})
}

// waitGreetings blocks while s holds greetings.
func (s *socksServer) waitGreetings() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		return
	}
	s.greeted++
	if s.greeted >= s.holdGreetings {
		s.holdGreetings = 0
		s.held.Broadcast()
	}
	for s.holdGreetings > 0 {
		s.held.Wait()
	}
}

func newSocksServer(t testing.TB, user, pass string) *socksServer {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &socksServer{ln: ln, user: user, pass: pass}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.accepted++
			s.open++
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
	return s
}

func (s *socksServer) addr() string { return s.ln.Addr().String() }

func (s *socksServer) connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

func (s *socksServer) openConnections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

func (s *socksServer) handshakes() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.seen...)
}

func (s *socksServer) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		s.open--
		s.mu.Unlock()
	}()
	var rec bytes.Buffer
	r := io.TeeReader(c, &rec)
	read := func(n int) []byte {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil
		}
		return b
	}
	hdr := read(2)
	if hdr == nil {
		return
	}
	methods := read(int(hdr[1]))
	s.waitGreetings()
	want := byte(socksNoAuth)
	if s.user != "" {
		want = socksUserPass
	}
	if !bytes.Contains(methods, []byte{want}) {
		c.Write([]byte{5, socksNoMethod})
		return
	}
	c.Write([]byte{5, want})
	if want == socksUserPass {
		v := read(2)
		if v == nil {
			return
		}
		user := read(int(v[1]))
		pl := read(1)
		if pl == nil {
			return
		}
		pass := read(int(pl[0]))
		if string(user) != s.user || string(pass) != s.pass {
			c.Write([]byte{1, 1})
			return
		}
		c.Write([]byte{1, 0})
	}
	req := read(4)
	if req == nil {
		return
	}
	n := 4
	if req[3] == socksIPv6 {
		n = 16
	}
	if read(n+2) == nil {
		return
	}
	s.mu.Lock()
	s.seen = append(s.seen, bytes.Clone(rec.Bytes()))
	s.mu.Unlock()
	// A domain-type bound address, so the client must read a variable tail.
	c.Write([]byte{5, 0, 0, socksDomain, 4, 'p', 'r', 'o', 'x', 0x04, 0x38})
	io.Copy(c, c)
}

// The exact bytes of a handshake (RFC 1928 / 1929) for IPv4 and IPv6
// destinations, with and without credentials.
func TestSocksHandshakeBytes(t *testing.T) {
	for _, tc := range []struct {
		name, user, pass string
		dst              netip.AddrPort
		want             []byte
	}{
		{"ipv4 no auth", "", "", netip.MustParseAddrPort("203.0.113.9:443"),
			[]byte{5, 1, 0, 5, 1, 0, 1, 203, 0, 113, 9, 0x01, 0xbb}},
		{"ipv6 no auth", "", "", netip.MustParseAddrPort("[2001:db8::7]:80"),
			append(append([]byte{5, 1, 0, 5, 1, 0, 4}, netip.MustParseAddr("2001:db8::7").AsSlice()...), 0, 80)},
		{"ipv4 user/pass", "alice", "s3cret", netip.MustParseAddrPort("198.51.100.4:8080"),
			[]byte{5, 1, 2, 1, 5, 'a', 'l', 'i', 'c', 'e', 6, 's', '3', 'c', 'r', 'e', 't', 5, 1, 0, 1, 198, 51, 100, 4, 0x1f, 0x90}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newSocksServer(t, tc.user, tc.pass)
			c, err := net.Dial("tcp", srv.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := socksHandshake(c, tc.dst, tc.user, tc.pass); err != nil {
				t.Fatal(err)
			}
			// The reply was read to its end: the next bytes are the echo.
			c.Write([]byte("x"))
			b := make([]byte, 1)
			if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
				t.Fatalf("after the handshake read %q, %v; want the echo", b, err)
			}
			got := srv.handshakes()
			if len(got) != 1 || !bytes.Equal(got[0], tc.want) {
				t.Fatalf("handshake bytes\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestSocksHandshakeRefusals(t *testing.T) {
	dst := netip.MustParseAddrPort("203.0.113.9:443")
	for _, tc := range []struct {
		name             string
		srvUser, srvPass string
		user, pass       string
		want             string
	}{
		{"wrong password", "alice", "s3cret", "alice", "nope", "refused the egress's username and password"},
		{"server wants auth", "alice", "s3cret", "", "", "requires authentication and the egress has no credentials"},
		{"server wants none", "", "", "alice", "s3cret", "accepts no username/password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newSocksServer(t, tc.srvUser, tc.srvPass)
			c, err := net.Dial("tcp", srv.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := socksHandshake(c, dst, tc.user, tc.pass); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("handshake: %v, want %q", err, tc.want)
			}
		})
	}
}

// microsocks is a real SOCKS5 server the test started (and kills by PID).
type microsocks struct {
	addr    string
	logPath string
}

func (m *microsocks) log() string {
	b, _ := os.ReadFile(m.logPath)
	return string(b)
}

// startMicrosocks runs microsocks on ip:port, in the network namespace at
// nsPath ("" for this one), with credentials when user is set; bind is
// the source address of its outgoing connections ("" for any).
func startMicrosocks(t testing.TB, nsPath, ip string, port int, user, pass, bind string) *microsocks {
	t.Helper()
	bin := testenv.LookPath(t, "microsocks", "microsocks")
	args := []string{"-i", ip, "-p", strconv.Itoa(port)}
	if user != "" {
		args = append(args, "-u", user, "-P", pass)
	}
	if bind != "" {
		args = append(args, "-b", bind)
	}
	// stdbuf: microsocks logs each connection with stdio, which would sit
	// in a buffer until exit. nsenter and stdbuf exec, keeping the PID.
	argv := append([]string{"stdbuf", "-oL", "-eL", bin}, args...)
	if nsPath != "" {
		argv = append([]string{"nsenter", "--net=" + nsPath, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	m := &microsocks{addr: net.JoinHostPort(ip, strconv.Itoa(port)), logPath: filepath.Join(t.TempDir(), "microsocks.log")}
	out, err := os.Create(m.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start microsocks: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill() // its own PID (nsenter execs microsocks)
		<-exited
	})
	testenv.WaitFor(t, 10*time.Second, "microsocks to listen on "+m.addr, func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("microsocks exited: %s", m.log())
		default:
		}
		return portListens(nsPath, port), ""
	})
	return m
}

// portListens reads /proc/net/tcp as the namespace sees it (no connection
// that microsocks would log).
func portListens(nsPath string, port int) bool {
	var out []byte
	var err error
	if nsPath == "" {
		out, err = os.ReadFile("/proc/net/tcp")
	} else {
		out, err = exec.Command("nsenter", "--net="+nsPath, "--", "cat", "/proc/net/tcp").Output()
	}
	if err != nil {
		return false
	}
	needle := fmt.Sprintf(":%04X 00000000:0000 0A", port)
	return bytes.Contains(out, []byte(needle))
}

// The SOCKS5 client against a real server, with and without credentials.
func TestSocksAgainstMicrosocks(t *testing.T) {
	target, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	dst := netip.MustParseAddrPort(target.Addr().String())
	for _, tc := range []struct {
		name, user, pass string
	}{{"no auth", "", ""}, {"user/pass", "alice", "s3cret"}} {
		t.Run(tc.name, func(t *testing.T) {
			port := testenv.Ports(t, 1)
			m := startMicrosocks(t, "", "127.0.0.1", port, tc.user, tc.pass, "")
			c, err := net.Dial("tcp", m.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if err := socksHandshake(c, dst, tc.user, tc.pass); err != nil {
				t.Fatalf("handshake: %v\n%s", err, m.log())
			}
			c.Write([]byte("ping"))
			b := make([]byte, 4)
			if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
				t.Fatalf("echo through microsocks: %q, %v", b, err)
			}
			if tc.user != "" {
				c2, err := net.Dial("tcp", m.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c2.Close()
				c2.SetDeadline(time.Now().Add(10 * time.Second))
				if err := socksHandshake(c2, dst, tc.user, "wrong"); err == nil {
					t.Fatal("microsocks took a wrong password")
				}
			}
		})
	}
}
