package netpol

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Config is the node's [network] configuration.
type Config struct {
	// IPv4Pool is the range guest addresses of this node come from; every
	// Instance gets one address of it (a /32 routed to its namespace).
	IPv4Pool netip.Prefix
	// IPv6Pool, when set, gives every Instance an IPv6 address besides
	// (a /128 routed to its namespace, masqueraded when it leaves); unset,
	// guest IPv6 is dropped.
	IPv6Pool netip.Prefix
	// ManagementCIDRs are always unreachable from guests.
	ManagementCIDRs []netip.Prefix
	// Resolvers is the deployment resolver list; guest DNS is DNATed to the
	// first. The node never uses /etc/resolv.conf for guests.
	Resolvers []netip.AddrPort
	// Uplink is how public egress leaves the node: an interface name, or a
	// source address of the node (masqueraded to it).
	Uplink string
}

// DNSPort is the port of a resolver given without one.
const DNSPort = 53

// ParseConfig checks the [network] table of a node's configuration, given
// as strings, and says in one line what is wrong.
func ParseConfig(ipv4Pool, ipv6Pool string, management, resolvers []string, uplink string) (Config, error) {
	var c Config
	if ipv4Pool == "" {
		return c, errors.New("network: ipv4_pool is missing: give the range guest addresses of this node come from, e.g. ipv4_pool = \"10.200.0.0/16\"")
	}
	p, err := netip.ParsePrefix(ipv4Pool)
	if err != nil || !p.Addr().Is4() {
		return c, fmt.Errorf("network: ipv4_pool %q is not an IPv4 range such as 10.200.0.0/16", ipv4Pool)
	}
	if p != p.Masked() {
		return c, fmt.Errorf("network: ipv4_pool %q has host bits set; did you mean %s?", ipv4Pool, p.Masked())
	}
	if p.Bits() > 30 {
		return c, fmt.Errorf("network: ipv4_pool %s holds fewer than 2 guest addresses; give a /30 or larger", p)
	}
	c.IPv4Pool = p
	if ipv6Pool != "" {
		if c.IPv6Pool, err = parseIPv6Pool(ipv6Pool); err != nil {
			return c, err
		}
	}
	for _, m := range management {
		mp, err := netip.ParsePrefix(m)
		if err != nil {
			if a, aerr := netip.ParseAddr(m); aerr == nil {
				mp, err = a.Prefix(a.BitLen())
			}
		}
		if err != nil {
			return c, fmt.Errorf("network: management_cidrs entry %q is not a CIDR such as 10.0.0.0/8", m)
		}
		c.ManagementCIDRs = append(c.ManagementCIDRs, mp.Masked())
	}
	for _, r := range resolvers {
		ap, err := parseResolver(r)
		if err != nil {
			return c, fmt.Errorf("network: resolvers entry %q: %v", r, err)
		}
		c.Resolvers = append(c.Resolvers, ap)
	}
	if len(c.Resolvers) == 0 {
		return c, errors.New("network: resolvers is empty: give the deployment's DNS resolvers, e.g. resolvers = [\"10.0.0.2\"]; the node does not use /etc/resolv.conf for guests")
	}
	c.Uplink = strings.TrimSpace(uplink)
	if c.Uplink == "" {
		return c, errors.New("network: uplink is missing: give the interface (e.g. \"eth0\") or source address public egress leaves through")
	}
	if a, err := netip.ParseAddr(c.Uplink); err == nil && !a.Is4() {
		return c, fmt.Errorf("network: uplink %s: a source address must be IPv4; give the interface public egress leaves by instead", c.Uplink)
	}
	return c, c.Validate()
}

func parseResolver(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return ap, errors.New("port 0")
		}
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, errors.New("want an IP address, optionally with :port")
	}
	if !a.Is4() {
		return netip.AddrPort{}, errors.New("only IPv4 resolvers are supported yet")
	}
	return netip.AddrPortFrom(a, DNSPort), nil
}

// IPv6 pool bounds: a /64 holds more guests than any node runs; past a
// /120 a pool holds too few to be worth configuring.
const (
	minIPv6PoolBits = 64
	maxIPv6PoolBits = 120
)

// parseIPv6Pool checks ipv6_pool: a global or unique-local IPv6 prefix of
// sensible size, clear of the ranges guests never reach.
func parseIPv6Pool(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() {
		return p, fmt.Errorf("network: ipv6_pool %q is not an IPv6 range such as fd6b:6b00:1::/64", s)
	}
	if p != p.Masked() {
		return p, fmt.Errorf("network: ipv6_pool %q has host bits set; did you mean %s?", s, p.Masked())
	}
	switch {
	case p.Bits() < minIPv6PoolBits:
		return p, fmt.Errorf("network: ipv6_pool %s is larger than a /%d; give a /%d to /%d", p, minIPv6PoolBits, minIPv6PoolBits, maxIPv6PoolBits)
	case p.Bits() > maxIPv6PoolBits:
		return p, fmt.Errorf("network: ipv6_pool %s holds fewer than %d guest addresses; give a /%d to /%d", p, 1<<(128-maxIPv6PoolBits), minIPv6PoolBits, maxIPv6PoolBits)
	case p.Addr().IsLinkLocalUnicast():
		return p, fmt.Errorf("network: ipv6_pool %s is link-local (fe80::/10), which never leaves a link; pick a global or unique-local (fc00::/7) range", p)
	case p.Addr().IsMulticast():
		return p, fmt.Errorf("network: ipv6_pool %s is multicast (ff00::/8); pick a global or unique-local (fc00::/7) range", p)
	case reservedIPv6.Overlaps(p):
		return p, fmt.Errorf("network: ipv6_pool %s is in %s (unspecified, loopback, IPv4-mapped); pick a global or unique-local (fc00::/7) range", p, reservedIPv6)
	}
	for _, s := range linkLocal6 {
		if s.Overlaps(p) {
			return p, fmt.Errorf("network: ipv6_pool %s overlaps %s, which guests never reach; pick another pool", p, s)
		}
	}
	return p, nil
}

