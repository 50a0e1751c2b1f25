package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// HostVethName is the node-side veth of an Instance: IFNAMSIZ allows 15
// bytes, so it is a hash of the Instance id.
func HostVethName(instanceID string) string {
	h := sha256.Sum256([]byte(instanceID))
	return NodeVethPrefix + hex.EncodeToString(h[:6])
}

// Link is what joins one Instance namespace to the node.
type Link struct {
	// Guest is the guest's address, routed to the namespace.
	Guest netip.Addr
	// Guest6 is the guest's IPv6 address, routed the same way; without
	// one the namespace has no IPv6 at all.
	Guest6 netip.Addr
	// HostVeth is the node-side veth.
	HostVeth string
	// TapOwner, TapGroup own the tap, so the VMM running as them may attach
	// to it (TUNSETIFF on a persistent tap checks its owner) without
	// CAP_NET_ADMIN; -1 leaves it root's.
	TapOwner, TapGroup int
}

// Connect makes the links of an Instance namespace: the tap with the
// namespace's address, the veth pair to the node, routes both ways and
// permanent neighbour entries (so neither side needs an address on the
// veth, nor proxy ARP), and forwarding in the namespace. hostNS is the
// node's namespace. On error what was made is left for Disconnect.
func Connect(hostNS, ns netns.NsHandle, l Link) error {
	if !l.Guest.Is4() {
		return fmt.Errorf("netpol: link %s: guest address %v is not IPv4", l.HostVeth, l.Guest)
	}
	if l.Guest6.IsValid() && (!l.Guest6.Is6() || l.Guest6.Is4In6()) {
		return fmt.Errorf("netpol: link %s: guest address %v is not IPv6", l.HostVeth, l.Guest6)
	}
	host, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return fmt.Errorf("netpol: link %s: node namespace: %w", l.HostVeth, err)
	}
	defer host.Close()
	inst, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netpol: link %s: instance namespace: %w", l.HostVeth, err)
	}
	defer inst.Close()
	fail := func(what string, err error) error {
		return fmt.Errorf("netpol: link %s (guest %s): %s: %w", l.HostVeth, l.Guest, what, err)
	}

	lo, err := inst.LinkByName("lo")
	if err == nil {
		err = inst.LinkSetUp(lo)
	}
	if err != nil {
		return fail("loopback up", err)
	}
	// A tap is made with an ioctl on /dev/net/tun, which acts in the
	// namespace of the calling thread, not through the netlink handle.
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: TapName}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI}
	if l.TapOwner >= 0 {
		tap.Owner, tap.Group = uint32(l.TapOwner), uint32(l.TapGroup)
	}
	if err := InNamespace(ns, func() error { return netlink.LinkAdd(tap) }); err != nil {
		return fail("tap "+TapName, err)
	}
	tapLink, err := inst.LinkByName(TapName)
	if err != nil {
		return fail("tap "+TapName, err)
	}
	mac, _ := net.ParseMAC(TapMAC)
	if err := inst.LinkSetHardwareAddr(tapLink, mac); err != nil {
		return fail("hardware address of "+TapName, err)
	}
	if err := inst.AddrAdd(tapLink, &netlink.Addr{IPNet: hostNet(netip.MustParseAddr(TapAddr)), Scope: unix.RT_SCOPE_LINK}); err != nil {
		return fail("address of "+TapName, err)
	}

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.HostVeth}, PeerName: VethName, PeerNamespace: netlink.NsFd(int(ns))}
	if err := host.LinkAdd(veth); err != nil {
		return fail("veth pair", err)
	}
	hostEnd, err := host.LinkByName(l.HostVeth)
	if err != nil {
		return fail("veth", err)
	}
	nsEnd, err := inst.LinkByName(VethName)
	if err != nil {
		return fail("veth "+VethName, err)
	}
	links := []struct {
		ns netns.NsHandle
		h  *netlink.Handle
		l  netlink.Link
	}{{ns, inst, tapLink}, {ns, inst, nsEnd}, {hostNS, host, hostEnd}}
	if l.Guest6.IsValid() {
		// IPv6 on, but no address of the kernel's making (no link-local,
		// so no duplicate address detection or solicitations on them):
		// set before the links come up.
		for _, k := range links {
			if err := linkIPv6(k.ns, k.l.Attrs().Name); err != nil {
				return fail("IPv6 on "+k.l.Attrs().Name, err)
			}
		}
	}
	for _, up := range links {
		if err := up.h.LinkSetUp(up.l); err != nil {
			return fail("link "+up.l.Attrs().Name+" up", err)
		}
	}

	// Namespace: the guest behind the tap, everything else via the node.
	hop := netip.MustParseAddr(NodeHop)
	steps := []linkStep{
		{"route to the guest", func() error {
			return inst.RouteReplace(&netlink.Route{LinkIndex: tapLink.Attrs().Index, Dst: hostNet(l.Guest), Scope: unix.RT_SCOPE_LINK})
		}},
		{"neighbour entry of the node", func() error {
			return inst.NeighSet(&netlink.Neigh{LinkIndex: nsEnd.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: net.IP(hop.AsSlice()), HardwareAddr: hostEnd.Attrs().HardwareAddr})
		}},
		{"default route", func() error {
			return inst.RouteReplace(&netlink.Route{LinkIndex: nsEnd.Attrs().Index, Gw: net.IP(hop.AsSlice()), Flags: int(netlink.FLAG_ONLINK)})
		}},
		{"route to the guest on the node", func() error {
			return host.RouteReplace(&netlink.Route{LinkIndex: hostEnd.Attrs().Index, Dst: hostNet(l.Guest), Scope: unix.RT_SCOPE_LINK})
		}},
		{"neighbour entry of the guest on the node", func() error {
			return host.NeighSet(&netlink.Neigh{LinkIndex: hostEnd.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: net.IP(l.Guest.AsSlice()), HardwareAddr: nsEnd.Attrs().HardwareAddr})
		}},
		{"forwarding in the namespace", func() error {
			return InNamespace(ns, func() error { return writeSysctl("net/ipv4/ip_forward", "1") })
		}},
	}
	if l.Guest6.IsValid() {
		steps = append(steps, connect6(host, inst, ns, tapLink, nsEnd, hostEnd, l.Guest6)...)
	} else {
		steps = append(steps, linkStep{"no IPv6 on the guest's links", func() error {
			// The guest has no IPv6 address: no link-local addresses or
			// router solicitations on its links either.
			return InNamespace(ns, func() error { return writeSysctl("net/ipv6/conf/all/disable_ipv6", "1") })
		}})
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fail(s.what, err)
		}
	}
	return nil
}

