package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// acceptLoop takes guest connections until the listener is closed (a
// drain). A failing accept (out of descriptors) is retried with a backoff
// so one burst does not end the process.
func (s *Server) acceptLoop(ln *net.TCPListener) {
	defer close(s.acceptDone)
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.connLog("egress accept failed", "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		s.accepted.Add(1)
		s.carriers.Go(func() { s.carry(c) })
	}
}

// carry forwards one guest connection through its guest's proxy, or
// closes it at once: there is no direct path.
func (s *Server) carry(c *net.TCPConn) {
	guest := addrPort(c.RemoteAddr()).Addr()
	dst := addrPort(c.LocalAddr())
	rt := s.table.Load().routes[guest]
	rt.count.inc(outAccepted)
	if rt.proxy == nil {
		s.refuse(c, rt.count, guest, dst, "no egress route for this guest")
		return
	}
	r := &relay{guest: c, count: rt.count}
	r.ctx, r.cancel = context.WithCancel(s.life)
	if err := s.track(r); err != nil {
		s.refuse(c, rt.count, guest, dst, err.Error())
		return
	}
	defer s.untrack(r)
	defer r.kill()
	p := rt.proxy
	up, err := s.dialProxy(r.ctx, p, dst)
	if err != nil {
		s.failed.Add(1)
		rt.count.inc(outFailed)
		s.connLog("egress connection failed", "guest", guest, "destination", dst, "egress", p.name, "revision", p.revision, "err", err)
		c.SetLinger(0) // a reset tells the guest at once
		return
	}
	if !r.attach(up) {
		return // killed while dialing
	}
	r.pump()
}

func (s *Server) refuse(c *net.TCPConn, g *guestCount, guest netip.Addr, dst netip.AddrPort, why string) {
	s.refused.Add(1)
	g.inc(outRefused)
	s.connLog("egress connection refused", "guest", guest, "destination", dst, "reason", why)
	c.SetLinger(0)
	c.Close()
}

func addrPort(a net.Addr) netip.AddrPort {
	ta, _ := a.(*net.TCPAddr)
	if ta == nil {
		return netip.AddrPort{}
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// relay is one carried connection: the guest's and, once the proxy said
// yes, the proxy's.
type relay struct {
	guest  *net.TCPConn
	count  *guestCount     // its guest's counters (nil: none)
	ctx    context.Context // ends when killed: aborts the dial and handshake
	cancel context.CancelFunc

	mu     sync.Mutex
	up     net.Conn
	killed bool
}

// attach adds the proxy side; false when the relay was killed meanwhile.
func (r *relay) attach(up net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		up.Close()
		return false
	}
	r.up = up
	return true
}

// kill closes both sides; the copies then end.
func (r *relay) kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		return
	}
	r.killed = true
	r.cancel()
	r.guest.Close()
	if r.up != nil {
		r.up.Close()
	}
}

// pump copies both ways. An end of stream is passed on as a half-close,
// so a guest that shuts down its sending side still gets the answer; an
// error in either direction ends both.
func (r *relay) pump() {
	var wg sync.WaitGroup
	wg.Go(func() { r.copy(r.up, r.guest) })
	r.copy(r.guest, r.up)
	wg.Wait()
}

type closeWriter interface{ CloseWrite() error }

func (r *relay) copy(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil {
		r.kill()
		return
	}
	if cw, ok := dst.(closeWriter); ok {
		cw.CloseWrite()
	}
}
