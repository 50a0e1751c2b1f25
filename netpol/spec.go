package netpol

import (
	"fmt"
	"net/netip"
)

// Egress modes of a rule table. A named Egress object of the FSM is
// EgressProxy here: every guest TCP connection leaves the namespace
// unchanged and the node TPROXYs it to the egress process (HostSpec
// Proxied); nothing else but DNS leaves.
const (
	EgressNone   = "none"
	EgressPublic = "public"
	EgressProxy  = "proxy"
)

// Names inside an Instance namespace. Every namespace is isolated from the
// others, so they are the same in all of them.
const (
	TapName  = "kt0" // the VMM's tap
	VethName = "ve0" // the namespace end of the link to the node
	// TapAddr is the namespace's address on the tap: the guest's gateway and
	// the nameserver its resolv.conf names (DNS to it is DNATed).
	TapAddr = "169.254.100.1"
	// TapMAC is the tap's hardware address, the same in every namespace
	// (each tap is alone on its link): a restored guest's neighbour entry
	// for its gateway stays right on the tap of its new Instance.
	TapMAC = "02:6b:62:00:00:01"
	// NodeHop is the symbolic next hop of the namespace towards the node: a
	// permanent neighbour entry maps it to the node-side veth's MAC, so the
	// node side needs no address and no proxy ARP.
	NodeHop = "169.254.100.254"
	// TapAddr6 is the namespace's IPv6 address on the tap, the guest's
	// IPv6 gateway (link-local: it never leaves the tap's link).
	TapAddr6 = "fe80::1"
	// NodeHop6 is NodeHop's IPv6 twin: a permanent neighbour entry on the
	// namespace's veth, no address on either end.
	NodeHop6 = "fe80::fe"
)

// TableSpec is everything a rule table is generated from: the Instance's
// recorded policy and the node's configuration at the time. Generation is a
// pure function of it (Build), so a takeover can regenerate and compare.
type TableSpec struct {
	// Guest is the guest's IPv4 address (from the node's pool).
	Guest netip.Addr
	// Guest6 is the guest's IPv6 address (from the node's ipv6_pool), or
	// none: then guest IPv6 is dropped whole and the table is exactly what
	// a node without IPv6 writes. With it, every IPv4 set and rule below
	// has an IPv6 twin (the lists may mix families).
	Guest6 netip.Addr
	// Egress is EgressNone, EgressPublic or EgressProxy.
	Egress string
	// Resolver is where guest DNS (udp/tcp 53 to any address) is DNATed:
	// the deployment resolver, or the egress process's for a Resolver.
	Resolver netip.AddrPort
	// Blocked are always unreachable from the guest, whatever the policy:
	// HostAddrs (the node's own addresses), Management (management_cidrs),
	// Pools (every guest address of the node: no guest-to-guest) and the
	// link-local and metadata ranges the generator adds itself.
	HostAddrs  []netip.Prefix
	Management []netip.Prefix
	Pools      []netip.Prefix
	// Allow and Deny narrow public egress: with Allow non-empty only those
	// ranges are reachable (of either family: an Allow of IPv6 ranges only
	// leaves no IPv4 destination but learned names); Deny always wins.
	Allow []netip.Prefix
	Deny  []netip.Prefix
	// AllowNames and DenyNames say the policy has domain rules: the
	// node's resolver (Resolver must be it) learns the addresses it
	// answered for an allowed or a denied name into the table's learned
	// sets (Learn), and only learned addresses of allowed names pass
	// besides Allow, so dialling an address no allowed name resolved to
	// gets nowhere. Public egress only.
	AllowNames bool
	DenyNames  bool
}

// checkedSpec is a TableSpec that passed validation, with its address lists
// as the merged ranges the sets hold, per family.
type checkedSpec struct {
	TableSpec
	host, management, pools, linkLocal, allow, deny       []addrRange
	host6, management6, pools6, linkLocal6, allow6, deny6 []addrRange
}

// ipv6 says whether the guest has an IPv6 address: then the table has
// IPv6 sets and rules.
func (c checkedSpec) ipv6() bool { return c.Guest6.IsValid() }

