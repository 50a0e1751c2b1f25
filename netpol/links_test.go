package netpol

import (
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
)

// testNamespaces gives a test its own namespace directory (shared, like
// /run/netns) and removes what it pinned there, also on failure.
func testNamespaces(t *testing.T) Namespaces {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Skipf(t, "netpol: needs root for network namespaces")
	}
	n := Namespaces{Dir: t.TempDir()}
	if err := n.EnsureShared(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		entries, _ := os.ReadDir(n.Dir)
		for _, e := range entries {
			if err := n.Delete(e.Name()); err != nil {
				t.Error(err)
			}
		}
		// The directory's own bind mount.
		if err := unmountAll(n.Dir); err != nil {
			t.Error(err)
		}
	})
	return n
}

func openNew(t *testing.T, n Namespaces, name string) netns.NsHandle {
	t.Helper()
	if err := n.Create(name); err != nil {
		t.Fatal(err)
	}
	h, err := n.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestNamespaceCreateDelete(t *testing.T) {
	n := testNamespaces(t)
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	h := openNew(t, n, "a")
	if !n.Exists("a") {
		t.Fatal("namespace a not pinned")
	}
	if h.Equal(self) {
		t.Fatal("the new namespace is the test's own")
	}
	if err := n.Create("a"); err == nil {
		t.Fatal("a second Create of the same name succeeded")
	}
	if err := n.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if n.Exists("a") {
		t.Fatal("namespace a still pinned after Delete")
	}
	if err := n.Delete("a"); err != nil {
		t.Fatalf("deleting a gone namespace: %v", err)
	}
	if err := n.Create("../x"); err == nil {
		t.Fatal("a name with a path was accepted")
	}
}

func TestConnect(t *testing.T) {
	n := testNamespaces(t)
	host := openNew(t, n, "host")
	inst := openNew(t, n, "inst")
	guest := netip.MustParseAddr("10.200.0.7")
	veth := HostVethName("inst-abc")
	if len(veth) > 15 {
		t.Fatalf("veth name %q longer than IFNAMSIZ", veth)
	}
	if err := Connect(host, inst, Link{Guest: guest, HostVeth: veth, TapOwner: 1234, TapGroup: 1234}); err != nil {
		t.Fatal(err)
	}
	ih, _ := netlink.NewHandleAt(inst)
	defer ih.Close()
	hh, _ := netlink.NewHandleAt(host)
	defer hh.Close()

	tap, err := ih.LinkByName(TapName)
	if err != nil {
		t.Fatal(err)
	}
	if tt, ok := tap.(*netlink.Tuntap); !ok || tt.Owner != 1234 || tt.Mode != netlink.TUNTAP_MODE_TAP {
		t.Fatalf("tap %+v: want a tap owned by 1234", tap)
	}
	routes, _ := ih.RouteGet(guest.AsSlice())
	if len(routes) != 1 || routes[0].LinkIndex != tap.Attrs().Index {
		t.Fatalf("namespace route to the guest %+v, want via %s", routes, TapName)
	}
	routes, _ = hh.RouteGet(guest.AsSlice())
	hostEnd, err := hh.LinkByName(veth)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 1 || routes[0].LinkIndex != hostEnd.Attrs().Index {
		t.Fatalf("node route to the guest %+v, want via %s", routes, veth)
	}
	routes, _ = ih.RouteGet(netip.MustParseAddr("198.51.100.9").AsSlice())
	if len(routes) != 1 || routes[0].Gw.String() != NodeHop {
		t.Fatalf("namespace default route %+v, want via %s", routes, NodeHop)
	}
	var fwd string
	if err := InNamespace(inst, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		fwd = string(b)
		return err
	}); err != nil || fwd != "1\n" {
		t.Fatalf("forwarding in the namespace %q (%v)", fwd, err)
	}

	if err := Disconnect(host, veth); err != nil {
		t.Fatal(err)
	}
	if _, err := hh.LinkByName(veth); err == nil {
		t.Fatal("node-side veth still there after Disconnect")
	}
	if err := Disconnect(host, veth); err != nil {
		t.Fatalf("second Disconnect: %v", err)
	}
}

