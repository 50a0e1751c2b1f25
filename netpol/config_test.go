package netpol

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestParseConfig(t *testing.T) {
	ok, err := ParseConfig("10.213.0.0/16", "", []string{"10.0.0.0/24", "192.0.2.7"}, []string{"10.0.0.2", "10.0.0.3:5353"}, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if ok.ManagementCIDRs[1] != netip.MustParsePrefix("192.0.2.7/32") || ok.Resolvers[0] != netip.MustParseAddrPort("10.0.0.2:53") ||
		ok.Resolvers[1].Port() != 5353 || ok.UplinkInterface() != "eth0" || ok.UplinkAddr().IsValid() {
		t.Errorf("parsed %+v", ok)
	}
	for _, c := range []struct {
		name         string
		pool, v6     string
		mgmt, res    []string
		uplink, want string
	}{
		{"no pool", "", "", nil, []string{"10.0.0.2"}, "eth0", "ipv4_pool is missing"},
		{"v4 as v6 pool", "10.213.0.0/16", "10.214.0.0/16", nil, []string{"10.0.0.2"}, "eth0", "not an IPv6 range"},
		{"bad v6 pool", "10.213.0.0/16", "fd6b::", nil, []string{"10.0.0.2"}, "eth0", "not an IPv6 range"},
		{"4in6 pool", "10.213.0.0/16", "::ffff:10.0.0.0/120", nil, []string{"10.0.0.2"}, "eth0", "not an IPv6 range"},
		{"v6 host bits", "10.213.0.0/16", "fd6b:6b00::1/64", nil, []string{"10.0.0.2"}, "eth0", "did you mean fd6b:6b00::/64"},
		{"v6 pool too large", "10.213.0.0/16", "fd6b::/48", nil, []string{"10.0.0.2"}, "eth0", "larger than a /64"},
		{"v6 pool too small", "10.213.0.0/16", "fd6b::/124", nil, []string{"10.0.0.2"}, "eth0", "fewer than 256 guest addresses"},
		{"link-local v6 pool", "10.213.0.0/16", "fe80::/64", nil, []string{"10.0.0.2"}, "eth0", "link-local"},
		{"multicast v6 pool", "10.213.0.0/16", "ff05::/64", nil, []string{"10.0.0.2"}, "eth0", "multicast"},
		{"loopback v6 pool", "10.213.0.0/16", "::/64", nil, []string{"10.0.0.2"}, "eth0", "unspecified, loopback"},
		{"compatible v6 pool", "10.213.0.0/16", "::/96", nil, []string{"10.0.0.2"}, "eth0", "loopback"},
		{"nat64 v6 pool", "10.213.0.0/16", "64:ff9b::/96", nil, []string{"10.0.0.2"}, "eth0", "overlaps 64:ff9b::/96, which guests never reach"},
		{"metadata v6 pool", "10.213.0.0/16", "fd00:ec2::/64", nil, []string{"10.0.0.2"}, "eth0", "overlaps fd00:ec2::254/128"},
		{"v6 pool in management", "10.213.0.0/16", "2001:db8:5::/64", []string{"2001:db8::/32"}, []string{"10.0.0.2"}, "eth0", "ipv6_pool 2001:db8:5::/64 overlaps management_cidrs entry 2001:db8::/32"},
		{"management covers v6 pool", "10.213.0.0/16", "2001:db8:5::/64", []string{"2001:db8:5::7"}, []string{"10.0.0.2"}, "eth0", "overlaps management_cidrs entry 2001:db8:5::7/128"},
		{"v6 uplink address", "10.213.0.0/16", "2001:db8:5::/64", nil, []string{"10.0.0.2"}, "2001:db8:5::9", "a source address must be IPv4"},
		{"bad pool", "10.213.0.0", "", nil, []string{"10.0.0.2"}, "eth0", "not an IPv4 range"},
		{"host bits", "10.213.0.1/16", "", nil, []string{"10.0.0.2"}, "eth0", "did you mean 10.213.0.0/16"},
		{"tiny pool", "10.213.0.0/31", "", nil, []string{"10.0.0.2"}, "eth0", "fewer than 2 guest addresses"},
		{"pool in management", "10.213.0.0/16", "", []string{"10.0.0.0/8"}, []string{"192.0.2.2"}, "eth0", "overlaps management_cidrs entry 10.0.0.0/8"},
		{"management covers uplink", "10.213.0.0/16", "", []string{"192.0.2.0/24"}, []string{"10.0.0.2"}, "192.0.2.9", "covers the uplink address 192.0.2.9"},
		{"uplink in pool", "10.213.0.0/16", "", nil, []string{"10.0.0.2"}, "10.213.0.9", "inside ipv4_pool"},
		{"resolver in pool", "10.213.0.0/16", "", nil, []string{"10.213.0.2"}, "eth0", "resolver 10.213.0.2:53 is inside ipv4_pool"},
		{"link-local pool", "169.254.0.0/24", "", nil, []string{"10.0.0.2"}, "eth0", "link-local"},
		{"no resolvers", "10.213.0.0/16", "", nil, nil, "eth0", "resolvers is empty"},
		{"bad resolver", "10.213.0.0/16", "", nil, []string{"dns.example"}, "eth0", `resolvers entry "dns.example"`},
		{"bad management", "10.213.0.0/16", "", []string{"lan"}, []string{"10.0.0.2"}, "eth0", `management_cidrs entry "lan"`},
		{"no uplink", "10.213.0.0/16", "", nil, []string{"10.0.0.2"}, "", "uplink is missing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig(c.pool, c.v6, c.mgmt, c.res, c.uplink)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line with %q", err, c.want)
			}
		})
	}
}

