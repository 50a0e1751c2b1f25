package netpol

import (
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

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
