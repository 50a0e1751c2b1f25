package netpol

import "net/netip"

// Egress modes of a rule table. A named Egress object of the FSM is
// EgressProxy here: every guest TCP connection goes to the egress process.
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
	// ProxyPort is the egress process's transparent listener in the
	// namespace (EgressProxy): guest TCP is redirected to it.
	ProxyPort uint16
}