// linkStep is one step of Connect, named for its error.
type linkStep struct {
	what string
	do   func() error
}

// connect6 are the IPv6 steps of Connect, the IPv4 ones' twins: the
// namespace's link-local TapAddr6 on the tap (the guest's gateway, found
// by neighbour discovery on the tap's link), the guest's /128 routed both
// ways, and permanent neighbour entries on the veth (NodeHop6 in the
// namespace, the guest on the node), so the veth needs no address and no
// proxy NDP.
func connect6(host, inst *netlink.Handle, ns netns.NsHandle, tap, nsEnd, hostEnd netlink.Link, guest netip.Addr) []linkStep {
	hop := netip.MustParseAddr(NodeHop6)
	return []linkStep{
		{"IPv6 address of " + TapName, func() error {
			// No duplicate address detection: the tap's link holds the
			// guest and this namespace only.
			a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(TapAddr6), Mask: net.CIDRMask(64, 128)}, Scope: unix.RT_SCOPE_LINK, Flags: unix.IFA_F_NODAD}
			return inst.AddrAdd(tap, a)
		}},
		{"IPv6 route to the guest", func() error {
			return inst.RouteReplace(&netlink.Route{LinkIndex: tap.Attrs().Index, Dst: hostNet(guest), Scope: unix.RT_SCOPE_LINK})
		}},
		{"IPv6 neighbour entry of the node", func() error {
			return inst.NeighSet(&netlink.Neigh{LinkIndex: nsEnd.Attrs().Index, Family: unix.AF_INET6, State: netlink.NUD_PERMANENT,
				IP: net.IP(hop.AsSlice()), HardwareAddr: hostEnd.Attrs().HardwareAddr})
		}},
		{"IPv6 default route", func() error {
			_, all, _ := net.ParseCIDR("::/0")
			return inst.RouteReplace(&netlink.Route{LinkIndex: nsEnd.Attrs().Index, Dst: all, Gw: net.IP(hop.AsSlice())})
		}},
		{"IPv6 route to the guest on the node", func() error {
			return host.RouteReplace(&netlink.Route{LinkIndex: hostEnd.Attrs().Index, Dst: hostNet(guest), Scope: unix.RT_SCOPE_LINK})
		}},
		{"IPv6 neighbour entry of the guest on the node", func() error {
			return host.NeighSet(&netlink.Neigh{LinkIndex: hostEnd.Attrs().Index, Family: unix.AF_INET6, State: netlink.NUD_PERMANENT,
				IP: net.IP(guest.AsSlice()), HardwareAddr: nsEnd.Attrs().HardwareAddr})
		}},
		{"IPv6 forwarding in the namespace", func() error {
			return InNamespace(ns, func() error { return writeSysctl("net/ipv6/conf/all/forwarding", "1") })
		}},
	}
}

