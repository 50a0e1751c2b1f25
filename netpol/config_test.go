package netpol

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
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
		{"v6 pool", "10.213.0.0/16", "fd00::/64", nil, []string{"10.0.0.2"}, "eth0", "IPv6 guest addresses are not supported yet"},
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

func TestAllocate(t *testing.T) {
	c := Config{IPv4Pool: netip.MustParsePrefix("10.213.0.0/30")}
	a, err := c.Allocate(nil)
	if err != nil || a != netip.MustParseAddr("10.213.0.1") {
		t.Fatalf("first address %v %v", a, err)
	}
	b, err := c.Allocate([]netip.Addr{a})
	if err != nil || b != netip.MustParseAddr("10.213.0.2") {
		t.Fatalf("second address %v %v", b, err)
	}
	// Network and broadcast addresses are never handed out.
	if _, err := c.Allocate([]netip.Addr{a, b}); !errors.Is(err, ErrPoolFull) || !strings.Contains(err.Error(), "10.213.0.0/30") {
		t.Fatalf("full pool: %v", err)
	}
	// A freed address is used again, lowest first.
	if got, _ := c.Allocate([]netip.Addr{b}); got != a {
		t.Fatalf("after a release got %v, want %v", got, a)
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
}
