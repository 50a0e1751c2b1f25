package guest

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// frozenLink relays a host connection to the agent and can stop moving
// bytes either way, as a guest whose vCPUs are stopped does.
type frozenLink struct {
	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
}

func (l *frozenLink) set(frozen bool) {
	l.mu.Lock()
	l.frozen = frozen
	l.mu.Unlock()
	l.thawed.Broadcast()
}

func (l *frozenLink) copy(dst io.WriteCloser, src io.Reader) {
	defer dst.Close() // the other end sees the session end
	b := make([]byte, 32<<10)
	for {
		n, err := src.Read(b)
		l.mu.Lock()
		for l.frozen {
			l.thawed.Wait()
		}
		l.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(b[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dialFrozen dials the agent through a frozenLink, with a keepalive of
// 50 ms whose pings time out after 300 ms.
func dialFrozen(t *testing.T, h *harness) (*guestproto.Client, *frozenLink) {
	t.Helper()
	guestSide := h.plug()
	hostSide, relay := net.Pipe()
	l := &frozenLink{}
	l.thawed = sync.NewCond(&l.mu)
	go l.copy(guestSide, relay)
	go l.copy(relay, guestSide)
	t.Cleanup(func() { l.set(false); relay.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := guestproto.DialWith(ctx, hostSide, guestproto.DialOptions{KeepAlive: 50 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, l
}

// A session whose guest stops answering ends at its first unanswered
// keepalive ping; one held (a guest the node stopped on purpose) outlasts
// many pings' timeouts and works once released.
func TestKeepAliveHold(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	c, link := dialFrozen(t, h)
	c.Hold()
	link.set(true)
	select {
	case <-c.Done():
		t.Fatal("a held session ended while its guest was stopped")
	case <-time.After(time.Second):
	}
	link.set(false)
	c.Release()
	if out, _, exit := run(t, c, nil, "echo", "thawed"); out != "thawed\n" || exit.ExitCode != 0 {
		t.Fatalf("after release: %q %+v", out, exit)
	}
	c.Close() // the agent serves one session at a time

	c2, link2 := dialFrozen(t, h)
	link2.set(true)
	select {
	case <-c2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a session whose guest stopped answering did not end")
	}
}
