package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/kibotos/kibotos/vmm/guest/guesttest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A key's session to a sandbox is kept for its next requests, several at
// once; an idle one is closed after guestIdle, a broken one replaced, and
// all of them closed at the member's stop.
func TestGuestSessionsReuse(t *testing.T) {
	agent := guesttest.Dialer(t)
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
