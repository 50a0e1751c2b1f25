package egress

import (
	"context"
	"net"
	"sync"
	"time"
)

// A warm pool keeps a few connections to one proxy revision already
// connected, greeted and authenticated, so a guest's connection costs one
// round trip to the proxy (the CONNECT) instead of three or four. That is
// what brings a proxied connect near a direct one when the proxy is not
// next door. It starts with the first connection through that proxy (a
// route that is never used opens nothing), and it is closed when a new
// Config or a drain replaces the route.
const (
	// warmMaxIdle is how long a warm connection is trusted: proxies time
	// out connections that send no request (Dante's negotiation timeout
	// is 30 s by default), and an expired one costs a failed try.
	warmMaxIdle = 10 * time.Second
	// warmBackoff bounds the retries of a proxy that cannot be warmed.
	warmBackoffMin = time.Second
	warmBackoffMax = 30 * time.Second
)

type warmConn struct {
	c    net.Conn
	born time.Time
}

type warmPool struct {
	p      *proxyRoute
	conns  chan warmConn
	kick   chan struct{}
	ctx    context.Context // ends when the pool is closed
	cancel context.CancelFunc
	start  sync.Once
}

// newWarmPool makes a pool of size connections for p; size 0 is none.
func newWarmPool(p *proxyRoute, size int) *warmPool {
	if size <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &warmPool{p: p, conns: make(chan warmConn, size), kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
}

// take returns a warm connection if one is ready, and has the pool
// refilled either way.
func (w *warmPool) take(s *Server) (net.Conn, bool) {
	if w == nil || w.ctx.Err() != nil {
		return nil, false
	}
	w.start.Do(func() { go w.fill(s) })
	defer w.wake()
	for {
		select {
		case wc := <-w.conns:
			if time.Since(wc.born) < warmMaxIdle {
				return wc.c, true
			}
			wc.c.Close()
		default:
			return nil, false
		}
	}
}

func (w *warmPool) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// close ends the pool; its filler closes the connections.
func (w *warmPool) close() {
	if w != nil {
		w.cancel()
	}
}

// fill keeps the pool full and fresh until it is closed. A proxy that
// cannot be warmed is tried again only after a growing backoff, however
// many guests connect meanwhile (they dial it themselves).
func (w *warmPool) fill(s *Server) {
	tick := time.NewTicker(warmMaxIdle / 2)
	defer tick.Stop()
	defer w.drop(0)
	backoff := warmBackoffMin
	var retryAt time.Time
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-w.kick:
		case <-tick.C:
			w.drop(warmMaxIdle / 2)
		}
		for len(w.conns) < cap(w.conns) && !time.Now().Before(retryAt) {
			ctx, cancel := context.WithTimeout(w.ctx, s.opts.HandshakeTimeout)
			c, err := s.dialGreeted(ctx, w.p)
			cancel()
			if w.ctx.Err() != nil {
				if c != nil {
					c.Close()
				}
				return
			}
			if err != nil {
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, warmBackoffMax)
				break
			}
			backoff = warmBackoffMin
			select {
			case w.conns <- warmConn{c: c, born: time.Now()}:
			default:
				c.Close()
			}
		}
	}
}

// drop closes the connections older than age (all for 0); the next fill
// replaces them.
func (w *warmPool) drop(age time.Duration) {
	for range len(w.conns) {
		select {
		case wc := <-w.conns:
			if age > 0 && time.Since(wc.born) < age {
				w.conns <- wc
				continue
			}
			wc.c.Close()
		default:
			return
		}
	}
}