// linkLocal are the ranges every guest is kept from besides the node's:
// link-local (where cloud metadata services live), Alibaba's metadata
// address, and IPv4 multicast and broadcast.
var linkLocal = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// linkLocal6 are linkLocal's IPv6 twins: link-local (what NDP with the
// namespace needs is accepted before, on the tap only), multicast, the
// cloud metadata services' IPv6 addresses (AWS, GCP), the NAT64 prefixes
// (a NAT64 gateway on the node's network would carry a guest to IPv4
// ranges the IPv4 rules keep it from) and IPv4-mapped addresses.
var linkLocal6 = []netip.Prefix{
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("fd20:ce::254/128"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
	netip.MustParsePrefix("::ffff:0:0/96"),
}

// check validates s. The lists may hold prefixes of either family; the
// IPv6 ones only make sets when the guest has an IPv6 address (without
// one, guest IPv6 is dropped whole), but an Allow of IPv6 ranges still
// restricts IPv4: leaving it out would turn "only these" into "everything".
func (s TableSpec) check() (checkedSpec, error) {
	c := checkedSpec{TableSpec: s}
	if !s.Guest.Is4() || s.Guest.IsUnspecified() {
		return c, fmt.Errorf("netpol: table spec: guest address %q: want an IPv4 address", s.Guest)
	}
	if s.Guest6.IsValid() && (!s.Guest6.Is6() || s.Guest6.Is4In6() || s.Guest6.IsUnspecified() || s.Guest6.Zone() != "" ||
		s.Guest6.IsLinkLocalUnicast() || s.Guest6.IsMulticast()) {
		return c, fmt.Errorf("netpol: table spec: guest IPv6 address %q: want a global or unique-local IPv6 address", s.Guest6)
	}
	if !s.Resolver.IsValid() || !s.Resolver.Addr().Is4() || s.Resolver.Addr().IsUnspecified() || s.Resolver.Port() == 0 {
		return c, fmt.Errorf("netpol: table spec: resolver %q: want an IPv4 address and port", s.Resolver)
	}
	switch s.Egress {
	case EgressNone, EgressPublic, EgressProxy:
	default:
		return c, fmt.Errorf("netpol: table spec: egress %q: want %q, %q or %q", s.Egress, EgressNone, EgressPublic, EgressProxy)
	}
	if (s.AllowNames || s.DenyNames) && s.Egress != EgressPublic {
		return c, fmt.Errorf("netpol: table spec: domain rules apply to egress %q only, not %q", EgressPublic, s.Egress)
	}
	var err error
	lists := []struct {
		name      string
		in        []netip.Prefix
		out, out6 *[]addrRange
	}{
		{"host address", s.HostAddrs, &c.host, &c.host6},
		{"management", s.Management, &c.management, &c.management6},
		{"pool", s.Pools, &c.pools, &c.pools6},
		{"allow", s.Allow, &c.allow, &c.allow6},
		{"deny", s.Deny, &c.deny, &c.deny6},
	}
	for _, l := range lists {
		if *l.out, *l.out6, err = familyRanges("table spec", l.name, l.in); err != nil {
			return c, err
		}
	}
	c.linkLocal = rangesOf(linkLocal)
	c.linkLocal6 = rangesOf(linkLocal6)
	return c, nil
}

// familyRanges validates the prefixes of one list of spec (named in errors
// as what) and returns them as ranges, IPv4 and IPv6 apart.
func familyRanges(spec, what string, in []netip.Prefix) (v4, v6 []addrRange, err error) {
	var p4, p6 []netip.Prefix
	for _, p := range in {
		switch {
		case !p.IsValid():
			return nil, nil, fmt.Errorf("netpol: %s: %s prefix %q: not a valid prefix", spec, what, p)
		case p.Addr().Is4():
			p4 = append(p4, p)
		case p.Addr().Is4In6():
			return nil, nil, fmt.Errorf("netpol: %s: %s prefix %s: write IPv4 prefixes as IPv4", spec, what, p)
		default:
			p6 = append(p6, p)
		}
	}
	return rangesOf(p4), rangesOf(p6), nil
}
