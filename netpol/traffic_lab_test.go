package netpol

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// Traffic through real namespaces in a line, as on a node:
//
//	guest ──eth0|kt0── instance ──ve0|kb-test── node ──up0|eth0── world
//
// The instance namespace holds the Instance table, the node namespace the
// node's table; world has the public, management, denied and not-allowed
// addresses and a resolver in the management range, each also in IPv6.
// The IPv6 line routes by global addresses (the node's Connect uses
// link-local gateways; real guests test that), so the guest's neighbour
// discovery with the instance namespace passes the table's NDP rules.

const (
	worldPublic     = "198.51.100.10"
	worldManagement = "198.51.100.20" // also the resolver
	worldDenied     = "198.51.100.30"
	worldNotAllowed = "203.0.113.5"
	nodeUplink      = "198.51.100.1"
	echoPort        = "8080"

	guest6           = "fd6b:6b00:240::2"
	pool6            = "fd6b:6b00:240::/64"
	worldPublic6     = "2001:db8:100::10"
	worldManagement6 = "2001:db8:100::20"
	worldDenied6     = "2001:db8:100::30"
	worldNotAllowed6 = "2001:db8:113::5"
	nodeUplink6      = "2001:db8:100::1"
	// nodeLater6 is a node address the Instance table does not know (one
	// added after it was written): the node's own table keeps it out.
	nodeLater6 = "2001:db8:100::99"

	// a denied connect is refused at once ("administratively
	// prohibited"); a dropped one (spoofed, or stopped by the node's own
	// table) times out after this
	deniedDialTimeout = 500 * time.Millisecond
	// refusedDialTimeout bounds a connect that must be refused: a refusal
	// ends it at once, so only a busy machine (the CI runs VMs beside
	// these tests) comes near it, and it is far from a drop's forever
	refusedDialTimeout = 5 * time.Second
)

type lineNet struct {
	guest, instance, node, world int
	// spec is a guest without IPv6; spec6 the same with an IPv6 address
	// and IPv6 ranges in every list.
	spec, spec6 TableSpec
}

