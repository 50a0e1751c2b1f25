package netpol

import (
	"flag"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// testSpec is a spec in the shape the node hands over: a node with two
// addresses (one IPv6, left out of the sets), management ranges, one pool.
func testSpec(egress string) TableSpec {
	s := TableSpec{
		Guest:      netip.MustParseAddr("10.240.0.2"),
		Egress:     egress,
		Resolver:   netip.MustParseAddrPort("10.10.0.53:53"),
		HostAddrs:  pfx("192.0.2.10/32", "2001:db8::10/128"),
		Management: pfx("10.10.0.0/16", "10.20.0.0/16", "10.21.0.0/16"),
		Pools:      pfx("10.240.0.0/20"),
	}
	return s
}

// testSpec6 is testSpec for a guest with an IPv6 address, on a node with
// an IPv6 pool, IPv6 management ranges and two IPv6 addresses (one a
// link-local, which the link-local set covers anyway).
func testSpec6(egress string) TableSpec {
	s := testSpec(egress)
	s.Guest6 = netip.MustParseAddr("fd6b:6b00:240::2")
	s.HostAddrs = append(s.HostAddrs, pfx("2001:db8::11/128", "fe80::1234/128")...)
	s.Management = append(s.Management, pfx("2001:db8:10::/48", "2001:db8:10:ff::/64", "fd00:10::/32")...)
	s.Pools = append(s.Pools, pfx("fd6b:6b00:240::/64")...)
	return s
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from the generated table (go test -update rewrites it):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff lists the lines only one side has, enough to see what moved.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

func TestBuildGolden(t *testing.T) {
	public := testSpec(EgressPublic)
	public.Allow = pfx("203.0.113.0/24", "198.51.100.0/25", "198.51.100.128/25", "100.64.1.7/32")
	public.Deny = pfx("203.0.113.128/26")
	names := testSpec(EgressPublic)
	names.Allow = pfx("203.0.113.0/24")
	names.AllowNames, names.DenyNames = true, true
	onlyNames := testSpec(EgressPublic)
	onlyNames.AllowNames = true
	// IPv6 ranges in a policy of a guest without IPv6 make no sets, but an
	// IPv6-only Allow still leaves IPv4 nothing but what it allows.
	v6AllowNoV6 := testSpec(EgressPublic)
	v6AllowNoV6.Allow = pfx("2001:db8:77::/48")
	v6AllowNoV6.Deny = pfx("2001:db8:77:1::/64")
	v6Public := testSpec6(EgressPublic)
	v6Public.Allow = pfx("203.0.113.0/24", "2001:db8:77::/48", "2001:db8:78::/48")
	v6Public.Deny = pfx("203.0.113.128/26", "2001:db8:77:1::/64")
	v6Names := testSpec6(EgressPublic)
	v6Names.AllowNames, v6Names.DenyNames = true, true
	for _, c := range []struct {
		name string
		spec TableSpec
	}{
		{"egress-none", testSpec(EgressNone)},
		{"egress-public-allow-deny", public},
		{"egress-proxy", testSpec(EgressProxy)},
		{"egress-public-names", names},
		{"egress-public-only-names", onlyNames},
		{"egress-public-ipv6-allow-without-ipv6", v6AllowNoV6},
		{"ipv6-egress-none", testSpec6(EgressNone)},
		{"ipv6-egress-public-allow-deny", v6Public},
		{"ipv6-egress-proxy", testSpec6(EgressProxy)},
		{"ipv6-egress-public-names", v6Names},
	} {
		t.Run(c.name, func(t *testing.T) {
			tbl, err := Build(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, c.name, tbl.String())
		})
	}
}

// The same spec in any order gives the same table.
func TestBuildDeterministic(t *testing.T) {
	spec := testSpec(EgressPublic)
	spec.Allow = pfx("203.0.113.0/24", "198.51.100.0/24", "100.64.0.0/10", "8.8.8.8/32")
	spec.Deny = pfx("203.0.113.7/32", "198.51.100.1/32")
	want, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		s := spec
		for _, l := range []*[]netip.Prefix{&s.Allow, &s.Deny, &s.Management, &s.HostAddrs} {
			*l = slices.Clone(*l)
			r.Shuffle(len(*l), func(i, j int) { (*l)[i], (*l)[j] = (*l)[j], (*l)[i] })
		}
		got, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Fatalf("shuffled spec gave another table:\n%s", lineDiff(want.String(), got.String()))
		}
	}
}

// Rule names are what Inspect pairs rules by: unique within a chain.
func TestBuildRuleNamesUnique(t *testing.T) {
	for _, e := range []string{EgressNone, EgressPublic, EgressProxy} {
		s := testSpec6(e)
		s.Allow = pfx("8.8.8.8/32")
		tbl, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, c := range tbl.Chains {
			for _, r := range c.Rules {
				if _, _, ok := parseMarker(r.Comment); !ok || seen[r.Comment] {
					t.Errorf("egress %s: rule comment %q is not a unique marker", e, r.Comment)
				}
				seen[r.Comment] = true
			}
		}
	}
}

