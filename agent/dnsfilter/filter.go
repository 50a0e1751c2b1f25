// Package dnsfilter is the node's resolver for guests whose network policy
// has domain rules (example.com, *.example.com). Their DNS is DNATed to it
// instead of to the deployment resolver; it asks the deployment resolver
// and, before the guest sees the answer, learns the addresses of an
// allowed name into the guest's nftables set (netpol.Learn). The guest's
// table lets through only learned addresses besides its allow CIDRs, so a
// name rule cannot be bypassed by dialling an address directly. A denied
// name is not resolved for the guest (REFUSED), and the addresses the
// deployment resolver gave for it are dropped from then on.
//
// It knows nothing of namespaces or of consensus: the runtime hands it the
// sockets and, per guest address, the rules and how to learn.
package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/dnsx"
	"github.com/kibotos/kibotos/netpol"
)

// Bounds of what guests can make the filter do.
const (
	// maxInFlight bounds the queries being answered at once, over all
	// guests; a query beyond it is dropped (the guest retries).
	maxInFlight = 256
	// maxLearnedNames bounds the answers (of a name and a family)
	// remembered per guest for re-learning after a policy change.
	maxLearnedNames = 1024
	// answerWindow bounds one query's answer; a guest resolver gives up
	// after about 5 s.
	answerWindow = 4 * time.Second
	// upstreamTimeout bounds one upstream attempt, so a dead first
	// upstream leaves time for the next.
	upstreamTimeout = 1500 * time.Millisecond
	// logInterval is the least time between two log lines of one guest.
	logInterval = 10 * time.Second
)

// LearnFunc puts addrs into the guest's learned set (netpol.SetAllowNames
// or netpol.SetDenyNames; IPv6 addresses into its IPv6 twin, as
// netpol.Learn does), expiring after ttl (clamped by netpol).
type LearnFunc func(ctx context.Context, set string, addrs []netip.Addr, ttl time.Duration) error

// Policy is one guest's domain rules, canonical (api.CanonicalDomainRule).
type Policy struct {
	// Instance names the guest in log lines.
	Instance string
	// AllowNames and DenyNames are the domain rules; Deny wins.
	AllowNames, DenyNames []string
	// AllowCIDRs are the policy's allow CIDRs. With any allow rule, a
	// name no rule allows is refused, unless every address it has is
	// inside these (the guest may reach them anyway).
	AllowCIDRs []netip.Prefix
	// IPv6 says the guest has an IPv6 address: the addresses of AAAA
	// records are learned (and ruled on) like those of A records. Without
	// it they are passed on untouched, as the guest cannot reach them.
	IPv6  bool
	Learn LearnFunc
}

// restricted says whether the policy has allow rules: then names must be
// allowed to resolve.
func (p Policy) restricted() bool { return len(p.AllowNames) > 0 || len(p.AllowCIDRs) > 0 }

func matchAny(rules []string, name string) (string, bool) {
	for _, r := range rules {
		if api.DomainRuleMatches(r, name) {
			return r, true
		}
	}
	return "", false
}

// Stats count what the filter did, over all guests.
type Stats struct {
	Answered, Refused, Failed, Dropped uint64
}

// Filter answers the guests it was told about (Set) and refuses everyone
// else.
type Filter struct {
	upstreams []netip.AddrPort
	dial      dnsx.DialFunc
	log       *slog.Logger
	slots     chan struct{}
	servers   []*dns.Server
	served    sync.WaitGroup
	// ctx bounds the upstream queries and the learning of answers. It
	// lives until Close, beyond the ctx Serve was called with (the node
	// opens the filter once and it serves for the node's life): it keeps
	// that one's values, not its cancellation.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	guests map[netip.Addr]*guest

	answered, refused, failed, dropped atomic.Uint64
}

type guest struct {
	// mu orders learning: a Set's re-learn and a query's learn never
	// interleave, so the cache and the kernel's sets agree.
	mu      sync.Mutex
	policy  Policy
	learned map[string]learnedName
	lastLog time.Time
	quiet   int // log lines suppressed since lastLog
}

// learnedName is an answer the filter learned, kept to learn it again
// when the guest's table is replaced. The cache holds one per name and
// address family (key "name A" or "name AAAA"): a name's A and AAAA
// answers come apart and each replaces only its own.
type learnedName struct {
	name  string
	set   string
	addrs []netip.Addr
	until time.Time
}

// Serve answers queries on pc (UDP) and ln (TCP), which the caller made
// in the namespace guests reach, with upstreams (the deployment
// resolvers) asked in order through dial (nil: from this process's
// namespace). Close stops it.
func Serve(ctx context.Context, pc net.PacketConn, ln net.Listener, upstreams []netip.AddrPort, dial dnsx.DialFunc, log *slog.Logger) (*Filter, error) {
	if len(upstreams) == 0 {
		return nil, errors.New("dnsfilter: no upstream resolver")
	}
	f := &Filter{upstreams: slices.Clone(upstreams), dial: dial, log: log, slots: make(chan struct{}, maxInFlight),
		guests: map[netip.Addr]*guest{}}
	f.ctx, f.cancel = context.WithCancel(context.WithoutCancel(ctx))
	f.servers = []*dns.Server{
		{PacketConn: pc, Handler: f, UDPSize: dns.DefaultMsgSize},
		{Listener: ln, Handler: f, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxTCPQueries: 32},
	}
	for _, s := range f.servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		f.served.Add(1)
		go func() {
			defer f.served.Done()
			if err := s.ActivateAndServe(); err != nil {
				log.Error("dns filter stopped serving", "err", err)
			}
		}()
		<-started
	}
	return f, nil
}