// reservedIPv6 holds the unspecified and loopback addresses and the
// IPv4-compatible and IPv4-mapped ranges: no pool belongs there.
var reservedIPv6 = netip.MustParsePrefix("::/80")

// Validate checks the parts against each other: what guests get and what
// they must never reach cannot overlap.
func (c Config) Validate() error {
	for _, m := range c.ManagementCIDRs {
		if m.Overlaps(c.IPv4Pool) {
			return fmt.Errorf("network: ipv4_pool %s overlaps management_cidrs entry %s: guests would be management hosts; pick a pool outside it", c.IPv4Pool, m)
		}
		if c.IPv6Pool.IsValid() && m.Overlaps(c.IPv6Pool) {
			return fmt.Errorf("network: ipv6_pool %s overlaps management_cidrs entry %s: guests would be management hosts; pick a pool outside it", c.IPv6Pool, m)
		}
		if a, err := netip.ParseAddr(c.Uplink); err == nil && m.Contains(a) {
			return fmt.Errorf("network: management_cidrs entry %s covers the uplink address %s: public egress would leave through the management network; narrow the range or pick another uplink", m, a)
		}
	}
	if a, err := netip.ParseAddr(c.Uplink); err == nil && c.IPv4Pool.Contains(a) {
		return fmt.Errorf("network: uplink address %s is inside ipv4_pool %s; pick a pool that does not hold the node's own addresses", a, c.IPv4Pool)
	}
	if a, err := netip.ParseAddr(c.Uplink); err == nil && c.IPv6Pool.IsValid() && c.IPv6Pool.Contains(a) {
		return fmt.Errorf("network: uplink address %s is inside ipv6_pool %s; pick a pool that does not hold the node's own addresses", a, c.IPv6Pool)
	}
	for _, r := range c.Resolvers {
		if c.IPv4Pool.Contains(r.Addr()) {
			return fmt.Errorf("network: resolver %s is inside ipv4_pool %s: that is a guest address", r, c.IPv4Pool)
		}
		if c.IPv6Pool.IsValid() && c.IPv6Pool.Contains(r.Addr()) {
			return fmt.Errorf("network: resolver %s is inside ipv6_pool %s: that is a guest address", r, c.IPv6Pool)
		}
	}
	for _, s := range []netip.Prefix{linkLocalRange} {
		if s.Overlaps(c.IPv4Pool) {
			return fmt.Errorf("network: ipv4_pool %s overlaps the link-local range %s, which guests never reach; pick another pool", c.IPv4Pool, s)
		}
	}
	return nil
}

// Pools are the guest address pools: the IPv4 one, and the IPv6 one when
// there is one.
func (c Config) Pools() []netip.Prefix {
	ps := []netip.Prefix{c.IPv4Pool}
	if c.IPv6Pool.IsValid() {
		ps = append(ps, c.IPv6Pool)
	}
	return ps
}

// UplinkInterface is the uplink when it is an interface name, else "".
func (c Config) UplinkInterface() string {
	if _, err := netip.ParseAddr(c.Uplink); err == nil {
		return ""
	}
	return c.Uplink
}

// UplinkAddr is the uplink when it is a source address.
func (c Config) UplinkAddr() netip.Addr {
	a, _ := netip.ParseAddr(c.Uplink)
	return a
}

var linkLocalRange = netip.MustParsePrefix("169.254.0.0/16")

// ErrPoolFull: every address of the pool is held by an Instance.
var ErrPoolFull = errors.New("address pool is full")

// Allocate returns the lowest address of the IPv4 pool that is not in
// used, skipping the network and broadcast addresses; prefer instead when
// it is one of those and free (a restored guest keeps its address, and
// with it its connections and its configuration).
func (c Config) Allocate(used []netip.Addr, prefer netip.Addr) (netip.Addr, error) {
	return allocate("ipv4_pool", c.IPv4Pool, lastAddr(c.IPv4Pool).Prev(), used, prefer)
}

// Allocate6 is Allocate of the IPv6 pool, skipping the subnet-router
// anycast address (the pool's first).
func (c Config) Allocate6(used []netip.Addr, prefer netip.Addr) (netip.Addr, error) {
	if !c.IPv6Pool.IsValid() {
		return netip.Addr{}, errors.New("network: no ipv6_pool")
	}
	return allocate("ipv6_pool", c.IPv6Pool, lastAddr(c.IPv6Pool), used, prefer)
}

func allocate(name string, pool netip.Prefix, last netip.Addr, used []netip.Addr, prefer netip.Addr) (netip.Addr, error) {
	if prefer.IsValid() && pool.Contains(prefer) && prefer.Compare(pool.Addr()) > 0 && prefer.Compare(last) <= 0 && !slices.Contains(used, prefer) {
		return prefer, nil
	}
	taken := slices.Clone(used)
	slices.SortFunc(taken, func(a, b netip.Addr) int { return a.Compare(b) })
	i := 0
	for a := pool.Addr().Next(); a.IsValid() && a.Compare(last) <= 0; a = a.Next() {
		for i < len(taken) && taken[i].Compare(a) < 0 {
			i++
		}
		if i < len(taken) && taken[i] == a {
			continue
		}
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("network: %s %s: %w (%d Instances); stop some or give the node a larger pool", name, pool, ErrPoolFull, len(used))
}
