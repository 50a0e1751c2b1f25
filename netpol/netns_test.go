package netpol

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
)

// Helpers for tests in real network namespaces. A namespace is made by a
// thread that unshares and is then thrown away; the test keeps it alive by
// an fd, so closing the fd at cleanup (also after a failure) removes it
// with everything in it.

// testNetns returns an fd of a new, empty network namespace.
func testNetns(t testing.TB) int {
	t.Helper()
	testenv.RequireRoot(t, "to make network namespaces and nftables tables")
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result)
	go func() {
		// The thread is never unlocked: it ends up in the new namespace and
		// Go discards it when this goroutine returns.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{-1, fmt.Errorf("unshare: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("new network namespace: %v", r.err)
	}
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}

// inNetns runs f on a thread that has joined the namespace. Sockets f
// opens stay in that namespace wherever they are used afterwards.
func inNetns(nsFD int, f func() error) error { return InNamespace(netns.NsHandle(nsFD), f) }

// nsRun runs a command (nft, ip) inside the namespace and returns its
// output; the test fails if it fails.
func nsRun(t testing.TB, nsFD int, args ...string) string {
	t.Helper()
	out, err := nsRunErr(nsFD, args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func nsRunErr(nsFD int, args ...string) (string, error) {
	if _, err := exec.LookPath(args[0]); err != nil {
		return "", fmt.Errorf("%s not installed (Debian packages nftables, iproute2): %w", args[0], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ns := fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), nsFD)
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{ns, "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// link is a test's handle on the links of one namespace.
type link struct {
	t  testing.TB
	ns int
	h  *netlink.Handle
}

func links(t testing.TB, nsFD int) *link {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFD), unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(h.Close)
	l := &link{t: t, ns: nsFD, h: h}
	l.up("lo")
	return l
}

func (l *link) get(name string) netlink.Link {
	l.t.Helper()
	ln, err := l.h.LinkByName(name)
	if err != nil {
		l.t.Fatalf("link %s: %v", name, err)
	}
	return ln
}

// veth makes a veth pair: name here, peer in the other namespace.
func (l *link) veth(name string, other *link, peer string) {
	l.t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer, PeerNamespace: netlink.NsFd(other.ns)}
	if err := l.h.LinkAdd(v); err != nil {
		l.t.Fatalf("veth %s/%s: %v", name, peer, err)
	}
	l.up(name)
	other.up(peer)
}

func (l *link) up(name string) {
	l.t.Helper()
	if err := l.h.LinkSetUp(l.get(name)); err != nil {
		l.t.Fatalf("link %s up: %v", name, err)
	}
}

func (l *link) addr(name, cidr string) {
	l.t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		l.t.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags |= unix.IFA_F_NODAD // usable at once
	}
	if err := l.h.AddrAdd(l.get(name), a); err != nil {
		l.t.Fatalf("address %s on %s: %v", cidr, name, err)
	}
}

// route adds dst (a CIDR, or "default") via gw.
func (l *link) route(dst, gw string) {
	l.t.Helper()
	r := &netlink.Route{Gw: net.ParseIP(gw)}
	if dst != "default" {
		_, n, err := net.ParseCIDR(dst)
		if err != nil {
			l.t.Fatal(err)
		}
		r.Dst = n
	}
	if err := l.h.RouteAdd(r); err != nil {
		l.t.Fatalf("route %s via %s: %v", dst, gw, err)
	}
}

// neighbour adds a permanent neighbour entry for ip on link name: the
// MAC of the other end's link peer.
func (l *link) neighbour(name, ip string, other *link, peer string) {
	l.t.Helper()
	if err := l.h.NeighSet(&netlink.Neigh{LinkIndex: l.get(name).Attrs().Index, Family: unix.AF_INET6, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP(ip), HardwareAddr: other.get(peer).Attrs().HardwareAddr}); err != nil {
		l.t.Fatalf("neighbour %s on %s: %v", ip, name, err)
	}
}

// forwarding6 turns IPv6 forwarding on.
func (l *link) forwarding6() {
	l.t.Helper()
	if err := inNetns(l.ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644)
	}); err != nil {
		l.t.Fatalf("IPv6 forwarding: %v", err)
	}
}

// forwarding turns IPv4 forwarding on; /proc/sys/net is the namespace of
// the thread that opens it.
func (l *link) forwarding() {
	l.t.Helper()
	if err := inNetns(l.ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	}); err != nil {
		l.t.Fatalf("ip_forward: %v", err)
	}
}
