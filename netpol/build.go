package netpol

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Sets of an Instance table: the IPv4 ones, and their _v6 twins in the
// table of a guest with an IPv6 address.
const (
	setHost       = "host_v4"
	setManagement = "management_v4"
	setPools      = "pools_v4"
	setLinkLocal  = "linklocal_v4"
	setAllow      = "allow_v4"
	setDeny       = "deny_v4"
	// The learned sets hold the addresses the node's resolver answered for
	// names of the policy's domain rules, each until its answer expires.
	SetAllowNames = "allow_names_v4"
	SetDenyNames  = "deny_names_v4"

	setHost6       = "host_v6"
	setManagement6 = "management_v6"
	setPools6      = "pools_v6"
	setLinkLocal6  = "linklocal_v6"
	setAllow6      = "allow_v6"
	setDeny6       = "deny_v6"
	SetAllowNames6 = "allow_names_v6"
	SetDenyNames6  = "deny_names_v6"
)

// Chains of an Instance table.
const (
	chainPrerouting = "prerouting"
	chainInput      = "input"
	chainForward    = "forward"
	// the guest's traffic to the namespace and through it
	chainGuestInput   = "guest-input"
	chainGuestForward = "guest-forward"
	// the guest's IPv6 traffic through the namespace
	chainGuestForward6 = "guest-forward-v6"
)

const dnsPort = 53

// Build generates the rule table of one Instance namespace from spec. It is
// a pure function: the same spec gives the same table, rule for rule, so a
// takeover can regenerate the table and compare it with the namespace's.
func Build(spec TableSpec) (*Table, error) {
	return buildLayout(spec, layoutVersion)
}