// Close stops answering and waits for the servers to end.
func (f *Filter) Close() error {
	var errs []error
	for _, s := range f.servers {
		if err := s.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	f.served.Wait()
	f.cancel()
	return errors.Join(errs...)
}

// Stats reads the counters.
func (f *Filter) Stats() Stats {
	return Stats{Answered: f.answered.Load(), Refused: f.refused.Load(), Failed: f.failed.Load(), Dropped: f.dropped.Load()}
}

// Set makes the filter answer addr with p, replacing what it had. Names
// learned under the old policy that p still rules on are learned again
// (into the set p puts them in): the caller has just replaced the guest's
// table, which emptied its learned sets. The others are forgotten.
func (f *Filter) Set(ctx context.Context, addr netip.Addr, p Policy) {
	p.AllowNames, p.DenyNames, p.AllowCIDRs = slices.Clone(p.AllowNames), slices.Clone(p.DenyNames), slices.Clone(p.AllowCIDRs)
	f.mu.Lock()
	g := f.guests[addr]
	if g == nil {
		g = &guest{learned: map[string]learnedName{}}
		f.guests[addr] = g
	}
	f.mu.Unlock()

	g.mu.Lock()
	defer g.mu.Unlock()
	g.policy = p
	now := time.Now()
	// In name order, so what is learned again does not depend on map order.
	for _, key := range slices.Sorted(maps.Keys(g.learned)) {
		l := g.learned[key]
		set := learnSet(p, l.name)
		if set == "" || !l.until.After(now) {
			delete(g.learned, key)
			continue
		}
		if err := p.Learn(ctx, set, l.addrs, l.until.Sub(now)); err != nil {
			f.log.Warn("dns filter could not learn a name again after a policy change", "instance_id", p.Instance, "name", l.name, "err", err)
			delete(g.learned, key)
			continue
		}
		l.set = set
		g.learned[key] = l
	}
}

// Remove forgets the guest at addr: its queries are refused from now on.
func (f *Filter) Remove(addr netip.Addr) {
	f.mu.Lock()
	delete(f.guests, addr)
	f.mu.Unlock()
}

// learnSet is the learned set an answer for name goes into under p, or ""
// when p learns nothing of it.
func learnSet(p Policy, name string) string {
	if _, ok := matchAny(p.DenyNames, name); ok {
		return netpol.SetDenyNames
	}
	if _, ok := matchAny(p.AllowNames, name); ok {
		return netpol.SetAllowNames
	}
	return ""
}

// ServeDNS answers one guest query.
func (f *Filter) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	select {
	case f.slots <- struct{}{}:
		defer func() { <-f.slots }()
	default:
		f.dropped.Add(1)
		return
	}
	src := addrOf(w.RemoteAddr())
	f.mu.Lock()
	g := f.guests[src]
	f.mu.Unlock()
	var r *dns.Msg
	switch {
	case q.Response || q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 || q.Question[0].Qclass != dns.ClassINET:
		r = reply(q, dns.RcodeFormatError)
		f.refused.Add(1)
	case g == nil:
		// Not a guest with domain rules: nobody else's DNS comes here.
		r = reply(q, dns.RcodeRefused)
		f.refused.Add(1)
	default:
		r = f.answer(g, src, q)
	}
	if r == nil {
		return
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := q.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
			size = int(opt.UDPSize())
		}
		r.Truncate(size)
	}
	w.WriteMsg(r)
}

