package netpol

import (
	"context"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The kernel takes the node's table with TPROXY for proxied guests, and the
// policy routing for it can be set up any number of times.
func TestProxyRoutingAndHostTable(t *testing.T) {
	n := testNamespaces(t)
	ns := openNew(t, n, "node")
	spec := testHostSpec()
	spec.Proxied = []netip.Addr{netip.MustParseAddr("10.240.0.9")}
	spec.ProxyPort = 15001
	tbl, err := BuildHost(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ReplaceHost(context.Background(), int(ns), tbl); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := SetUpProxyRouting(ns); err != nil {
			t.Fatal(err)
		}
	}
	h, _ := netlink.NewHandleAt(ns)
	defer h.Close()
	rules, _ := h.RuleList(unix.AF_INET)
	count := 0
	for _, r := range rules {
		if r.Mark == ProxyMark && r.Table == ProxyRouteTable {
			count++
		}
	}
	if count != 1 {
		t.Errorf("%d policy rules for the proxy mark, want 1", count)
	}
	lo, _ := h.LinkByName("lo")
	addrs, _ := h.AddrList(lo, unix.AF_INET)
	found := false
	for _, a := range addrs {
		if a.IP.String() == ServiceAddr.String() {
			found = true
		}
	}
	if !found {
		t.Errorf("service address %s not on lo: %v", ServiceAddr, addrs)
	}
	for i := 0; i < 2; i++ { // the second finds nothing to remove
		if err := RemoveProxyRouting(ns); err != nil {
			t.Fatal(err)
		}
	}
	rules, _ = h.RuleList(unix.AF_INET)
	for _, r := range rules {
		if r.Mark == ProxyMark {
			t.Errorf("rule %+v left after RemoveProxyRouting", r)
		}
	}
	addrs, _ = h.AddrList(lo, unix.AF_INET)
	for _, a := range addrs {
		if a.IP.String() == ServiceAddr.String() {
			t.Errorf("service address left on lo")
		}
	}
	if _, err := BuildHost(HostSpec{Pools: spec.Pools, UplinkIface: "eth0", Proxied: spec.Proxied}); err == nil {
		t.Error("proxied guests without a proxy port were accepted")
	}
}
