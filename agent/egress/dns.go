package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/dnsx"
)

// maxQuery bounds a guest query; a larger datagram is cut and fails to
// parse, so it is dropped.
const maxQuery = 4096

// upstreamTimeout bounds one upstream attempt, so a dead first upstream
// leaves time for the next within DNSAnswerWindow.
const upstreamTimeout = 1500 * time.Millisecond

// dnsLoop reads guest queries until a drain stops it (a read deadline in
// the past) or the socket is closed; each query is answered on its own.
func (s *Server) dnsLoop(pc *net.UDPConn) {
	defer s.dns.Done()
	buf := make([]byte, maxQuery)
	for {
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			var ne net.Error
			if errors.Is(err, net.ErrClosed) || errors.As(err, &ne) && ne.Timeout() {
				return
			}
			s.connLog("egress dns read failed", "err", err)
			continue
		}
		received := time.Now()
		guest := src.Addr().Unmap()
		rt := s.table.Load().routes[guest]
		if rt.resolver == nil {
			s.dnsDropped(guest, "no resolver route for this guest")
			continue
		}
		q := s.admitQuery(guest, buf[:n])
		if q == nil {
			continue
		}
		s.dns.Add(1)
		go func() {
			defer s.dns.Done()
			defer func() { <-s.dnsSlots }()
			r := s.answer(src.Addr(), q, rt.resolver, received)
			if r == nil {
				return
			}
			// An answer that came over TCP may not fit what the guest can take.
			size := dns.MinMsgSize
			if opt := q.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
				size = int(opt.UDPSize())
			}
			r.Truncate(size)
			if out, err := r.Pack(); err == nil {
				pc.WriteToUDPAddrPort(out, src)
			}
		}()
	}
}

// Bounds of a guest's DNS TCP connection: queries on one connection, and
// how long it may sit idle or take to send one.
const (
	maxTCPQueries = 32
	tcpIdle       = 5 * time.Second
)

// dnsTCPLoop takes guests' DNS TCP connections (a query whose UDP answer
// came truncated is asked again over TCP) until a drain closes the
// listener; each connection is served on its own.
func (s *Server) dnsTCPLoop(ln *net.TCPListener) {
	defer s.dns.Done()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.connLog("egress dns accept failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		if s.draining {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.dnsConns[c] = struct{}{}
		s.dns.Add(1)
		s.mu.Unlock()
		go s.serveDNSConn(c)
	}
}

// serveDNSConn answers the queries of one connection in order.
func (s *Server) serveDNSConn(c *net.TCPConn) {
	defer s.dns.Done()
	defer func() {
		s.mu.Lock()
		delete(s.dnsConns, c)
		s.mu.Unlock()
		c.Close()
	}()
	src := addrPort(c.RemoteAddr())
	guest := src.Addr()
	rt := s.table.Load().routes[guest]
	if rt.resolver == nil {
		s.dnsDropped(guest, "no resolver route for this guest")
		return
	}
	co := &dns.Conn{Conn: c}
	for range maxTCPQueries {
		c.SetReadDeadline(time.Now().Add(tcpIdle))
		s.mu.Lock()
		if s.draining {
			c.SetReadDeadline(time.Unix(1, 0))
		}
		s.mu.Unlock()
		// dns.Conn reads the two-byte length, then at most that much; a
		// query is small, so a longer one is refused unread.
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		size := int(n[0])<<8 | int(n[1])
		if size == 0 || size > maxQuery {
			s.dnsDropped(guest, "a TCP query over the size bound")
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		received := time.Now()
		q := s.admitQuery(guest, buf)
		if q == nil {
			return
		}
		r := s.answer(guest, q, rt.resolver, received)
		<-s.dnsSlots
		if r == nil {
			return
		}
		c.SetWriteDeadline(time.Now().Add(tcpIdle))
		if err := co.WriteMsg(r); err != nil {
			return
		}
	}
}

// admitQuery decodes one query of guest and takes an in-flight slot for
// it (the caller gives it back), or drops it: nil.
func (s *Server) admitQuery(guest netip.Addr, raw []byte) *dns.Msg {
	q := new(dns.Msg)
	if err := q.Unpack(raw); err != nil || q.Response || q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		s.dnsDropped(guest, "not a DNS query")
		return nil
	}
	select {
	case s.dnsSlots <- struct{}{}:
		return q
	default:
		s.dnsDropped(guest, "too many queries in flight")
		return nil
	}
}

func (s *Server) dnsDropped(guest netip.Addr, why string) {
	s.dnsDroppedStat.Add(1)
	s.connLog("egress dns query dropped", "guest", guest, "reason", why)
}

// answer asks the resolver's upstreams in order and returns the first
// answer for guest. When none answers the guest gets SERVFAIL rather than
// a silent timeout; nil when the window is past (the guest gave up).
func (s *Server) answer(guest netip.Addr, q *dns.Msg, res *resolverRoute, received time.Time) *dns.Msg {
	ctx, cancel := context.WithDeadline(s.dnsCtx, received.Add(DNSAnswerWindow))
	defer cancel()
	var r *dns.Msg
	var last error
	for _, up := range res.upstreams {
		addrs, err := s.resolve(ctx, up)
		if err != nil {
			last = err
			continue
		}
		for _, a := range addrs {
			r, err = dnsx.Exchange(ctx, nil, q, netip.AddrPortFrom(a, up.port), upstreamTimeout)
			if err == nil {
				break
			}
			last = err
		}
		if r != nil {
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	if r == nil {
		s.dnsFailed.Add(1)
		s.connLog("egress dns query failed", "guest", guest, "resolver", res.name, "name", q.Question[0].Name, "err", last)
		if ctx.Err() != nil {
			return nil // past the window: the guest has given up
		}
		r = new(dns.Msg)
		r.SetRcode(q, dns.RcodeServerFailure)
	} else {
		s.dnsAnswered.Add(1)
	}
	r.Id = q.Id
	return r
}
