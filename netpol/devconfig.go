package netpol

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// devPools are the guest ranges a dev cluster tries, first one that
// overlaps nothing of the host.
var devPools = []string{"10.213.0.0/16", "10.214.0.0/16", "172.29.0.0/16", "192.168.213.0/24"}

// DevConfig is the [network] of a one-node dev cluster on this host: a
// guest pool that overlaps none of the host's routes, the host's default
// route interface as uplink and the host's own upstream resolvers as the
// deployment resolvers (read once here to write the configuration; a node
// never reads resolv.conf for guests). A dev host has no management
// network to protect beyond its own addresses, which guests never reach.
func DevConfig() (Config, error) {
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		return Config{}, fmt.Errorf("netpol: dev network: list routes: %w", err)
	}
	var uplink string
	var taken []netip.Prefix
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil && uplink == "" {
				uplink = l.Attrs().Name
			}
			continue
		}
		// Routes to this node's own guests (a restart finds them) are
		// the pool, not something it must avoid.
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil && strings.HasPrefix(l.Attrs().Name, NodeVethPrefix) {
			continue
		}
		if p, ok := prefixOf(r.Dst); ok {
			taken = append(taken, p)
		}
	}
	if uplink == "" {
		return Config{}, errors.New("netpol: dev network: this host has no default route, so Workspaces with public egress could not leave it; add one or give [network] uplink in a config file")
	}
	var pool netip.Prefix
	for _, s := range devPools {
		p := netip.MustParsePrefix(s)
		if !overlapsAny(p, taken) {
			pool = p
			break
		}
	}
	if !pool.IsValid() {
		return Config{}, fmt.Errorf("netpol: dev network: every dev guest range %v overlaps a route of this host; give [network] ipv4_pool in a config file", devPools)
	}
	resolvers := hostResolvers()
	if len(resolvers) == 0 {
		return Config{}, errors.New("netpol: dev network: no resolver that guests can reach in /etc/resolv.conf or /run/systemd/resolve/resolv.conf (loopback resolvers are not reachable from a guest); give [network] resolvers in a config file")
	}
	c := Config{IPv4Pool: pool, Resolvers: resolvers, Uplink: uplink}
	return c, c.Validate()
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	ip := n.IP
	if v4 := ip.To4(); v4 != nil && len(n.Mask) == net.IPv4len {
		ip = v4
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if bits != a.BitLen() {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, ones).Masked(), true
}

func overlapsAny(p netip.Prefix, list []netip.Prefix) bool {
	for _, q := range list {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

// hostResolvers are the IPv4 nameservers of the host that are not
// loopback (systemd-resolved's stub at 127.0.0.53 forwards to the ones in
// /run/systemd/resolve/resolv.conf).
func hostResolvers() []netip.AddrPort {
	var out []netip.AddrPort
	for _, path := range []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 2 || fields[0] != "nameserver" {
				continue
			}
			a, err := netip.ParseAddr(fields[1])
			if err != nil || !a.Is4() || a.IsLoopback() {
				continue
			}
			ap := netip.AddrPortFrom(a, DNSPort)
			if !containsAddrPort(out, ap) {
				out = append(out, ap)
			}
		}
		f.Close()
		if len(out) > 0 {
			return out
		}
	}
	return out
}

func containsAddrPort(list []netip.AddrPort, ap netip.AddrPort) bool {
	for _, x := range list {
		if x == ap {
			return true
		}
	}
	return false
}

// CheckHost checks the configuration against the node's namespace: the
// pool overlaps none of its addresses or routes (but its own routes to
// guests) and no management range covers the uplink's addresses. An
// uplink interface that does not exist (yet: a tunnel comes up later) is
// a warning.
func (c Config) CheckHost(hostNS netns.NsHandle) (warnings []string, err error) {
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return nil, fmt.Errorf("netpol: check [network]: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netpol: check [network]: list links: %w", err)
	}
	var uplink netlink.Link
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, NodeVethPrefix) {
			continue
		}
		if name == c.UplinkInterface() {
			uplink = l
		}
		family := unix.AF_INET
		if c.IPv6Pool.IsValid() {
			family = unix.AF_UNSPEC
		}
		addrs, _ := h.AddrList(l, family)
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			for _, pool := range []struct {
				name string
				p    netip.Prefix
			}{{"ipv4_pool", c.IPv4Pool}, {"ipv6_pool", c.IPv6Pool}} {
				if pool.p.IsValid() && pool.p.Contains(ip) {
					return nil, fmt.Errorf("network: %s %s overlaps the node's address %s on %s: pick a pool this host does not use", pool.name, pool.p, a.IPNet, name)
				}
			}
			if l == uplink && !ip.IsLinkLocalUnicast() {
				for _, m := range c.ManagementCIDRs {
					if m.Contains(ip) {
						return nil, fmt.Errorf("network: management_cidrs entry %s covers the uplink %s's address %s: public egress would leave through the management network; narrow the range or pick another uplink", m, name, a.IP)
					}
				}
			}
		}
	}
	if c.UplinkInterface() != "" && uplink == nil {
		warnings = append(warnings, fmt.Sprintf("uplink %q is not an interface of this node (yet): public egress goes nowhere until it exists", c.UplinkInterface()))
	}
	pools := []struct {
		name   string
		p      netip.Prefix
		family int
	}{{"ipv4_pool", c.IPv4Pool, unix.AF_INET}}
	if c.IPv6Pool.IsValid() {
		pools = append(pools, struct {
			name   string
			p      netip.Prefix
			family int
		}{"ipv6_pool", c.IPv6Pool, unix.AF_INET6})
	}
	for _, pool := range pools {
		routes, err := h.RouteList(nil, pool.family)
		if err != nil {
			return nil, fmt.Errorf("netpol: check [network]: list routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			if l, err := h.LinkByIndex(r.LinkIndex); err == nil && strings.HasPrefix(l.Attrs().Name, NodeVethPrefix) {
				continue
			}
			if p, ok := prefixOf(r.Dst); ok && p.Bits() > 0 && p.Overlaps(pool.p) {
				return nil, fmt.Errorf("network: %s %s overlaps the node's route to %s: pick a pool this host does not route elsewhere", pool.name, pool.p, p)
			}
		}
	}
	if c.IPv6Pool.IsValid() && uplink != nil {
		// The node forwards IPv6 (EnableForwarding6): the kernel then
		// ignores router advertisements where accept_ra is 1.
		var ra []byte
		InNamespace(hostNS, func() (err error) {
			ra, err = os.ReadFile("/proc/sys/net/ipv6/conf/" + uplink.Attrs().Name + "/accept_ra")
			return err
		})
		if strings.TrimSpace(string(ra)) == "1" {
			warnings = append(warnings, fmt.Sprintf("uplink %s has accept_ra 1, and with ipv6_pool the node forwards IPv6, so its kernel ignores router advertisements there from now on: if the node's IPv6 default route comes from them, set net.ipv6.conf.%s.accept_ra = 2", uplink.Attrs().Name, uplink.Attrs().Name))
		}
	}
	return warnings, nil
}