// answer decides one query of guest g: refused, or asked upstream (and
// learned) and answered.
func (f *Filter) answer(g *guest, src netip.Addr, q *dns.Msg) *dns.Msg {
	ctx, cancel := context.WithTimeout(f.ctx, answerWindow)
	defer cancel()
	name := q.Question[0].Name
	g.mu.Lock()
	p := g.policy
	g.mu.Unlock()
	deny, denied := matchAny(p.DenyNames, name)
	allow, allowed := matchAny(p.AllowNames, name)

	up, err := f.exchange(ctx, q)
	if err != nil {
		f.failed.Add(1)
		f.guestLog(g, "dns filter query failed", "instance_id", p.Instance, "guest", src, "name", name, "err", err)
		if ctx.Err() != nil {
			return nil // past the window: the guest has given up
		}
		return reply(q, dns.RcodeServerFailure)
	}
	addrs, ttl := addressesOf(up, p.IPv6)
	switch {
	case denied:
		// Learned so that an address the guest finds another way is
		// dropped too; the guest itself gets no answer.
		if err := f.learn(ctx, g, p, netpol.SetDenyNames, name, addrs, ttl); err != nil {
			f.guestLog(g, "dns filter could not learn a denied name", "instance_id", p.Instance, "name", name, "err", err)
		}
		f.refused.Add(1)
		f.guestLog(g, "guest name refused", "instance_id", p.Instance, "guest", src, "name", name, "rule", deny, "list", "deny")
		return reply(q, dns.RcodeRefused)
	case allowed:
		if err := f.learn(ctx, g, p, netpol.SetAllowNames, name, addrs, ttl); err != nil {
			f.failed.Add(1)
			f.guestLog(g, "dns filter could not learn an allowed name", "instance_id", p.Instance, "name", name, "rule", allow, "err", err)
			return reply(q, dns.RcodeServerFailure)
		}
	case p.restricted() && !allInside(addrs, p.AllowCIDRs):
		f.refused.Add(1)
		f.guestLog(g, "guest name refused", "instance_id", p.Instance, "guest", src, "name", name, "list", "allow",
			"reason", "no allow rule names it")
		return reply(q, dns.RcodeRefused)
	}
	f.answered.Add(1)
	up.Id = q.Id
	return up
}

// learn puts one answer's addresses into the guest's set and remembers it
// for Set. An answer without addresses learns nothing.
func (f *Filter) learn(ctx context.Context, g *guest, p Policy, set, name string, addrs []netip.Addr, ttl time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.Learn == nil {
		return errors.New("no way to learn addresses for this guest")
	}
	if err := p.Learn(ctx, set, addrs, ttl); err != nil {
		return err
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	until := time.Now().Add(netpol.LearnedTimeout(ttl))
	for _, fam := range []struct {
		rr string
		is func(netip.Addr) bool
	}{{"A", netip.Addr.Is4}, {"AAAA", netip.Addr.Is6}} {
		var part []netip.Addr
		for _, a := range addrs {
			if fam.is(a) {
				part = append(part, a)
			}
		}
		if len(part) == 0 {
			continue
		}
		key := name + " " + fam.rr
		if _, ok := g.learned[key]; !ok && len(g.learned) >= maxLearnedNames {
			g.forgetOne()
		}
		g.learned[key] = learnedName{name: name, set: set, addrs: part, until: until}
	}
	return nil
}

// forgetOne makes room in the cache: the name that expires first goes.
// The kernel's set keeps it until then; only a policy change will not
// learn it again.
func (g *guest) forgetOne() {
	var first string
	var at time.Time
	for name, l := range g.learned {
		if first == "" || l.until.Before(at) || l.until.Equal(at) && name < first {
			first, at = name, l.until
		}
	}
	delete(g.learned, first)
}

// guestLog logs one line about a guest, at most one per logInterval; the
// next line says how many were left out.
func (f *Filter) guestLog(g *guest, msg string, args ...any) {
	g.mu.Lock()
	now := time.Now()
	if !g.lastLog.IsZero() && now.Sub(g.lastLog) < logInterval {
		g.quiet++
		g.mu.Unlock()
		return
	}
	quiet := g.quiet
	g.lastLog, g.quiet = now, 0
	g.mu.Unlock()
	if quiet > 0 {
		args = append(args, "suppressed", quiet)
	}
	f.log.Info(msg, args...)
}

// exchange asks the upstreams in order, UDP first and TCP when the answer
// is truncated, and returns the first answer to this question.
func (f *Filter) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	out := q.Copy()
	out.Id = dns.Id()
	var last error
	for _, up := range f.upstreams {
		r, err := dnsx.Exchange(ctx, f.dial, out, up, upstreamTimeout)
		if err == nil {
			return r, nil
		}
		last = fmt.Errorf("%s: %w", up, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, last
}

// addressesOf are the IPv4 addresses of an answer (the records of its
// CNAME chain included), and with ipv6 its IPv6 ones, and the shortest TTL
// among them.
func addressesOf(r *dns.Msg, ipv6 bool) ([]netip.Addr, time.Duration) {
	var out []netip.Addr
	var ttl uint32
	for _, rr := range r.Answer {
		var addr netip.Addr
		var ok bool
		switch rr := rr.(type) {
		case *dns.A:
			addr, ok = netip.AddrFromSlice(rr.A.To4())
		case *dns.AAAA:
			if ipv6 && rr.AAAA.To4() == nil {
				addr, ok = netip.AddrFromSlice(rr.AAAA.To16())
			}
		}
		if !ok || slices.Contains(out, addr) {
			continue
		}
		if h := rr.Header(); len(out) == 0 || h.Ttl < ttl {
			ttl = h.Ttl
		}
		out = append(out, addr)
	}
	return out, time.Duration(ttl) * time.Second
}

// allInside says whether there are addresses and every one is in ps.
func allInside(addrs []netip.Addr, ps []netip.Prefix) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return false
		}
	}
	return true
}

func reply(q *dns.Msg, rcode int) *dns.Msg {
	r := new(dns.Msg)
	r.SetRcode(q, rcode)
	return r
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