// buildLayout stamps the table with layout version v; tests use other
// versions to stand for tables an older or newer build wrote.
func buildLayout(spec TableSpec, v int) (*Table, error) {
	s, err := spec.check()
	if err != nil {
		return nil, err
	}
	b := newBuilder(v)
	host := b.set(setHost, s.host)
	management := b.set(setManagement, s.management)
	pools := b.set(setPools, s.pools)
	ll := b.set(setLinkLocal, s.linkLocal)
	allow := b.set(setAllow, s.allow)
	deny := b.set(setDeny, s.deny)
	var allowNames, denyNames *Set
	if s.AllowNames {
		allowNames = b.learnedSet(SetAllowNames, nftables.TypeIPAddr)
	}
	if s.DenyNames {
		denyNames = b.learnedSet(SetDenyNames, nftables.TypeIPAddr)
	}
	// IPv6 twins, after every IPv4 set: a table without IPv6 stays what a
	// node without IPv6 writes.
	var host6, management6, pools6, ll6, allow6, deny6, allowNames6, denyNames6 *Set
	if s.ipv6() {
		host6 = b.set6(setHost6, s.host6)
		management6 = b.set6(setManagement6, s.management6)
		pools6 = b.set6(setPools6, s.pools6)
		ll6 = b.set6(setLinkLocal6, s.linkLocal6)
		allow6 = b.set6(setAllow6, s.allow6)
		deny6 = b.set6(setDeny6, s.deny6)
		if s.AllowNames {
			allowNames6 = b.learnedSet(SetAllowNames6, nftables.TypeIP6Addr)
		}
		if s.DenyNames {
			denyNames6 = b.learnedSet(SetDenyNames6, nftables.TypeIP6Addr)
		}
	}
	// Allow restricts both families whichever family its ranges are of.
	restricted := len(s.allow)+len(s.allow6) > 0 || s.AllowNames

	// Fragments are made afresh for every rule, so no two rules share an
	// expression a caller could change under the other.
	fromGuest := func() []expr.Any { return iifname(TapName) }
	tcp := func() []expr.Any { return l4proto(unix.IPPROTO_TCP) }
	udp := func() []expr.Any { return l4proto(unix.IPPROTO_UDP) }

	// Guest DNS goes to the resolver whatever address the guest asked: its
	// resolv.conf names TapAddr, and a guest that ignores it gets the same.
	pre := b.chain(chainPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting,
		nftables.ChainPriorityNATDest, nftables.ChainPolicyAccept)
	b.rule(pre, "dns-udp", fromGuest(), ipv4(), udp(), thDport(expr.CmpOpEq, dnsPort), dnat(s.Resolver))
	b.rule(pre, "dns-tcp", fromGuest(), ipv4(), tcp(), thDport(expr.CmpOpEq, dnsPort), dnat(s.Resolver))

	// The guest's own traffic is decided in a chain of its own (input and
	// forward each jump to theirs), which starts by dropping IPv6: every
	// later rule there sees IPv4 only, so needs neither the interface nor
	// the protocol match. Fewer expressions make a Replace cheaper: the
	// kernel parses each one.
	//
	// DNATed DNS is accepted before the blocked ranges: the resolver may be
	// in a management range and the guest must reach it by design. Only
	// the prerouting rules set "dnat" on a connection whose original port
	// is 53, and the match is on the rewritten destination too.
	dnsAccept := func(c *Chain) {
		b.rule(c, "dns", ctStatus(ctStatusDNAT), ctOriginalDport(dnsPort),
			ipDaddr(s.Resolver.Addr()), thDport(expr.CmpOpEq, s.Resolver.Port()), accept())
	}
	// A guest may only send as itself: the node masquerades by source pool.
	spoofed := func(c *Chain) {
		b.rule(c, "spoofed", ipSaddrNot(s.Guest), countDenied(), drop())
	}

	// The namespace itself is no destination for the guest (refused, as
	// every denied connection), except a resolver that lives in the
	// namespace. What comes from the node is answers to the namespace's
	// own connections.
	guestIn := b.regularChain(chainGuestInput)
	if s.ipv6() {
		// The guest resolves its IPv6 gateway (TapAddr6) and answers the
		// namespace's solicitations for its address: neighbour discovery
		// on the tap's link is all the IPv6 the namespace itself takes
		// (the kernel takes it only with hop limit 255, so from this link).
		for _, nd := range []struct {
			name string
			typ  byte
		}{{"ndp-solicit", icmpv6NeighborSolicit}, {"ndp-advert", icmpv6NeighborAdvert}} {
			b.rule(guestIn, nd.name, ipv6(), l4proto(unix.IPPROTO_ICMPV6), icmpv6Type(nd.typ), accept())
		}
	}
	// Not counted: the guest kernel's router solicitations and MLD reports
	// would read as denied connections.
	b.rule(guestIn, "ipv6", ipv6(), drop())
	spoofed(guestIn)
	dnsAccept(guestIn)
	b.rule(guestIn, "rest", countDenied(), refuse())

	in := b.chain(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput,
		nftables.ChainPriorityFilter, nftables.ChainPolicyDrop)
	b.rule(in, "established", ctState(ctStateEstablished|ctStateRelated), accept())
	b.rule(in, "loopback", iifname("lo"), accept())
	b.rule(in, "guest", fromGuest(), jump(chainGuestInput))

	guestFwd := b.regularChain(chainGuestForward)
	if s.ipv6() {
		b.rule(guestFwd, "ipv6", ipv6(), goTo(chainGuestForward6))
	} else {
		b.rule(guestFwd, "ipv6", ipv6(), countDenied(), drop())
	}
	spoofed(guestFwd)
	dnsAccept(guestFwd)
	for _, blocked := range []struct {
		name string
		set  *Set
	}{{"blocked-host", host}, {"blocked-management", management}, {"blocked-pools", pools}, {"blocked-linklocal", ll}} {
		b.rule(guestFwd, blocked.name, ipDaddrIn(blocked.set), countDenied(), refuse())
	}
	b.rule(guestFwd, "deny", ipDaddrIn(deny), countDenied(), refuse())
	if denyNames != nil {
		b.rule(guestFwd, "deny-names", ipDaddrIn(denyNames), countDenied(), refuse())
	}
	if allowNames != nil {
		// Only public egress has domain rules (check).
		b.rule(guestFwd, "allowed-names", ipDaddrIn(allowNames), oifname(VethName), accept())
	}
	if restricted {
		b.rule(guestFwd, "not-allowed", ipDaddrNotIn(allow), countDenied(), refuse())
	}
	switch s.Egress {
	case EgressPublic:
		b.rule(guestFwd, "egress-public", oifname(VethName), accept())
	case EgressProxy:
		// TCP leaves unchanged: the node TPROXYs it by the guest's
		// source address to the egress process, and never forwards it.
		b.rule(guestFwd, "egress-proxy", tcp(), oifname(VethName), accept())
	}
	// A guest packet that no rule accepts is counted, then refused.
	b.rule(guestFwd, "rest", countDenied(), refuse())

	if s.ipv6() {
		// The same decisions for IPv6, in a chain of its own that sees
		// IPv6 only (guest-forward goes to it).
		g6 := b.regularChain(chainGuestForward6)
		b.rule(g6, "spoofed", ip6SaddrNot(s.Guest6), countDenied(), drop())
		// DNS goes to the deployment resolver over IPv4 (DNATed there
		// whatever the address); over IPv6 it would pass it by.
		b.rule(g6, "dns-udp", udp(), thDport(expr.CmpOpEq, dnsPort), countDenied(), drop())
		b.rule(g6, "dns-tcp", tcp(), thDport(expr.CmpOpEq, dnsPort), countDenied(), drop())
		for _, blocked := range []struct {
			name string
			set  *Set
		}{{"blocked-host", host6}, {"blocked-management", management6}, {"blocked-pools", pools6}, {"blocked-linklocal", ll6}} {
			b.rule(g6, blocked.name, ip6DaddrIn(blocked.set), countDenied(), refuse6())
		}
		b.rule(g6, "deny", ip6DaddrIn(deny6), countDenied(), refuse6())
		if denyNames6 != nil {
			b.rule(g6, "deny-names", ip6DaddrIn(denyNames6), countDenied(), refuse6())
		}
		if allowNames6 != nil {
			b.rule(g6, "allowed-names", ip6DaddrIn(allowNames6), oifname(VethName), accept())
		}
		if restricted {
			b.rule(g6, "not-allowed", ip6DaddrNotIn(allow6), countDenied(), refuse6())
		}
		switch s.Egress {
		case EgressPublic:
			b.rule(g6, "egress-public", oifname(VethName), accept())
		case EgressProxy:
			// The egress process takes IPv4 only, and IPv6 never
			// leaves directly: a reset at once makes a client that
			// tries IPv6 first fall back to IPv4.
			b.rule(g6, "egress-proxy", tcp(), countDenied(), tcpReset())
		}
		b.rule(g6, "rest", countDenied(), refuse6())
	}

	// Conntrack is kept across a Replace, so established connections
	// survive it; everything new is decided here.
	fwd := b.chain(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward,
		nftables.ChainPriorityFilter, nftables.ChainPolicyDrop)
	b.rule(fwd, "established", ctState(ctStateEstablished|ctStateRelated), accept())
	// Not counted: invalid packets are conntrack hygiene, not policy.
	b.rule(fwd, "invalid", ctState(ctStateInvalid), drop())
	b.rule(fwd, "guest", fromGuest(), jump(chainGuestForward))
	// Nothing reaches a guest that it did not ask for.
	b.rule(fwd, "inbound", iifname(VethName), oifname(TapName), countDenied(), drop())
	return b.t, nil
}