func TestParseConfigIPv6(t *testing.T) {
	c, err := ParseConfig("10.213.0.0/16", "fd6b:6b00:1::/64", []string{"10.0.0.0/24", "2001:db8:10::/48", "2001:db8::7"}, []string{"10.0.0.2"}, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if c.IPv6Pool != netip.MustParsePrefix("fd6b:6b00:1::/64") || c.ManagementCIDRs[2] != netip.MustParsePrefix("2001:db8::7/128") {
		t.Errorf("parsed %+v", c)
	}
	// The bounds are accepted.
	for _, p := range []string{"2001:db8:1::/64", "2001:db8:1::ff00/120"} {
		if _, err := ParseConfig("10.213.0.0/16", p, nil, []string{"10.0.0.2"}, "eth0"); err != nil {
			t.Errorf("ipv6_pool %s: %v", p, err)
		}
	}
}

func TestAllocate6(t *testing.T) {
	c := Config{IPv4Pool: netip.MustParsePrefix("10.213.0.0/30"), IPv6Pool: netip.MustParsePrefix("fd6b:6b00:1::ff00/120")}
	a, err := c.Allocate6(nil, netip.Addr{})
	if err != nil || a != netip.MustParseAddr("fd6b:6b00:1::ff01") {
		t.Fatalf("first address %v %v (the subnet-router anycast address is never handed out)", a, err)
	}
	var used []netip.Addr
	for a := netip.MustParseAddr("fd6b:6b00:1::ff01"); used == nil || a.IsValid() && a.Compare(netip.MustParseAddr("fd6b:6b00:1::ffff")) <= 0; a = a.Next() {
		used = append(used, a)
	}
	if _, err := c.Allocate6(used, netip.Addr{}); !errors.Is(err, ErrPoolFull) || !strings.Contains(err.Error(), "ipv6_pool fd6b:6b00:1::ff00/120") {
		t.Fatalf("full pool: %v", err)
	}
	if got, _ := c.Allocate6(used[1:], netip.Addr{}); got != used[0] {
		t.Fatalf("after a release got %v, want %v", got, used[0])
	}
	if _, err := (Config{IPv4Pool: c.IPv4Pool}).Allocate6(nil, netip.Addr{}); err == nil {
		t.Fatal("Allocate6 without an ipv6_pool")
	}
}

func TestAllocate(t *testing.T) {
	c := Config{IPv4Pool: netip.MustParsePrefix("10.213.0.0/30")}
	a, err := c.Allocate(nil, netip.Addr{})
	if err != nil || a != netip.MustParseAddr("10.213.0.1") {
		t.Fatalf("first address %v %v", a, err)
	}
	b, err := c.Allocate([]netip.Addr{a}, netip.Addr{})
	if err != nil || b != netip.MustParseAddr("10.213.0.2") {
		t.Fatalf("second address %v %v", b, err)
	}
	// Network and broadcast addresses are never handed out.
	if _, err := c.Allocate([]netip.Addr{a, b}, netip.Addr{}); !errors.Is(err, ErrPoolFull) || !strings.Contains(err.Error(), "10.213.0.0/30") {
		t.Fatalf("full pool: %v", err)
	}
	// A freed address is used again, lowest first.
	if got, _ := c.Allocate([]netip.Addr{b}, netip.Addr{}); got != a {
		t.Fatalf("after a release got %v, want %v", got, a)
	}
	// A preferred address is given when it is usable and free, else the
	// lowest free one.
	for _, tc := range []struct{ used, prefer, want string }{
		{"", "10.213.0.2", "10.213.0.2"},
		{"10.213.0.2", "10.213.0.2", "10.213.0.1"},
		{"", "10.213.0.3", "10.213.0.1"}, // broadcast
		{"", "10.213.0.0", "10.213.0.1"}, // network
		{"", "10.214.0.2", "10.213.0.1"}, // another pool's
		{"", "fd6b::2", "10.213.0.1"},
	} {
		var used []netip.Addr
		if tc.used != "" {
			used = append(used, netip.MustParseAddr(tc.used))
		}
		if got, err := c.Allocate(used, netip.MustParseAddr(tc.prefer)); err != nil || got != netip.MustParseAddr(tc.want) {
			t.Errorf("used %q, prefer %s: %v %v, want %s", tc.used, tc.prefer, got, err, tc.want)
		}
	}
}

func TestCheckHost(t *testing.T) {
	n := testNamespaces(t)
	ns := openNew(t, n, "node")
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}); err != nil {
		t.Fatal(err)
	}
	eth0, _ := h.LinkByName("eth0")
	addr, _ := netlink.ParseAddr("192.0.2.10/24")
	if err := h.AddrAdd(eth0, addr); err != nil {
		t.Fatal(err)
	}
	h.LinkSetUp(eth0)
	_, routed, _ := net.ParseCIDR("10.50.0.0/16")
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: routed, Gw: net.ParseIP("192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	check := func(pool string, mgmt []string, uplink string) ([]string, error) {
		t.Helper()
		c, err := ParseConfig(pool, "", mgmt, []string{"192.0.2.53"}, uplink)
		if err != nil {
			t.Fatal(err)
		}
		return c.CheckHost(ns)
	}
	if w, err := check("10.213.0.0/16", nil, "eth0"); err != nil || len(w) != 0 {
		t.Fatalf("a pool clear of the host: %v %v", w, err)
	}
	// A management range beside the uplink's address (in its subnet, not
	// covering it) is fine.
	if _, err := check("10.213.0.0/16", []string{"192.0.2.0/29"}, "eth0"); err != nil {
		t.Fatalf("management range beside the uplink: %v", err)
	}
	for _, c := range []struct {
		pool, want string
		mgmt       []string
	}{
		{"192.0.2.0/28", "overlaps the node's address 192.0.2.10/24 on eth0", nil},
		{"10.50.4.0/24", "overlaps the node's route to 10.50.0.0/16", nil},
		{"10.213.0.0/16", "covers the uplink eth0's address 192.0.2.10", []string{"192.0.2.0/24"}},
		{"10.213.0.0/16", "covers the uplink eth0's address 192.0.2.10", []string{"192.0.2.10/32"}},
	} {
		if _, err := check(c.pool, c.mgmt, "eth0"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pool %s management %v: %v, want %q", c.pool, c.mgmt, err, c.want)
		}
	}
	if w, err := check("10.213.0.0/16", nil, "wg0"); err != nil || len(w) != 1 || !strings.Contains(w[0], `uplink "wg0" is not an interface`) {
		t.Errorf("missing uplink: warnings %v, %v", w, err)
	}

	// IPv6: the pool against the node's IPv6 addresses and routes, IPv6
	// management ranges against the uplink's IPv6 addresses, and the
	// router advertisements forwarding makes the kernel ignore.
	addr6, _ := netlink.ParseAddr("2001:db8:1::10/64")
	addr6.Flags = unix.IFA_F_NODAD
	if err := h.AddrAdd(eth0, addr6); err != nil {
		t.Fatal(err)
	}
	_, routed6, _ := net.ParseCIDR("2001:db8:50::/48")
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: routed6, Gw: net.ParseIP("2001:db8:1::1")}); err != nil {
		t.Fatal(err)
	}
	check6 := func(pool6 string, mgmt []string) ([]string, error) {
		t.Helper()
		c, err := ParseConfig("10.213.0.0/16", pool6, mgmt, []string{"192.0.2.53"}, "eth0")
		if err != nil {
			t.Fatal(err)
		}
		return c.CheckHost(ns)
	}
	if err := InNamespace(ns, func() error { return writeSysctl("net/ipv6/conf/eth0/accept_ra", "2") }); err != nil {
		t.Fatal(err)
	}
	if w, err := check6("fd6b:6b00:1::/64", []string{"2001:db8:2::/48"}); err != nil || len(w) != 0 {
		t.Fatalf("an IPv6 pool clear of the host: %v %v", w, err)
	}
	for _, c := range []struct {
		pool6, want string
		mgmt        []string
	}{
		{"2001:db8:1::/64", "ipv6_pool 2001:db8:1::/64 overlaps the node's address 2001:db8:1::10/64 on eth0", nil},
		{"2001:db8:50:7::/64", "ipv6_pool 2001:db8:50:7::/64 overlaps the node's route to 2001:db8:50::/48", nil},
		{"fd6b:6b00:1::/64", "covers the uplink eth0's address 2001:db8:1::10", []string{"2001:db8::/32"}},
	} {
		if _, err := check6(c.pool6, c.mgmt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ipv6_pool %s management %v: %v, want %q", c.pool6, c.mgmt, err, c.want)
		}
	}
	if err := InNamespace(ns, func() error { return writeSysctl("net/ipv6/conf/eth0/accept_ra", "1") }); err != nil {
		t.Fatal(err)
	}
	if w, err := check6("fd6b:6b00:1::/64", nil); err != nil || len(w) != 1 || !strings.Contains(w[0], "net.ipv6.conf.eth0.accept_ra = 2") {
		t.Errorf("uplink accepting router advertisements: warnings %v, %v", w, err)
	}
	// Without an IPv6 pool none of it is looked at.
	if w, err := check("10.213.0.0/16", []string{"2001:db8::/32"}, "eth0"); err != nil || len(w) != 0 {
		t.Errorf("IPv4-only node with an IPv6 management range over the uplink's IPv6 address: %v %v", w, err)
	}
}
