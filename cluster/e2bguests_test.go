package cluster

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// guestAgent runs a guest agent in the test process and dials it: each
// call of the returned dial opens a new session over a new channel.
func guestAgent(t *testing.T) func(context.Context) (*guestproto.Client, error) {
	ports := make(chan io.ReadWriteCloser, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		guest.ServeChannels(ctx, guest.Options{BootID: "test", Logger: slog.New(slog.DiscardHandler)}, func(ctx context.Context) (io.ReadWriteCloser, error) {
			select {
			case c := <-ports:
				return c, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}, nil)
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(ctx context.Context) (*guestproto.Client, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		conn := func(fd int) net.Conn {
			f := os.NewFile(uintptr(fd), "socketpair")
			defer f.Close()
			c, _ := net.FileConn(f)
			return c
		}
		host, g := conn(fds[0]), conn(fds[1])
		t.Cleanup(func() { host.Close(); g.Close() })
		ports <- g
		return guestproto.Dial(ctx, host)
	}
}

// A key's session to a sandbox is kept for its next requests, several at
// once; an idle one is closed after guestIdle, a broken one replaced, and
// all of them closed at the member's stop.
func TestGuestSessionsReuse(t *testing.T) {
	agent := guestAgent(t)
	dials := 0
	dial := func(ctx context.Context) (*guestproto.Client, error) { dials++; return agent(ctx) }
	ctx := context.Background()
	var g guestSessions
	a, releaseA, err := g.open(ctx, "key\x00ws-1", dial)
	if err != nil {
		t.Fatal(err)
	}
	b, releaseB, err := g.open(ctx, "key\x00ws-1", dial)
	if err != nil || b != a || dials != 1 {
		t.Fatalf("a second request of the key: %p (first %p), %v, %d dials", b, a, err, dials)
	}
	if _, err := b.GuestInfo(ctx); err != nil {
		t.Fatal(err)
	}
	releaseA()
	g.sweep(time.Now().Add(2 * guestIdle))
	if _, err := a.GuestInfo(ctx); err != nil {
		t.Fatalf("a session in use was closed: %v", err)
	}
	releaseB()
	g.sweep(time.Now().Add(2 * guestIdle))
	<-a.Done()

	c, releaseC, err := g.open(ctx, "key\x00ws-1", dial)
	if err != nil || c == a || dials != 2 {
		t.Fatalf("after the idle one was closed: %v, %d dials", err, dials)
	}
	releaseC()
	c.Close() // broken, as by a pause
	d, releaseD, err := g.open(ctx, "key\x00ws-1", dial)
	if err != nil || d == c || dials != 3 {
		t.Fatalf("after the kept one broke: %v, %d dials", err, dials)
	}
	releaseD()

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { g.run(stop); close(done) }()
	close(stop)
	<-done
	<-d.Done()
	e, releaseE, err := g.open(ctx, "key\x00ws-1", dial)
	if err != nil {
		t.Fatal(err)
	}
	releaseE() // not kept once stopped: closed at its release
	<-e.Done()
}
