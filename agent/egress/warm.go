package egress

import (
	"context"
	"net"
	"sync/atomic"
	"time"
)

// A warm pool keeps a few connections to one proxy revision already
// connected, greeted and authenticated, so a guest's connection costs one
// round trip to the proxy (the CONNECT) instead of three or four. That is
// what brings a proxied connect near a direct one when the proxy is not
// next door. It starts with the first connection through that proxy (a
// route that is never used opens nothing), it stops holding connections
// when its proxy has not been used for Options.WarmIdle, and it is closed
// when a new Config or a drain replaces the route.
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
	idle   time.Duration   // unused this long, the pool empties and stops
	ctx    context.Context // ends when the pool is closed
	cancel context.CancelFunc
	// filling is set while a fill goroutine runs: the first take starts
	// one, and a take after an idle stop starts one again.
	filling atomic.Bool
}

// newWarmPool makes a pool of size connections for p, kept while p is
// used at least every idle; size 0 is none.
func newWarmPool(ctx context.Context, p *proxyRoute, size int, idle time.Duration) *warmPool {
	if size <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	return &warmPool{p: p, conns: make(chan warmConn, size), kick: make(chan struct{}, 1), idle: idle, ctx: ctx, cancel: cancel}
}

// take returns a warm connection if one is ready, and has the pool
// refilled either way.
func (w *warmPool) take(s *Server) (net.Conn, bool) {
	if w == nil || w.ctx.Err() != nil {
		return nil, false
	}
	if w.filling.CompareAndSwap(false, true) {
		s.warmers.Go(func() { w.fill(s) })
	}
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

// fill keeps the pool full and fresh until it is closed or its proxy
// goes unused for w.idle. The missing connections are dialed at once, in
// parallel: across a network each costs the proxy's round trips, and a
// guest opening connections one after the other would otherwise outrun
// a pool refilled one by one. A proxy that cannot be warmed is tried
// again only after a growing backoff, however many guests connect
// meanwhile (they dial it themselves).
func (w *warmPool) fill(s *Server) {
	tick := time.NewTicker(warmMaxIdle / 2)
	defer tick.Stop()
	idle := time.NewTimer(w.idle)
	defer idle.Stop()
	dialed := make(chan error, cap(w.conns))
	inflight := 0
	// stop waits for the dials under way, which end with w.ctx or their
	// handshake timeout, and closes what the pool holds.
	stop := func() {
		for ; inflight > 0; inflight-- {
			<-dialed
		}
		w.drop(0)
	}
	backoff := warmBackoffMin
	var retryAt time.Time
	for {
		select {
		case <-w.ctx.Done():
			stop()
			return
		case <-w.kick: // a take
			idle.Reset(w.idle)
		case <-tick.C:
			w.drop(warmMaxIdle / 2)
		case err := <-dialed:
			inflight--
			if err != nil {
				retryAt = time.Now().Add(backoff)
				backoff = min(2*backoff, warmBackoffMax)
			} else {
				backoff = warmBackoffMin
			}
		case <-idle.C:
			// An idle route holds nothing open on the caller's proxy. A
			// take that came meanwhile found the pool filling and only
			// kicked it: go on for that one, unless it started a new fill.
			stop()
			w.filling.Store(false)
			if len(w.kick) == 0 || !w.filling.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		for len(w.conns)+inflight < cap(w.conns) && !time.Now().Before(retryAt) {
			inflight++
			go func() { dialed <- w.dialOne(s) }()
		}
	}
}

// dialOne adds a greeted connection to the pool.
func (w *warmPool) dialOne(s *Server) error {
	ctx, cancel := context.WithTimeout(w.ctx, s.opts.HandshakeTimeout)
	defer cancel()
	c, err := s.dialGreeted(ctx, w.p)
	if err != nil {
		return err
	}
	if w.ctx.Err() != nil {
		c.Close()
		return nil
	}
	select {
	case w.conns <- warmConn{c: c, born: time.Now()}:
	default:
		c.Close()
	}
	return nil
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