// linkIPv6 turns IPv6 on for one link of the namespace ns, whatever the
// namespace's defaults, without addresses of the kernel's making
// (addr_gen_mode 1: none).
func linkIPv6(ns netns.NsHandle, name string) error {
	return InNamespace(ns, func() error {
		if err := writeSysctl("net/ipv6/conf/"+name+"/disable_ipv6", "0"); err != nil {
			return err
		}
		return writeSysctl("net/ipv6/conf/"+name+"/addr_gen_mode", "1")
	})
}

// Disconnect removes the node side of an Instance's links (its route goes
// with the veth). The namespace side goes with the namespace.
func Disconnect(hostNS netns.NsHandle, hostVeth string) error {
	host, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return fmt.Errorf("netpol: link %s: node namespace: %w", hostVeth, err)
	}
	defer host.Close()
	l, err := host.LinkByName(hostVeth)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil
	}
	if err == nil {
		err = host.LinkDel(l)
	}
	if err != nil {
		return fmt.Errorf("netpol: link %s: remove: %w", hostVeth, err)
	}
	return nil
}

// EnableForwarding turns on IPv4 forwarding in the node's namespace; the
// node's own rule table decides what it forwards for guests.
func EnableForwarding(hostNS netns.NsHandle) error {
	if err := InNamespace(hostNS, func() error { return writeSysctl("net/ipv4/ip_forward", "1") }); err != nil {
		return fmt.Errorf("netpol: enable IPv4 forwarding on the node: %w", err)
	}
	return nil
}

// EnableForwarding6 turns on IPv6 forwarding in the node's namespace, for
// a node with an ipv6_pool. The kernel then ignores router advertisements
// on interfaces whose accept_ra is 1 (CheckHost warns about the uplink).
func EnableForwarding6(hostNS netns.NsHandle) error {
	if err := InNamespace(hostNS, func() error { return writeSysctl("net/ipv6/conf/all/forwarding", "1") }); err != nil {
		return fmt.Errorf("netpol: enable IPv6 forwarding on the node: %w", err)
	}
	return nil
}

// HostAddrs are the node's own addresses (every interface, both
// families), which guests must never reach. IPv6 link-local addresses are
// left out (guests never reach link-local ranges at all), and so are
// temporary (privacy) addresses, which come and go by the hour and would
// read as a changed node at takeover: the node's own table keeps guests'
// IPv6 from every node address anyway.
func HostAddrs(hostNS netns.NsHandle) ([]netip.Prefix, error) {
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return nil, fmt.Errorf("netpol: node addresses: %w", err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, unix.AF_UNSPEC)
	if err != nil {
		return nil, fmt.Errorf("netpol: node addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is6() && (ip.IsLinkLocalUnicast() || a.Flags&unix.IFA_F_TEMPORARY != 0) {
			continue
		}
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

// writeSysctl writes /proc/sys/<key>; under /proc/sys/net it acts on the
// namespace of the calling thread.
func writeSysctl(key, value string) error {
	f, err := os.OpenFile("/proc/sys/"+key, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