func TestBuildRejects(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*TableSpec)
		want   string
	}{
		{"no guest", func(s *TableSpec) { s.Guest = netip.Addr{} }, "guest address"},
		{"ipv6 guest", func(s *TableSpec) { s.Guest = netip.MustParseAddr("2001:db8::2") }, "guest address"},
		{"no resolver", func(s *TableSpec) { s.Resolver = netip.AddrPort{} }, "resolver"},
		{"resolver without port", func(s *TableSpec) { s.Resolver = netip.MustParseAddrPort("10.0.0.53:0") }, "resolver"},
		{"unknown egress", func(s *TableSpec) { s.Egress = "socks" }, `egress "socks"`},
		{"empty egress", func(s *TableSpec) { s.Egress = "" }, `egress ""`},
		{"invalid prefix", func(s *TableSpec) { s.Management = append(s.Management, netip.Prefix{}) }, "management prefix"},
		{"4in6 deny", func(s *TableSpec) { s.Deny = pfx("::ffff:10.0.0.0/104") }, "write IPv4 prefixes as IPv4"},
		{"ipv4 as ipv6 guest", func(s *TableSpec) { s.Guest6 = netip.MustParseAddr("10.240.0.3") }, "guest IPv6 address"},
		{"4in6 ipv6 guest", func(s *TableSpec) { s.Guest6 = netip.MustParseAddr("::ffff:10.240.0.3") }, "guest IPv6 address"},
		{"link-local ipv6 guest", func(s *TableSpec) { s.Guest6 = netip.MustParseAddr("fe80::2") }, "guest IPv6 address"},
		{"unspecified ipv6 guest", func(s *TableSpec) { s.Guest6 = netip.IPv6Unspecified() }, "guest IPv6 address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := testSpec(EgressPublic)
			c.change(&s)
			tbl, err := Build(s)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "netpol: table spec: ") {
				t.Fatalf("Build = %v, %v; want an error naming %q", tbl, err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestRanges(t *testing.T) {
	got := rangesOf(pfx("10.0.0.0/25", "10.0.0.128/25", "10.0.0.7/32", "192.168.1.1/24", "0.0.0.0/0"))
	if len(got) != 1 || got[0].String() != "0.0.0.0/0" {
		t.Errorf("merge with /0 = %v", got)
	}
	got = rangesOf(pfx("10.0.0.0/25", "10.0.0.128/25", "10.0.1.0/32", "192.168.1.1/24"))
	if s := strings.Trim(strings.Join(strings.Fields(strings.Trim(fmtRanges(got), "[]")), " "), " "); s != "10.0.0.0-10.0.1.0 192.168.1.0/24" {
		t.Errorf("merged ranges = %s", s)
	}
	// a range round-trips through kernel elements, end elements first or last
	for _, rs := range [][]addrRange{got, rangesOf(pfx("224.0.0.0/3", "1.2.3.4/32"))} {
		elems := setElements(rs)
		slices.Reverse(elems)
		back, err := rangesFromElements(elems, 4)
		if err != nil || fmtRanges(back) != fmtRanges(rs) {
			t.Errorf("round trip of %v = %v, %v", rs, back, err)
		}
	}
}

func TestRanges6(t *testing.T) {
	got := rangesOf(pfx("2001:db8::/33", "2001:db8:8000::/33", "2001:db9::/128", "fd00::/8", "fd00::1/128"))
	if s := fmtRanges(got); s != "[2001:db8::-2001:db9:: fd00::/8]" {
		t.Errorf("merged ranges = %s", s)
	}
	if s := fmtRanges(rangesOf(pfx("::/0", "2001:db8::/32"))); s != "[::/0]" {
		t.Errorf("merge with ::/0 = %s", s)
	}
	// a range to the top of the space has no end element
	top := rangesOf(pfx("ff00::/8", "fe80::/10", "2001:db8::5/128"))
	for _, rs := range [][]addrRange{got, top} {
		elems := setElements(rs)
		slices.Reverse(elems)
		back, err := rangesFromElements(elems, 16)
		if err != nil || fmtRanges(back) != fmtRanges(rs) {
			t.Errorf("round trip of %v = %v, %v", rs, back, err)
		}
	}
	if n := len(setElements(top)); n != 5 {
		t.Errorf("%d elements for %v, want 5 (no end after ff00::/8)", n, top)
	}
	// the families never merge, and a key of the other length is refused
	if s := fmtRanges(rangesOf(pfx("255.255.255.255/32", "::/128"))); s != "[255.255.255.255 ::]" {
		t.Errorf("mixed families = %s", s)
	}
	if _, err := rangesFromElements(setElements(top), 4); err == nil {
		t.Error("IPv6 elements decoded as IPv4")
	}
}

// setElements are ranges as the kernel lists their interval elements.
func setElements(rs []addrRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, e := range intervalEdges(rs) {
		out = append(out, nftables.SetElement{Key: e.at.AsSlice(), IntervalEnd: e.end})
	}
	return out
}

func fmtRanges(rs []addrRange) string {
	var ss []string
	for _, r := range rs {
		ss = append(ss, r.String())
	}
	return "[" + strings.Join(ss, " ") + "]"
}

// A set too large for one netlink attribute is refused with the set named,
// before anything reaches the kernel.
func TestAddSetRefusesOversizedElements(t *testing.T) {
	var rs []addrRange
	for i := range 3000 {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0})
		rs = append(rs, addrRange{from: a, to: a})
	}
	tbl := &Table{Family: nftables.TableFamilyIPv4, Name: "t"}
	s := &Set{Name: "big", KeyType: nftables.TypeIPAddr, Flags: unix.NFT_SET_INTERVAL, Ranges: rs}
	var x txn
	err := x.addSet(tbl, s, 1)
	if err == nil || !strings.Contains(err.Error(), "set big") || !strings.Contains(err.Error(), "at most 65535") {
		t.Fatalf("a set of %d ranges: %v", len(rs), err)
	}
}
