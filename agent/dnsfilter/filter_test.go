package dnsfilter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/dnstest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/netpol"
)

// The kernel side (netpol.Learn into a real table, and a real guest that
// can reach only what was learned) is exercised by the runtime's
// TestGuestNetwork; here learning is recorded, so every decision of the
// filter can be seen.

type learned struct {
	set   string
	addrs []netip.Addr
	ttl   time.Duration
}

type recorder struct {
	mu   sync.Mutex
	got  []learned
	fail error
}

func (r *recorder) learn(_ context.Context, set string, addrs []netip.Addr, ttl time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.got = append(r.got, learned{set, slices.Clone(addrs), ttl})
	return nil
}

func (r *recorder) take() []learned {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

var (
	guestAddr = netip.MustParseAddr("127.0.0.1")
	webAddr   = netip.MustParseAddr("198.51.100.7")
	cdnAddr   = netip.MustParseAddr("203.0.113.9")
	evilAddr  = netip.MustParseAddr("192.0.2.66")
	web6Addr  = netip.MustParseAddr("2001:db8:7::7")
	evil6Addr = netip.MustParseAddr("2001:db8:66::66")
)

// newFilter serves a filter on loopback, with a responder as the
// deployment resolver; queries come from 127.0.0.1, which stands for a
// guest.
func newFilter(t *testing.T, upstreams ...netip.AddrPort) (*Filter, netip.AddrPort) {
	t.Helper()
	if len(upstreams) == 0 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dns := dnstest.ServeRecords(pc, map[string][]netip.Addr{
			"web.example.com.": {webAddr}, "cdn.example.net.": {cdnAddr}, "evil.example.com.": {evilAddr}, "inside.test.": {webAddr},
			"web6.example.com.": {web6Addr}, "evil6.example.com.": {evil6Addr}, "cdn6.example.net.": {web6Addr},
			"dual.example.com.": {webAddr, web6Addr},
		})
		t.Cleanup(func() { dns.Close() })
		upstreams = []netip.AddrPort{netip.MustParseAddrPort(pc.LocalAddr().String())}
	}
	pc, ln := dnstest.ListenUDPTCP(t)
	f, err := Serve(t.Context(), pc, ln, upstreams, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, netip.MustParseAddrPort(pc.LocalAddr().String())
}

func ask(t *testing.T, srv netip.AddrPort, network, name string) *dns.Msg {
	t.Helper()
	return askType(t, srv, network, name, dns.TypeA)
}

func askType(t *testing.T, srv netip.AddrPort, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(q, srv.String())
	if err != nil {
		t.Fatalf("query %s over %s: %v", name, network, err)
	}
	return r
}

func answers(t *testing.T, r *dns.Msg, want netip.Addr) {
	t.Helper()
	addrs, _ := addressesOf(r, true)
	if r.Rcode != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != want {
		t.Errorf("answer %s %v, want %s", dns.RcodeToString[r.Rcode], addrs, want)
	}
}

func refused(t *testing.T, r *dns.Msg) {
	t.Helper()
	if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
		t.Errorf("answer %s with %d records, want REFUSED and nothing", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
}

func TestFilterDecisions(t *testing.T) {
	f, srv := newFilter(t)
	// Nobody it was not told about gets an answer.
	refused(t, ask(t, srv, "udp", "web.example.com"))

	rec := &recorder{}
	f.Set(context.Background(), guestAddr, Policy{Instance: "i-1", AllowNames: []string{"*.example.com"}, DenyNames: []string{"evil.example.com"},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Learn: rec.learn})

	// An allowed name is answered, and learned into the allow set first.
	answers(t, ask(t, srv, "udp", "WEB.example.com"), webAddr)
	if got := rec.take(); len(got) != 1 || got[0].set != netpol.SetAllowNames || !slices.Equal(got[0].addrs, []netip.Addr{webAddr}) {
		t.Errorf("learned %+v, want web's address in %s", got, netpol.SetAllowNames)
	}
	// Over TCP too.
	answers(t, ask(t, srv, "tcp", "web.example.com"), webAddr)
	rec.take()
	// Deny wins over a wildcard allow: refused, its address learned as denied.
	refused(t, ask(t, srv, "udp", "evil.example.com"))
	if got := rec.take(); len(got) != 1 || got[0].set != netpol.SetDenyNames || !slices.Equal(got[0].addrs, []netip.Addr{evilAddr}) {
		t.Errorf("learned %+v, want evil's address in %s", got, netpol.SetDenyNames)
	}
	// A name no rule allows is refused, unless all its addresses are in
	// the allow CIDRs; neither is learned.
	refused(t, ask(t, srv, "udp", "cdn.example.net"))
	answers(t, ask(t, srv, "udp", "inside.test"), webAddr)
	// A name the resolver does not know: its answer, nothing learned.
	if r := ask(t, srv, "udp", "nothing.example.com"); r.Rcode != dns.RcodeNameError {
		t.Errorf("unknown allowed name: %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("learned %+v for names it must not learn", got)
	}

	// Only deny rules: everything else resolves, nothing is learned.
	f.Set(context.Background(), guestAddr, Policy{DenyNames: []string{"evil.example.com"}, Learn: rec.learn})
	if got := rec.take(); len(got) != 1 || got[0].set != netpol.SetDenyNames {
		t.Errorf("after the policy change learned again %+v, want only the denied name", got)
	}
	answers(t, ask(t, srv, "udp", "cdn.example.net"), cdnAddr)
	refused(t, ask(t, srv, "udp", "evil.example.com"))
	rec.take()

	// A policy change learns again what the new policy still rules on,
	// into the set it now belongs to, and forgets the rest.
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"web.example.com"}, Learn: rec.learn})
	answers(t, ask(t, srv, "udp", "web.example.com"), webAddr)
	rec.take()
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, Learn: rec.learn})
	// evil.example.com was forgotten under the policy before, which did
	// not rule on it.
	got := rec.take()
	if len(got) != 1 || got[0].set != netpol.SetAllowNames || !slices.Equal(got[0].addrs, []netip.Addr{webAddr}) {
		t.Errorf("learned again %+v, want web's address in the allow set", got)
	}
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"other.example.org"}, Learn: rec.learn})
	if got := rec.take(); len(got) != 0 {
		t.Errorf("learned again %+v under a policy that names none of them", got)
	}

	// A learn that fails gives SERVFAIL, not an address the guest cannot reach.
	rec.fail = errors.New("no such set")
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, Learn: rec.learn})
	if r := ask(t, srv, "udp", "web.example.com"); r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
		t.Errorf("learn failed: %s with %d records, want SERVFAIL", dns.RcodeToString[r.Rcode], len(r.Answer))
	}

	f.Remove(guestAddr)
	refused(t, ask(t, srv, "udp", "web.example.com"))
	if s := f.Stats(); s.Answered == 0 || s.Refused == 0 || s.Failed == 0 {
		t.Errorf("stats %+v: every kind happened", s)
	}
}

