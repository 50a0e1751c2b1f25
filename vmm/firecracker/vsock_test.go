package firecracker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeVsock listens where Firecracker's uds_path would be and runs serve
// on each connection after reading its first line (the CONNECT command),
// which it sends to got.
func fakeVsock(t *testing.T, serve func(c net.Conn, line string)) (string, <-chan string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "v.sock")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan string, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				got <- line
				serve(c, line)
			}()
		}
	}()
	return p, got
}

func TestVsockOK(t *testing.T) {
	p, got := fakeVsock(t, func(c net.Conn, line string) {
		// The guest's first bytes may arrive in the same segment as OK.
		io.WriteString(c, "OK 1073741824\nhello from guest")
		b := make([]byte, 4)
		io.ReadFull(c, b)
		c.Write(b)
	})
	c, err := DialVsock(ctxT(t), p, 52)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line := <-got; line != "CONNECT 52\n" {
		t.Errorf("command %q", line)
	}
	if c.HostPort != 1073741824 {
		t.Errorf("host port %d", c.HostPort)
	}
	b := make([]byte, len("hello from guest"))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "hello from guest" {
		t.Fatalf("read %q, %v", b, err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b[:4]); err != nil || string(b[:4]) != "ping" {
		t.Fatalf("echo %q, %v", b[:4], err)
	}
	// No deadline is left on the stream.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
}

func TestVsockBadReplies(t *testing.T) {
	for _, tc := range []struct {
		name, reply string
		want        string
		is          error
	}{
		{"garbage", "HTTP/1.1 400 Bad Request\r\n", `"OK <port>"`, nil},
		{"no port", "OK \n", `"OK <port>"`, nil},
		{"port too big", "OK 4294967296\n", "out of range", nil},
		{"long line", strings.Repeat("x", 100), "too long", nil},
		{"closed", "", "no guest program listens", ErrNoListener},
		{"closed mid-line", "OK 10", "no guest program listens", ErrNoListener},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := fakeVsock(t, func(c net.Conn, _ string) { io.WriteString(c, tc.reply) })
			c, err := DialVsock(ctxT(t), p, 1024)
			if err == nil {
				c.Close()
				t.Fatal("handshake succeeded")
			}
			var he *HandshakeError
			if !errors.As(err, &he) || he.Port != 1024 || he.Socket != p {
				t.Fatalf("error %v (%T), want *HandshakeError naming the socket and port", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want %q in it", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if !strings.HasPrefix(err.Error(), "vsock "+p+" port 1024: CONNECT handshake") {
				t.Errorf("error %q does not name the call", err)
			}
		})
	}
}

func TestVsockTimeout(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	p, _ := fakeVsock(t, func(c net.Conn, _ string) { <-release })
	t0 := time.Now()
	_, err := dialVsock(context.Background(), p, 1024, 150*time.Millisecond)
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
	if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "no complete answer within 150ms") {
		t.Errorf("error %v", err)
	}
}

func TestVsockContextDeadlineAndCancel(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	p, _ := fakeVsock(t, func(c net.Conn, _ string) { <-release })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := DialVsock(ctx, p, 1); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("deadline: error %v", err)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel2)
	t0 := time.Now()
	if _, err := DialVsock(ctx2, p, 1); err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("cancel: error %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("cancel took %v", d)
	}
}

func TestVsockNoSocket(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.sock")
	_, err := DialVsock(ctxT(t), p, 7)
	if err == nil || !strings.HasPrefix(err.Error(), "vsock "+p+" port 7: ") {
		t.Errorf("error %v", err)
	}
}
