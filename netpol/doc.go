// Package netpol is the host-local network of Instances: every Instance's
// network namespace with the tap its VMM uses and the veth that joins it to
// the node, the guest address pools, the nftables rule table the node owns in
// each namespace (generated from the recorded policy and the node's current
// configuration, replaced whole in one transaction) and the checks a
// takeover makes before it trusts a namespace it did not just create.
//
// It knows nothing of consensus: callers hand it the policy and the node's
// [network] configuration. It never runs nft or ip: tables and links are
// netlink messages. Generation (Build, BuildHost) does no I/O, so a table
// can be regenerated and compared; every table, chain, rule and set it
// writes carries a "kibotos:v<layout>:<name>" comment, which is how Inspect
// tells the node's objects from hand-made ones and one layout from another.
//
// The path of a guest packet: guest eth0 -> tap kt0 (Instance namespace,
// where the rule table filters and DNATs DNS) -> veth ve0 / kb-<hash> (node
// namespace, which routes and masquerades it) -> the uplink. A guest of a
// node with an ipv6_pool has an IPv6 address too, routed the same way (its
// gateway the tap's fe80::1) and filtered by the IPv4 rules' IPv6 twins;
// without one, guest IPv6 is dropped and every table is what it was before
// IPv6 (both are layout v1: the IPv6 part comes with the spec, not with a
// layout).
package netpol
