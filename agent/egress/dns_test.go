package egress

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/dnstest"
	"github.com/kibotos/kibotos/internal/testenv"
)

// upstream is a DNS server on loopback, UDP and TCP on one port, that
// answers big.test with 40 A records: too many for 512 bytes, so its UDP
// answer is truncated and the full one comes over TCP.
func upstream(t *testing.T) string {
	t.Helper()
	pc, ln := dnstest.ListenUDPTCP(t)
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		for i := range 40 {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN A 192.0.2.%d", q.Question[0].Name, i+1))
			r.Answer = append(r.Answer, rr)
		}
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			r.Truncate(dns.MinMsgSize)
		}
		w.WriteMsg(r)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	return pc.LocalAddr().String()
}

// dnsServer is an in-process egress with a DNS socket on loopback, which
// stands for the guest (127.0.0.1) as well; it returns the socket address.
func dnsServer(t *testing.T, upstreams ...string) string {
	t.Helper()
	s := startServer(t, Options{})
	ctx := ctxT(t)
	c, err := Dial(ctx, s.socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	addr := testenv.LoopbackAddr(t)
	sendSockets(t, c, testenv.LoopbackAddr(t), addr)
	cfg := Config{Routes: []Route{{Guest: netip.MustParseAddr("127.0.0.1"), Resolver: &Resolver{Name: "r1", Upstreams: upstreams}}}}
	if err := c.SetConfig(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return addr
}

func ask(t *testing.T, addr string, edns uint16) *dns.Msg {
	t.Helper()
	return askOver(t, "udp", addr, edns)
}

func askOver(t *testing.T, network, addr string, edns uint16) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion("big.test.", dns.TypeA)
	if edns > 0 {
		q.SetEdns0(edns, false)
	}
	r, _, err := (&dns.Client{Net: network, Timeout: 10 * time.Second}).Exchange(q, addr)
	if err != nil {
		t.Fatalf("query through the egress DNS socket: %v", err)
	}
	return r
}

// A truncated upstream answer is fetched again over TCP, then cut to what
// the guest can take: the full answer with EDNS 4096, a truncated one
// without EDNS.
func TestDNSTruncationAndTCPFallback(t *testing.T) {
	addr := dnsServer(t, upstream(t))
	if r := ask(t, addr, 4096); r.Truncated || len(r.Answer) != 40 {
		t.Fatalf("with EDNS 4096: truncated %v, %d answers; want the 40 from TCP", r.Truncated, len(r.Answer))
	}
	r := ask(t, addr, 0)
	r.Compress = true // as it came on the wire
	if !r.Truncated || r.Len() > dns.MinMsgSize {
		t.Fatalf("without EDNS: truncated %v, %d bytes; want TC within 512", r.Truncated, r.Len())
	}
	// The guest asks again over TCP, as resolvers do after TC, and gets
	// it whole.
	if r := askOver(t, "tcp", addr, 0); r.Truncated || len(r.Answer) != 40 {
		t.Fatalf("over TCP: truncated %v, %d answers; want all 40", r.Truncated, len(r.Answer))
	}
}

// A DNS TCP connection carries several queries, and a query over the
// size bound ends it unanswered.
func TestDNSOverTCPBounds(t *testing.T) {
	addr := dnsServer(t, upstream(t))
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		q := new(dns.Msg)
		q.SetQuestion("big.test.", dns.TypeA)
		if err := c.WriteMsg(q); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		r, err := c.ReadMsg()
		if err != nil || len(r.Answer) != 40 || r.Id != q.Id {
			t.Fatalf("query on a kept connection: %v, %+v", err, r)
		}
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte{0x20, 0x00}) // 8 KiB announced
	raw.Write(make([]byte, 100))
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := raw.Read(make([]byte, 10)); err == nil {
		t.Fatalf("an oversized query got %d bytes back; want the connection closed", n)
	}
}

// Upstreams are tried in order; when none answers the guest gets
// SERVFAIL rather than a silent timeout.
func TestDNSUpstreamOrderAndFailure(t *testing.T) {
	dead := testenv.LoopbackAddr(t) // nothing listens: ICMP refuses at once
	addr := dnsServer(t, dead, upstream(t))
	if r := ask(t, addr, 4096); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 40 {
		t.Fatalf("with a dead first upstream: %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	addr = dnsServer(t, dead)
	if r := ask(t, addr, 0); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("with no live upstream: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}