func newLineNet(t *testing.T) *lineNet {
	t.Helper()
	n := &lineNet{guest: testNetns(t), instance: testNetns(t), node: testNetns(t), world: testNetns(t)}
	g, i, nd, w := links(t, n.guest), links(t, n.instance), links(t, n.node), links(t, n.world)
	i.veth(TapName, g, "eth0")
	i.veth(VethName, nd, NodeVethPrefix+"test")
	nd.veth("up0", w, "eth0")

	g.addr("eth0", "10.240.0.2/24")
	g.route("default", "10.240.0.1")
	i.addr(TapName, "10.240.0.1/24")
	i.addr(VethName, "172.31.0.1/30")
	i.route("default", "172.31.0.2")
	i.forwarding()
	nd.addr(NodeVethPrefix+"test", "172.31.0.2/30")
	nd.addr("up0", nodeUplink+"/24")
	nd.route("10.240.0.0/24", "172.31.0.1")
	nd.route("203.0.113.0/24", "198.51.100.2")
	nd.forwarding()
	w.addr("eth0", "198.51.100.2/24")
	for _, a := range []string{worldPublic, worldManagement, worldDenied, worldNotAllowed} {
		w.addr("eth0", a+"/32")
	}

	g.addr("eth0", guest6+"/64")
	// a source the guest may not use, deprecated so that the kernel picks
	// it only when told to
	nsRun(t, n.guest, "ip", "-6", "addr", "add", "fd6b:6b00:240::99/64", "dev", "eth0", "nodad", "preferred_lft", "0")
	g.route("::/0", "fd6b:6b00:240::1")
	i.addr(TapName, "fd6b:6b00:240::1/64")
	i.addr(VethName, "fd00:31::1/64")
	i.route("::/0", "fd00:31::2")
	i.forwarding6()
	nd.addr(NodeVethPrefix+"test", "fd00:31::2/64")
	nd.addr("up0", nodeUplink6+"/64")
	// deprecated, so that masquerading picks nodeUplink6
	nsRun(t, n.node, "ip", "-6", "addr", "add", nodeLater6+"/128", "dev", "up0", "nodad", "preferred_lft", "0")
	nd.route(pool6, "fd00:31::1")
	// As Connect does: no neighbour discovery on the veth, whose node end
	// takes no IPv6 from Instances (the node's table drops it).
	i.neighbour(VethName, "fd00:31::2", nd, NodeVethPrefix+"test")
	nd.neighbour(NodeVethPrefix+"test", "fd00:31::1", i, VethName)
	nd.route("2001:db8:113::/64", "2001:db8:100::2")
	nd.forwarding6()
	w.addr("eth0", "2001:db8:100::2/64")
	for _, a := range []string{worldPublic6, worldManagement6, worldDenied6, worldNotAllowed6} {
		w.addr("eth0", a+"/128")
	}
	// world answers the node's address only: masquerading is tested by
	// world having no route back to the guests

	n.spec = TableSpec{
		Guest:      netip.MustParseAddr("10.240.0.2"),
		Egress:     EgressPublic,
		Resolver:   netip.MustParseAddrPort(worldManagement + ":53"),
		HostAddrs:  pfx(nodeUplink+"/32", "172.31.0.2/32"),
		Management: pfx(worldManagement + "/32"),
		Pools:      pfx("10.240.0.0/24"),
		Allow:      pfx("198.51.100.0/24"),
		Deny:       pfx(worldDenied + "/32"),
	}
	n.spec6 = n.spec
	n.spec6.Guest6 = netip.MustParseAddr(guest6)
	n.spec6.HostAddrs = append(pfx(nodeUplink6+"/128", "fd00:31::2/128"), n.spec.HostAddrs...)
	n.spec6.Management = append(pfx(worldManagement6+"/128"), n.spec.Management...)
	n.spec6.Pools = append(pfx(pool6), n.spec.Pools...)
	n.spec6.Allow = append(pfx("2001:db8:100::/64"), n.spec.Allow...)
	n.spec6.Deny = append(pfx(worldDenied6+"/128"), n.spec.Deny...)
	host, err := BuildHost(HostSpec{
		Pools:       pfx("10.240.0.0/24", pool6),
		Management:  pfx(worldManagement+"/32", worldManagement6+"/128"),
		UplinkIface: "up0",
		Resolvers:   []netip.AddrPort{n.spec.Resolver},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := ReplaceHost(context.Background(), n.node, host); err != nil {
		t.Fatal(err)
	}
	serveEcho(t, n.world, "0.0.0.0:"+echoPort)
	serveEcho(t, n.node, "0.0.0.0:"+echoPort)
	serveEcho(t, n.world, "[::]:"+echoPort)
	serveEcho(t, n.node, "[::]:"+echoPort)
	serveUDPEcho(t, n.world, worldManagement+":53")
	serveUDPEcho(t, n.world, "["+worldPublic6+"]:53")
	return n
}

func (n *lineNet) replace(t *testing.T, spec TableSpec) {
	t.Helper()
	tbl, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := Replace(context.Background(), n.instance, tbl); err != nil {
		t.Fatal(err)
	}
}

// serveEcho listens in the namespace; each connection first gets the
// address its peer is seen from, then an echo of what it sends.
func serveEcho(t *testing.T, nsFD int, addr string) {
	t.Helper()
	var ln net.Listener
	network := "tcp4"
	if strings.HasPrefix(addr, "[") {
		network = "tcp6"
	}
	if err := inNetns(nsFD, func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	// Cleanup closes the server's ends too: a connection cut by Isolate
	// never brings the client's close to them.
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				peer, _ := netip.ParseAddrPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s\n", peer.Addr())
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}

func serveUDPEcho(t *testing.T, nsFD int, addr string) {
	t.Helper()
	var pc net.PacketConn
	network := "udp4"
	if strings.HasPrefix(addr, "[") {
		network = "udp6"
	}
	if err := inNetns(nsFD, func() (err error) {
		pc, err = net.ListenPacket(network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// conn is a guest's TCP connection to an echo server.
type conn struct {
	c net.Conn
	r *bufio.Reader
	// seenAs is the address the server saw the guest as.
	seenAs string
}

func (n *lineNet) dial(addr string, timeout time.Duration) (*conn, error) {
	return n.dialFrom("", addr, timeout)
}

// dialFrom dials from a given source address of the guest ("" for the
// kernel's choice).
func (n *lineNet) dialFrom(src, addr string, timeout time.Duration) (*conn, error) {
	var c net.Conn
	d := net.Dialer{Timeout: timeout}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	if err := inNetns(n.guest, func() (err error) {
		c, err = d.Dial("tcp", addr)
		return err
	}); err != nil {
		return nil, err
	}
	gc := &conn{c: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	seen, err := gc.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read greeting: %w", err)
	}
	gc.seenAs = strings.TrimSpace(seen)
	return gc, nil
}

// echo sends a line and reads it back within timeout.
func (c *conn) echo(msg string, timeout time.Duration) error {
	c.c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c.c, "%s\n", msg); err != nil {
		return err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != msg {
		return fmt.Errorf("echo %q, sent %q", got, msg)
	}
	return nil
}

// mustReach waits until the guest connects to addr and the echo works.
func (n *lineNet) mustReach(t *testing.T, addr string) *conn {
	t.Helper()
	var c *conn
	testenv.WaitFor(t, 10*time.Second, "guest connects to "+addr, func() (bool, string) {
		var err error
		if c, err = n.dial(addr, 2*time.Second); err != nil {
			return false, err.Error()
		}
		if err = c.echo("hello", 2*time.Second); err != nil {
			c.c.Close()
			return false, err.Error()
		}
		return true, ""
	})
	t.Cleanup(func() { c.c.Close() })
	return c
}

// mustNotReach checks that the Instance's table refuses connects to
// addrs: each fails at once (IPv4 "no route to host", administratively
// prohibited; IPv6 a reset), not after a timeout. All at once, to spend
// one timeout when one does time out.
func (n *lineNet) mustNotReach(t *testing.T, addrs ...string) {
	t.Helper()
	n.mustNotReachFrom(t, "", true, addrs...)
}

// mustBeDropped checks that connects to addrs from src ("" for the
// guest's own address) time out: a dropped SYN, as for a spoofed source
// or what the node's own table stops.
func (n *lineNet) mustBeDropped(t *testing.T, src string, addrs ...string) {
	t.Helper()
	n.mustNotReachFrom(t, src, false, addrs...)
}

func (n *lineNet) mustNotReachFrom(t *testing.T, src string, refused bool, addrs ...string) {
	t.Helper()
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout := deniedDialTimeout
			if refused {
				timeout = refusedDialTimeout
			}
			c, err := n.dialFrom(src, a, timeout)
			if err == nil {
				c.c.Close()
				errs[i] = fmt.Errorf("guest connected to %s (seen as %s)", a, c.seenAs)
				return
			}
			ne := net.Error(nil)
			timedOut := errors.As(err, &ne) && ne.Timeout()
			switch {
			// IPv4: administratively prohibited, "no route to host";
			// IPv6 TCP: a reset, "connection refused".
			case refused && !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED):
				errs[i] = fmt.Errorf("connect to %s: %v, want it refused at once", a, err)
			case !refused && !timedOut:
				errs[i] = fmt.Errorf("connect to %s: %v, want a timeout (a dropped SYN)", a, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// mustResolve sends a DNS-port datagram to a public address and expects the
// resolver's answer back from that address.
func (n *lineNet) mustResolve(t *testing.T) {
	t.Helper()
	var uc net.Conn
	if err := inNetns(n.guest, func() (err error) {
		uc, err = net.Dial("udp4", "192.0.2.99:53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	buf := make([]byte, 64)
	testenv.WaitFor(t, 10*time.Second, "guest DNS reaches the resolver", func() (bool, string) {
		uc.SetDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := uc.Write([]byte("query")); err != nil {
			return false, err.Error()
		}
		k, err := uc.Read(buf)
		if err != nil {
			return false, err.Error()
		}
		return string(buf[:k]) == "query", fmt.Sprintf("answer %q", buf[:k])
	})
}

func denied(t *testing.T, ns int) uint64 {
	t.Helper()
	p, _, err := DeniedCount(ns)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
