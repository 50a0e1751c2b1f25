package e2b

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/vmm/guest/guesttest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// portGuest answers OpenPort with a guest agent of the test's process,
// whose port-forward reaches this host's loopback.
type portGuest struct {
	sandboxesOf
	dial func(context.Context) (*guestproto.Client, error)
}

func (p portGuest) OpenPort(ctx context.Context, token, id, remote string) (*guestproto.Client, error) {
	return p.dial(ctx)
}

// A request for <port>-<sandboxID>.<domain> reaches that port of the
// guest without the headers that opened the sandbox, and an upgrade to
// WebSocket becomes a connection both ways.
func TestPortTrafficUpgrades(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			w.Write([]byte("plain " + r.Host + " token=" + r.Header.Get(trafficHeader)))
			return
		}
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		rw.WriteString("echo " + line)
		rw.Flush()
	}))
	defer upstream.Close()
	_, port, _ := net.SplitHostPort(upstream.Listener.Addr().String())
	front := httptest.NewServer(NewHandler(Config{Sandboxes: portGuest{dial: guesttest.Dialer(t)}, Domain: "e2b.test"}))
	defer front.Close()
	host := port + "-sb.e2b.test"

	req, _ := http.NewRequest("GET", front.URL+"/", nil)
	req.Host = host
	req.Header.Set(trafficHeader, "secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "plain "+host+" token=" {
		t.Fatalf("plain request: %d %q, want the guest's answer for %s without the token", resp.StatusCode, body, host)
	}

	conn, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GET /ws HTTP/1.1\r\nHost: " + host + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
	br := bufio.NewReader(conn)
	status, err := br.ReadString('\n')
	if err != nil || !strings.Contains(status, strconv.Itoa(http.StatusSwitchingProtocols)) {
		t.Fatalf("upgrade: %q, %v", status, err)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "\r\n" {
			break
		}
	}
	conn.Write([]byte("hello through the upgrade\n"))
	if got, err := br.ReadString('\n'); err != nil || got != "echo hello through the upgrade\n" {
		t.Fatalf("after the upgrade: %q, %v", got, err)
	}
}