// AAAA answers: for a guest with IPv6 their addresses are learned (into
// the list's IPv6 set, by netpol.Learn) and ruled on like A answers'; for
// a guest without, they pass untouched and nothing is learned.
func TestFilterIPv6(t *testing.T) {
	f, srv := newFilter(t)
	rec := &recorder{}
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, DenyNames: []string{"evil6.example.com"},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("2001:db8:7::/48")}, IPv6: true, Learn: rec.learn})
	answers(t, askType(t, srv, "udp", "web6.example.com", dns.TypeAAAA), web6Addr)
	if got := rec.take(); len(got) != 1 || got[0].set != netpol.SetAllowNames || !slices.Equal(got[0].addrs, []netip.Addr{web6Addr}) {
		t.Errorf("learned %+v, want web6's address in the allow list", got)
	}
	refused(t, askType(t, srv, "udp", "evil6.example.com", dns.TypeAAAA))
	if got := rec.take(); len(got) != 1 || got[0].set != netpol.SetDenyNames || !slices.Equal(got[0].addrs, []netip.Addr{evil6Addr}) {
		t.Errorf("learned %+v, want evil6's address in the deny list", got)
	}
	// Not allowed by name, but every address inside the allow CIDRs.
	answers(t, askType(t, srv, "udp", "cdn6.example.net", dns.TypeAAAA), web6Addr)
	if got := rec.take(); len(got) != 0 {
		t.Errorf("learned %+v for a name no rule names", got)
	}
	// A policy change learns the IPv6 answer again.
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"web6.example.com"}, IPv6: true, Learn: rec.learn})
	if got := rec.take(); len(got) != 1 || !slices.Equal(got[0].addrs, []netip.Addr{web6Addr}) {
		t.Errorf("learned again %+v, want web6's address", got)
	}
	// A name's A and AAAA answers are remembered apart: the later does
	// not make the earlier forgotten.
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"dual.example.com"}, IPv6: true, Learn: rec.learn})
	answers(t, ask(t, srv, "udp", "dual.example.com"), webAddr)
	answers(t, askType(t, srv, "udp", "dual.example.com", dns.TypeAAAA), web6Addr)
	rec.take()
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, IPv6: true, Learn: rec.learn})
	var again []netip.Addr
	for _, l := range rec.take() {
		again = append(again, l.addrs...)
	}
	if !slices.Contains(again, webAddr) || !slices.Contains(again, web6Addr) {
		t.Errorf("learned again %v, want both of dual's addresses", again)
	}

	// Without IPv6 the guest gets the answer as it is, and nothing is learned.
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, Learn: rec.learn})
	rec.take()
	if r := askType(t, srv, "udp", "web6.example.com", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("AAAA for a guest without IPv6: %s with %d records, want the answer", dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("learned %+v for a guest without IPv6", got)
	}
}

// A dead deployment resolver gives SERVFAIL within the window, not silence.
func TestFilterUpstreamDown(t *testing.T) {
	deadAddr := netip.MustParseAddrPort(testenv.LoopbackAddr(t)) // nothing listens
	f, srv := newFilter(t, deadAddr)
	rec := &recorder{}
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, Learn: rec.learn})
	if r := ask(t, srv, "udp", "web.example.com"); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("upstream down: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("learned %+v without an answer", got)
	}
}

func TestFilterMalformed(t *testing.T) {
	f, srv := newFilter(t)
	f.Set(context.Background(), guestAddr, Policy{AllowNames: []string{"*.example.com"}, Learn: (&recorder{}).learn})
	q := new(dns.Msg)
	q.SetQuestion("web.example.com.", dns.TypeA)
	q.Question = append(q.Question, q.Question[0])
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(q, srv.String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeFormatError || len(r.Answer) != 0 {
		t.Errorf("two questions: %s, want FORMERR", dns.RcodeToString[r.Rcode])
	}
}
