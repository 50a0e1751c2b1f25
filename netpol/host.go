package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NodeVethPrefix starts the name of every node-side veth of an Instance
// (kb-<hash>): the node's own table matches Instance traffic by it.
const NodeVethPrefix = "kb-"

// Chains of the node's own table.
const (
	chainHostPrerouting  = "prerouting"
	chainHostInput       = "input"
	chainHostForward     = "forward"
	chainHostPostrouting = "postrouting"
	setProxied           = "proxied_v4"
)

// ProxyMark marks TPROXYed guest TCP; the node's policy route for it
// (PolicyRoute, table ProxyRouteTable) delivers it locally. Both are
// values no stock system uses ("kb" in ASCII).
const (
	ProxyMark       = 0x6b62
	ProxyRouteTable = 0x6b62
)

// HostSpec is what the node's own table (in the node's namespace, beside
// whatever else runs there) is generated from: the node's [network]
// configuration.
type HostSpec struct {
	// Pools are the node's guest address pools: what is masqueraded. With
	// an IPv6 pool the table forwards and masquerades guest IPv6 too
	// (always masquerade: UplinkAddr is IPv4); without one it is exactly
	// the table of a node without IPv6.
	Pools []netip.Prefix
	// Management are the management_cidrs no Instance may reach.
	Management []netip.Prefix
	// UplinkIface is the interface Instance traffic leaves by; empty to
	// let it leave by any (then UplinkAddr must be set).
	UplinkIface string
	// UplinkAddr, when set, is the source address Instance traffic is
	// SNATed to instead of masqueraded.
	UplinkAddr netip.Addr
	// Proxied are the guests whose policy names an Egress: their TCP is
	// TPROXYed to ProxyPort (the egress process's transparent listener)
	// with ProxyMark, for which the node routes everything locally
	// (PolicyRoute), and is never forwarded.
	Proxied   []netip.Addr
	ProxyPort uint16
	// Resolvers are the addresses Instance tables DNAT guest DNS to (the
	// deployment resolver and any egress resolvers). The node's conntrack
	// never sees the Instance namespace's DNAT, so "DNATed DNS" is matched
	// here by its destination: it is reachable even in a management range.
	Resolvers []netip.AddrPort
}

// BuildHost generates the node's own table. Like Build it is a pure
// function of its input.
func BuildHost(h HostSpec) (*Table, error) {
	return buildHostLayout(h, layoutVersion)
}