// With an IPv6 address the guest's /128 is routed both ways, the
// namespace's default route goes to NodeHop6 by a permanent neighbour
// entry, the tap holds TapAddr6, and the veth ends hold no IPv6 address
// at all (no link-local of the kernel's making: no neighbour discovery
// there).
func TestConnect6(t *testing.T) {
	n := testNamespaces(t)
	host := openNew(t, n, "host")
	inst := openNew(t, n, "inst")
	guest6 := netip.MustParseAddr("fd6b:6b00:1::7")
	veth := HostVethName("inst-6")
	if err := Connect(host, inst, Link{Guest: netip.MustParseAddr("10.200.0.7"), Guest6: guest6, HostVeth: veth, TapOwner: -1, TapGroup: -1}); err != nil {
		t.Fatal(err)
	}
	ih, _ := netlink.NewHandleAt(inst)
	defer ih.Close()
	hh, _ := netlink.NewHandleAt(host)
	defer hh.Close()
	tap, _ := ih.LinkByName(TapName)
	nsEnd, _ := ih.LinkByName(VethName)
	hostEnd, err := hh.LinkByName(veth)
	if err != nil {
		t.Fatal(err)
	}
	if routes, _ := ih.RouteGet(guest6.AsSlice()); len(routes) != 1 || routes[0].LinkIndex != tap.Attrs().Index {
		t.Fatalf("namespace route to the guest %+v, want via %s", routes, TapName)
	}
	if routes, _ := hh.RouteGet(guest6.AsSlice()); len(routes) != 1 || routes[0].LinkIndex != hostEnd.Attrs().Index {
		t.Fatalf("node route to the guest %+v, want via %s", routes, veth)
	}
	if routes, _ := ih.RouteGet(netip.MustParseAddr("2001:db8::9").AsSlice()); len(routes) != 1 || routes[0].Gw.String() != NodeHop6 || routes[0].LinkIndex != nsEnd.Attrs().Index {
		t.Fatalf("namespace IPv6 default route %+v, want via %s on %s", routes, NodeHop6, VethName)
	}
	for _, c := range []struct {
		h    *netlink.Handle
		link netlink.Link
		ip   string
		mac  string
	}{{ih, nsEnd, NodeHop6, hostEnd.Attrs().HardwareAddr.String()}, {hh, hostEnd, guest6.String(), nsEnd.Attrs().HardwareAddr.String()}} {
		neighs, _ := c.h.NeighList(c.link.Attrs().Index, unix.AF_INET6)
		found := false
		for _, ne := range neighs {
			found = found || ne.IP.String() == c.ip && ne.HardwareAddr.String() == c.mac && ne.State == netlink.NUD_PERMANENT
		}
		if !found {
			t.Errorf("no permanent neighbour %s -> %s on %s: %+v", c.ip, c.mac, c.link.Attrs().Name, neighs)
		}
	}
	for _, c := range []struct {
		h    *netlink.Handle
		link netlink.Link
		want []string
	}{{ih, tap, []string{TapAddr6}}, {ih, nsEnd, nil}, {hh, hostEnd, nil}} {
		addrs, _ := c.h.AddrList(c.link, unix.AF_INET6)
		var got []string
		for _, a := range addrs {
			got = append(got, a.IP.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("IPv6 addresses of %s: %v, want %v", c.link.Attrs().Name, got, c.want)
		}
	}
	var fwd string
	if err := InNamespace(inst, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/forwarding")
		fwd = string(b)
		return err
	}); err != nil || fwd != "1\n" {
		t.Fatalf("IPv6 forwarding in the namespace %q (%v)", fwd, err)
	}
	if err := Disconnect(host, veth); err != nil {
		t.Fatal(err)
	}
	if routes, err := hh.RouteGet(guest6.AsSlice()); err == nil && len(routes) > 0 && routes[0].LinkIndex == hostEnd.Attrs().Index {
		t.Fatalf("node route to the guest left after Disconnect: %+v", routes)
	}
}
