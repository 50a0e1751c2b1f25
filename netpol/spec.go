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
	// NodeHop is the symbolic next hop of the namespace towards the node: a
	// permanent neighbour entry maps it to the node-side veth's MAC, so the
	// node side needs no address and no proxy ARP.
	NodeHop = "169.254.100.254"
)

// TableSpec is everything a rule table is generated from: the Instance's
// recorded policy and the node's configuration at the time. Generation is a
// pure function of it (Build), so a takeover can regenerate and compare.
type TableSpec struct {
	// Guest is the guest's IPv4 address (from the node's pool).
	Guest netip.Addr
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
	// ranges are reachable; Deny always wins over Allow.
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
// as the merged IPv4 ranges the sets hold.
type checkedSpec struct {
	TableSpec
	host, management, pools, linkLocal, allow, deny []addrRange
}

// linkLocal are the ranges every guest is kept from besides the node's:
// link-local (where cloud metadata services live), Alibaba's metadata
// address, and IPv4 multicast and broadcast.
var linkLocal = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("224.0.0.0/3"),
}

// check validates s. The blocked lists may hold IPv6 prefixes (a node's
// own addresses usually do): they are left out because guest IPv6 is
// dropped whole. Allow and Deny may not, since leaving an IPv6-only Allow
// out would turn "only these" into "everything".
func (s TableSpec) check() (checkedSpec, error) {
	c := checkedSpec{TableSpec: s}
	if !s.Guest.Is4() || s.Guest.IsUnspecified() {
		return c, fmt.Errorf("netpol: table spec: guest address %q: want an IPv4 address", s.Guest)
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
		name   string
		in     []netip.Prefix
		out    *[]addrRange
		skipV6 bool
	}{
		{"host address", s.HostAddrs, &c.host, true},
		{"management", s.Management, &c.management, true},
		{"pool", s.Pools, &c.pools, true},
		{"allow", s.Allow, &c.allow, false},
		{"deny", s.Deny, &c.deny, false},
	}
	for _, l := range lists {
		if *l.out, err = ipv4Ranges("table spec", l.name, l.in, l.skipV6); err != nil {
			return c, err
		}
	}
	c.linkLocal = rangesOf(linkLocal)
	return c, nil
}

// ipv4Ranges validates the prefixes of one list of spec (named in errors
// as what) and returns its IPv4 part as ranges; IPv6 prefixes are left out
// when skipV6, else refused.
func ipv4Ranges(spec, what string, in []netip.Prefix, skipV6 bool) ([]addrRange, error) {
	var v4 []netip.Prefix
	for _, p := range in {
		switch {
		case !p.IsValid():
			return nil, fmt.Errorf("netpol: %s: %s prefix %q: not a valid prefix", spec, what, p)
		case p.Addr().Is4():
			v4 = append(v4, p)
		case p.Addr().Is4In6():
			return nil, fmt.Errorf("netpol: %s: %s prefix %s: write IPv4 prefixes as IPv4", spec, what, p)
		case !skipV6:
			return nil, fmt.Errorf("netpol: %s: %s prefix %s: IPv6 egress policy is not supported yet (guest IPv6 is dropped)", spec, what, p)
		}
	}
	return rangesOf(v4), nil
}
