package egress

import (
	"context"
	"errors"
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
		q := new(dns.Msg)
		if err := q.Unpack(buf[:n]); err != nil || q.Response || q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
			s.dnsDropped(guest, "not a DNS query")
			continue
		}
		select {
		case s.dnsSlots <- struct{}{}:
		default:
			s.dnsDropped(guest, "too many queries in flight")
			continue
		}
		s.dns.Add(1)
		go func() {
			defer s.dns.Done()
			defer func() { <-s.dnsSlots }()
			s.answer(pc, src, q, rt.resolver, received)
		}()
	}
}

func (s *Server) dnsDropped(guest netip.Addr, why string) {
	s.dnsDroppedStat.Add(1)
	s.connLog("egress dns query dropped", "guest", guest, "reason", why)
}

// answer asks the resolver's upstreams in order and writes the first
// answer back to the guest from the socket the query came in on. When
// none answers the guest gets SERVFAIL rather than a silent timeout.
func (s *Server) answer(pc *net.UDPConn, src netip.AddrPort, q *dns.Msg, res *resolverRoute, received time.Time) {
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
		s.connLog("egress dns query failed", "guest", src.Addr(), "resolver", res.name, "name", q.Question[0].Name, "err", last)
		if ctx.Err() != nil {
			return // past the window: the guest has given up
		}
		r = new(dns.Msg)
		r.SetRcode(q, dns.RcodeServerFailure)
	} else {
		s.dnsAnswered.Add(1)
	}
	// An answer that came over TCP may not fit what the guest can take.
	size := dns.MinMsgSize
	if opt := q.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
		size = int(opt.UDPSize())
	}
	r.Truncate(size)
	out, err := r.Pack()
	if err != nil {
		return
	}
	pc.WriteToUDPAddrPort(out, src)
}
