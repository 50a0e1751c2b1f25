package netpol

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ServiceAddr is the node's own address for what guests reach by design:
// the egress process's DNS socket listens on it (Resolver guests' DNS is
// DNATed there). It sits on the node's loopback; the Instance namespaces
// route to it through their veth (it is their NodeHop).
var ServiceAddr = netip.MustParseAddr(NodeHop)

// SetUpProxyRouting makes the node deliver TPROXYed guest TCP locally: a
// policy rule for ProxyMark to table ProxyRouteTable, whose only route is
// "local everything via lo", and ServiceAddr on lo. Doing it again changes
// nothing.
func SetUpProxyRouting(hostNS netns.NsHandle) error {
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return fmt.Errorf("netpol: proxy routing: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netpol: proxy routing: loopback: %w", err)
	}
	rules, err := h.RuleList(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("netpol: proxy routing: list rules: %w", err)
	}
	have := false
	for _, r := range rules {
		if r.Mark == ProxyMark && r.Table == ProxyRouteTable {
			have = true
		}
	}
	if !have {
		r := netlink.NewRule()
		r.Family, r.Mark, r.Table = unix.AF_INET, ProxyMark, ProxyRouteTable
		if err := h.RuleAdd(r); err != nil {
			return fmt.Errorf("netpol: proxy routing: rule fwmark %#x lookup %d: %w", ProxyMark, ProxyRouteTable, err)
		}
	}
	_, all, _ := net.ParseCIDR("0.0.0.0/0")
	if err := h.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: all, Table: ProxyRouteTable,
		Type: unix.RTN_LOCAL, Scope: unix.RT_SCOPE_HOST}); err != nil {
		return fmt.Errorf("netpol: proxy routing: local route in table %d: %w", ProxyRouteTable, err)
	}
	err = h.AddrAdd(lo, &netlink.Addr{IPNet: hostNet(ServiceAddr), Scope: unix.RT_SCOPE_HOST})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("netpol: proxy routing: service address %s on lo: %w", ServiceAddr, err)
	}
	return nil
}

// RemoveProxyRouting undoes SetUpProxyRouting, for a node that runs no
// Instance any more and goes away (kibotos dev down); what is gone
// already is fine.
func RemoveProxyRouting(hostNS netns.NsHandle) error {
	h, err := netlink.NewHandleAt(hostNS)
	if err != nil {
		return fmt.Errorf("netpol: proxy routing: %w", err)
	}
	defer h.Close()
	var errs []error
	rules, err := h.RuleList(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("netpol: proxy routing: list rules: %w", err)
	}
	for _, r := range rules {
		if r.Mark == ProxyMark && r.Table == ProxyRouteTable {
			if err := h.RuleDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("netpol: proxy routing: delete rule fwmark %#x: %w", ProxyMark, err))
			}
		}
	}
	routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: ProxyRouteTable}, netlink.RT_FILTER_TABLE)
	if err == nil {
		for _, r := range routes {
			if err := h.RouteDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("netpol: proxy routing: delete route of table %d: %w", ProxyRouteTable, err))
			}
		}
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		if err := h.AddrDel(lo, &netlink.Addr{IPNet: hostNet(ServiceAddr)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			errs = append(errs, fmt.Errorf("netpol: proxy routing: remove %s from lo: %w", ServiceAddr, err))
		}
	}
	return errors.Join(errs...)
}