// builder assembles a Table with every rule and set marked for layout v.
type builder struct {
	v int
	t *Table
}

func newBuilder(v int) *builder {
	return &builder{v: v, t: &Table{
		Family:   nftables.TableFamilyINet,
		Name:     TableName,
		Comment:  marker(v, "table/"+TableName),
		Counters: []string{CounterDenied},
	}}
}

func (b *builder) set(name string, rs []addrRange) *Set {
	s := &Set{
		Name:    name,
		Comment: marker(b.v, "set/"+name),
		KeyType: nftables.TypeIPAddr,
		Flags:   unix.NFT_SET_INTERVAL,
		Ranges:  rs,
		id:      uint32(len(b.t.Sets) + 1),
	}
	b.t.Sets = append(b.t.Sets, s)
	return s
}

// set6 adds an interval set of IPv6 ranges.
func (b *builder) set6(name string, rs []addrRange) *Set {
	s := b.set(name, rs)
	s.KeyType = nftables.TypeIP6Addr
	return s
}

// learnedSet adds a set of single addresses whose elements expire: the
// resolver fills it at run time, so a generated table holds it empty.
func (b *builder) learnedSet(name string, key nftables.SetDatatype) *Set {
	s := &Set{
		Name:    name,
		Comment: marker(b.v, "set/"+name),
		KeyType: key,
		Flags:   unix.NFT_SET_TIMEOUT,
		id:      uint32(len(b.t.Sets) + 1),
	}
	b.t.Sets = append(b.t.Sets, s)
	return s
}

func (b *builder) chain(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, policy nftables.ChainPolicy) *Chain {
	c := &Chain{Name: name, Type: typ, Hook: *hook, Priority: *prio, Policy: policy, Comment: marker(b.v, "chain/"+name)}
	b.t.Chains = append(b.t.Chains, c)
	return c
}

// regularChain adds a chain without a hook, entered by jumps.
func (b *builder) regularChain(name string) *Chain {
	c := &Chain{Name: name, regular: true, Comment: marker(b.v, "chain/"+name)}
	b.t.Chains = append(b.t.Chains, c)
	return c
}

func (b *builder) rule(c *Chain, name string, parts ...[]expr.Any) {
	c.Rules = append(c.Rules, &Rule{Comment: marker(b.v, c.Name+"/"+name), Exprs: seq(parts...)})
}
