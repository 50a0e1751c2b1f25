package netpol

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// testHostSpec is a node without an IPv6 pool: its IPv6 management range
// is left out (guest IPv6 goes nowhere).
func testHostSpec() HostSpec {
	return HostSpec{
		Pools:       pfx("10.240.0.0/20"),
		Management:  pfx("10.10.0.0/16", "10.20.0.0/16", "2001:db8:10::/48"),
		UplinkIface: "eth0",
		Resolvers:   []netip.AddrPort{netip.MustParseAddrPort("10.10.0.53:53"), netip.MustParseAddrPort("10.10.0.53:53")},
	}
}

func TestBuildHostGolden(t *testing.T) {
	byAddr := testHostSpec()
	byAddr.UplinkIface = ""
	byAddr.UplinkAddr = netip.MustParseAddr("192.0.2.10")
	proxied := testHostSpec()
	proxied.Proxied = []netip.Addr{netip.MustParseAddr("10.240.0.9"), netip.MustParseAddr("10.240.0.3")}
	proxied.ProxyPort = 15001
	v6 := proxied
	v6.Pools = append(pfx("fd6b:6b00:240::/64"), v6.Pools...)
	v6byAddr := byAddr
	v6byAddr.Pools = append(pfx("fd6b:6b00:240::/64"), v6byAddr.Pools...)
	for _, c := range []struct {
		name string
		spec HostSpec
	}{
		{"host-uplink-iface", testHostSpec()},
		{"host-uplink-addr", byAddr},
		{"host-proxied", proxied},
		{"host-ipv6-proxied", v6},
		{"host-ipv6-uplink-addr", v6byAddr},
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl, err := BuildHost(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, c.name, tbl.String())
		})
	}
}

func TestBuildHostRejects(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*HostSpec)
		want   string
	}{
		{"no uplink", func(h *HostSpec) { h.UplinkIface = "" }, "no uplink"},
		{"instance veth as uplink", func(h *HostSpec) { h.UplinkIface = "kb-1234" }, `uplink interface "kb-1234"`},
		{"long uplink name", func(h *HostSpec) { h.UplinkIface = "a-very-long-ifname" }, "uplink interface"},
		{"ipv6 uplink address", func(h *HostSpec) { h.UplinkAddr = netip.MustParseAddr("2001:db8::1") }, "uplink address"},
		{"bad resolver", func(h *HostSpec) { h.Resolvers = []netip.AddrPort{{}} }, "resolver"},
		{"bad pool", func(h *HostSpec) { h.Pools = []netip.Prefix{{}} }, "pool prefix"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := testHostSpec()
			c.change(&h)
			if _, err := BuildHost(h); err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "netpol: host spec: ") {
				t.Fatalf("BuildHost = %v, want an error naming %q", err, c.want)
			}
		})
	}
}

// The node's namespace has other owners: ReplaceHost changes only ours.
func TestReplaceHostLeavesOthers(t *testing.T) {
	ns := testNetns(t)
	nsRun(t, ns, "nft", "add", "table", "ip", "docker")
	nsRun(t, ns, "nft", "add", "chain", "ip", "docker", "fw", "{ type filter hook forward priority 0; policy accept; }")
	tbl, err := BuildHost(testHostSpec())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := ReplaceHost(context.Background(), ns, tbl); err != nil {
			t.Fatal(err)
		}
	}
	if got := readOurs(t, ns); got.String() != tbl.String() {
		t.Fatalf("host table read back differs:\n%s", lineDiff(tbl.String(), got.String()))
	}
	if out := nsRun(t, ns, "nft", "list", "ruleset"); !strings.Contains(out, "table ip docker") {
		t.Fatalf("ReplaceHost removed another table:\n%s", out)
	}
	inst, err := Build(testSpec(EgressNone))
	if err != nil {
		t.Fatal(err)
	}
	if err := ReplaceHost(context.Background(), ns, inst); err == nil {
		t.Fatal("ReplaceHost took an Instance table")
	}
}
