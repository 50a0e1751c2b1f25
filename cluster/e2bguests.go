package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// guestSessions keeps the guest sessions the sandbox API opened, one per
// key and sandbox, for the next requests of that key to that sandbox: an
// SDK sends one request per command, file or signal, and each would
// otherwise pay for a credential, a TLS handshake with the node's data
// plane and the guest's hello. Every request still has its token checked
// and its key looked up first (e2bSandboxes.Open); a session that breaks
// (the sandbox paused, stopped, moved) is dropped and the next request
// opens a new one. Idle ones are closed after guestIdle.
type guestSessions struct {
	mu     sync.Mutex
	m      map[string]*guestSession
	closed bool
}

type guestSession struct {
	gc    *guestproto.Client
	users int
	last  time.Time
}

// guestIdle is how long an unused session is kept.
const guestIdle = 30 * time.Second

// get is the live session of key, counted as used; nil when none.
func (g *guestSessions) get(key string) *guestproto.Client {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.m[key]
	if s == nil {
		return nil
	}
	select {
	case <-s.gc.Done():
		if s.users == 0 {
			delete(g.m, key)
		}
		return nil
	default:
	}
	s.users++
	return s.gc
}

// put keeps gc, just opened and used once, as key's session unless one
// was kept meanwhile or the cache is closed; it says whether it did.
func (g *guestSessions) put(key string, gc *guestproto.Client) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.m[key] != nil {
		return false
	}
	if g.m == nil {
		g.m = map[string]*guestSession{}
	}
	g.m[key] = &guestSession{gc: gc, users: 1}
	return true
}

// release ends one use of key's session gc.
func (g *guestSessions) release(key string, gc *guestproto.Client) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.m[key]; s != nil && s.gc == gc {
		s.users--
		s.last = time.Now()
	}
}

// run closes idle and broken sessions until stop, then all of them.
func (g *guestSessions) run(stop <-chan struct{}) {
	t := time.NewTicker(guestIdle / 3)
	defer t.Stop()
	for {
		select {
		case <-stop:
			g.mu.Lock()
			g.closed = true
			all := g.m
			g.m = nil
			g.mu.Unlock()
			for _, s := range all {
				s.gc.Close()
			}
			return
		case now := <-t.C:
			g.sweep(now)
		}
	}
}

func (g *guestSessions) sweep(now time.Time) {
	g.mu.Lock()
	var idle []*guestproto.Client
	for k, s := range g.m {
		broken := false
		select {
		case <-s.gc.Done():
			broken = true
		default:
		}
		if s.users == 0 && (broken || now.Sub(s.last) > guestIdle) {
			idle = append(idle, s.gc)
			delete(g.m, k)
		}
	}
	g.mu.Unlock()
	for _, gc := range idle {
		gc.Close()
	}
}

// open is key's kept session, or one dial opens; release ends its use
// (closing a session that was not kept).
func (g *guestSessions) open(ctx context.Context, key string, dial func(context.Context) (*guestproto.Client, error)) (*guestproto.Client, func(), error) {
	if gc := g.get(key); gc != nil {
		return gc, func() { g.release(key, gc) }, nil
	}
	gc, err := dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !g.put(key, gc) {
		return gc, func() { gc.Close() }, nil
	}
	return gc, func() { g.release(key, gc) }, nil
}