func buildHostLayout(h HostSpec, v int) (*Table, error) {
	pools, pools6, err := familyRanges("host spec", "pool", h.Pools)
	if err != nil {
		return nil, err
	}
	management, management6, err := familyRanges("host spec", "management", h.Management)
	if err != nil {
		return nil, err
	}
	v6 := len(pools6) > 0
	if h.UplinkIface == "" && !h.UplinkAddr.IsValid() {
		return nil, fmt.Errorf("netpol: host spec: no uplink: set an uplink interface or an uplink source address")
	}
	if h.UplinkIface != "" && !validIfname(h.UplinkIface) {
		return nil, fmt.Errorf("netpol: host spec: uplink interface %q: not an interface name, or one of the Instances' (%s*)", h.UplinkIface, NodeVethPrefix)
	}
	if h.UplinkAddr.IsValid() && (!h.UplinkAddr.Is4() || h.UplinkAddr.IsUnspecified()) {
		return nil, fmt.Errorf("netpol: host spec: uplink address %s: want an IPv4 address", h.UplinkAddr)
	}
	resolvers := slices.Clone(h.Resolvers)
	for _, r := range resolvers {
		if !r.IsValid() || !r.Addr().Is4() || r.Addr().IsUnspecified() || r.Port() == 0 {
			return nil, fmt.Errorf("netpol: host spec: resolver %q: want an IPv4 address and port", r)
		}
	}
	slices.SortFunc(resolvers, func(a, b netip.AddrPort) int { return a.Compare(b) })
	resolvers = slices.Compact(resolvers)

	if len(h.Proxied) > 0 && h.ProxyPort == 0 {
		return nil, fmt.Errorf("netpol: host spec: %d proxied guests but no proxy port", len(h.Proxied))
	}
	var proxied []netip.Prefix
	for _, a := range h.Proxied {
		if !a.Is4() {
			return nil, fmt.Errorf("netpol: host spec: proxied guest %s: want an IPv4 address", a)
		}
		proxied = append(proxied, netip.PrefixFrom(a, 32))
	}
	proxiedRanges := rangesOf(proxied)

	b := newBuilder(v)
	b.t.Counters = nil
	poolSet := b.set(setPools, pools)
	mgmtSet := b.set(setManagement, management)
	proxiedSet := b.set(setProxied, proxiedRanges)
	var poolSet6, mgmtSet6 *Set
	if v6 {
		poolSet6 = b.set6(setPools6, pools6)
		mgmtSet6 = b.set6(setManagement6, management6)
	}

	fromInstances := func() []expr.Any { return iifnamePrefix(NodeVethPrefix) }
	// Policy accept: the node's namespace carries traffic that is not the
	// Instances', and other tables decide about that.
	fwd := b.chain(chainHostForward, nftables.ChainTypeFilter, nftables.ChainHookForward,
		nftables.ChainPriorityFilter, nftables.ChainPolicyAccept)
	b.rule(fwd, "established", fromInstances(), ctState(ctStateEstablished|ctStateRelated), accept())
	for _, r := range resolvers {
		for _, p := range []struct {
			name  string
			proto byte
		}{{"udp", unix.IPPROTO_UDP}, {"tcp", unix.IPPROTO_TCP}} {
			b.rule(fwd, fmt.Sprintf("dns-%s-%s", p.name, r), fromInstances(), ipv4(), l4proto(p.proto),
				ipDaddr(r.Addr()), thDport(expr.CmpOpEq, r.Port()), accept())
		}
	}
	// Proxied guests' TCP never leaves directly: without an egress
	// process to take it, a connect fails at once.
	b.rule(fwd, "proxied-tcp", fromInstances(), ipv4(), ipSaddrIn(proxiedSet), l4proto(unix.IPPROTO_TCP), tcpReset())
	b.rule(fwd, "blocked-management", fromInstances(), ipv4(), ipDaddrIn(mgmtSet), drop())
	if v6 {
		b.rule(fwd, "blocked-management-v6", fromInstances(), ipv6(), ip6DaddrIn(mgmtSet6), drop())
	}
	b.rule(fwd, "guest-to-guest", fromInstances(), oifnamePrefix(NodeVethPrefix, expr.CmpOpEq), drop())
	toUplinkIface := func() []expr.Any { return nil }
	if h.UplinkIface != "" {
		toUplinkIface = func() []expr.Any { return oifname(h.UplinkIface) }
	}
	b.rule(fwd, "uplink", fromInstances(), toUplinkIface(), ipv4(), accept())
	if v6 {
		b.rule(fwd, "uplink-v6", fromInstances(), toUplinkIface(), ipv6(), accept())
	}
	b.rule(fwd, "from-instances", fromInstances(), drop())
	b.rule(fwd, "to-instances-established", oifnamePrefix(NodeVethPrefix, expr.CmpOpEq), ctState(ctStateEstablished|ctStateRelated), accept())
	b.rule(fwd, "to-instances", oifnamePrefix(NodeVethPrefix, expr.CmpOpEq), drop())

	// Before routing: proxied guests' TCP (but DNS to a resolver, which
	// forward accepts above) goes to the egress process's listener.
	pre := b.chain(chainHostPrerouting, nftables.ChainTypeFilter, nftables.ChainHookPrerouting,
		nftables.ChainPriorityMangle, nftables.ChainPolicyAccept)
	for _, r := range resolvers {
		b.rule(pre, fmt.Sprintf("dns-tcp-%s", r), fromInstances(), ipv4(), l4proto(unix.IPPROTO_TCP),
			ipDaddr(r.Addr()), thDport(expr.CmpOpEq, r.Port()), accept())
	}
	var in *Chain
	if h.ProxyPort != 0 || v6 {
		in = b.chain(chainHostInput, nftables.ChainTypeFilter, nftables.ChainHookInput,
			nftables.ChainPriorityFilter, nftables.ChainPolicyAccept)
	}
	if h.ProxyPort != 0 {
		b.rule(pre, "proxied-tcp", fromInstances(), ipv4(), ipSaddrIn(proxiedSet), l4proto(unix.IPPROTO_TCP),
			tproxy(h.ProxyPort, ProxyMark), accept())
		// The listener is bound to every address: only TPROXYed packets
		// may reach it, not connections to the node's own addresses.
		b.rule(in, "proxy-listener", ipv4(), l4proto(unix.IPPROTO_TCP), thDport(expr.CmpOpEq, h.ProxyPort), metaMarkNot(ProxyMark), drop())
	}
	if v6 {
		// Guests reach nothing of the node over IPv6 (their DNS and the
		// node's services are IPv4), so every node address is out of
		// reach here, also one added after their tables were written
		// (temporary addresses come and go).
		b.rule(in, "instances-v6", fromInstances(), ipv6(), drop())
	}

	post := b.chain(chainHostPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting,
		nftables.ChainPriorityNATSource, nftables.ChainPolicyAccept)
	toUplink := seq(ipv4(), ipSaddrIn(poolSet), oifnamePrefix(NodeVethPrefix, expr.CmpOpNeq))
	if h.UplinkAddr.IsValid() {
		b.rule(post, "snat", toUplink, snat(h.UplinkAddr))
	} else {
		b.rule(post, "masquerade", toUplink, masquerade())
	}
	if v6 {
		// NAT66: the node's address on the way out, as for IPv4; most
		// hosts have one global address, not a routed prefix for guests.
		b.rule(post, "masquerade-v6", ipv6(), ip6SaddrIn(poolSet6), oifnamePrefix(NodeVethPrefix, expr.CmpOpNeq), masquerade())
	}
	return b.t, nil
}

// ReplaceHost puts the node's own table t (from BuildHost) in place in the
// node's namespace, atomically like Replace; other tables there are left
// alone.
func ReplaceHost(ctx context.Context, nsFD int, t *Table) error {
	if t.chain(chainHostPostrouting) == nil {
		return fmt.Errorf("netpol: namespace fd %d: replace host table %s: not a table from BuildHost", nsFD, t.Name)
	}
	return Replace(ctx, nsFD, t)
}

// validIfname accepts what the kernel takes as an interface name, except
// the Instances' own prefix.
func validIfname(n string) bool {
	return len(n) < unix.IFNAMSIZ && n != "." && n != ".." &&
		!strings.ContainsAny(n, "/: \t\n\x00") && !strings.HasPrefix(n, NodeVethPrefix)
}
