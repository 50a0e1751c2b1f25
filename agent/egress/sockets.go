package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ListenTransparentTCP makes the egress process's TCP listener on addr
// (IPv4 HOST:PORT, e.g. 0.0.0.0:PORT) as the node, which needs
// CAP_NET_ADMIN: IP_TRANSPARENT is set before bind, so nftables TPROXY can
// deliver guest connections to it with their original destination as the
// local address. The caller sends the file (Client.SendListeners) and
// closes it; it must not call Fd on it (that makes the shared socket
// blocking under the process's accept loop).
func ListenTransparentTCP(ctx context.Context, addr string) (*os.File, error) {
	if err := checkIPv4(addr, true); err != nil {
		return nil, fmt.Errorf("egress: transparent TCP listener %q: %w", addr, err)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(ctx, "tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: transparent TCP listener %s: %w (IP_TRANSPARENT needs CAP_NET_ADMIN)", addr, err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("egress: transparent TCP listener %s: %w", addr, err)
	}
	return f, nil
}

// ListenDNS makes the egress process's DNS socket on addr, an IPv4
// ADDR:PORT of the node that Instance namespaces DNAT the DNS of
// Resolver-referencing guests to. The address must be a specific one: the
// answers must leave from it for the namespace's conntrack to un-DNAT
// them.
func ListenDNS(addr string) (*os.File, error) {
	if err := checkIPv4(addr, false); err != nil {
		return nil, fmt.Errorf("egress: DNS socket %q: %w", addr, err)
	}
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: DNS socket %s: %w", addr, err)
	}
	defer pc.Close()
	f, err := pc.(*net.UDPConn).File()
	if err != nil {
		return nil, fmt.Errorf("egress: DNS socket %s: %w", addr, err)
	}
	return f, nil
}

// ListenDNSTCP makes the TCP half of the DNS socket, on the same address
// as ListenDNS: a guest whose answer came truncated over UDP asks again
// over TCP, to the same DNATed address.
func ListenDNSTCP(addr string) (*os.File, error) {
	if err := checkIPv4(addr, false); err != nil {
		return nil, fmt.Errorf("egress: DNS TCP listener %q: %w", addr, err)
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("egress: DNS TCP listener %s: %w", addr, err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("egress: DNS TCP listener %s: %w", addr, err)
	}
	return f, nil
}

// Sockets are what the node makes for an egress process and hands over
// (Client.SendListeners), in the order sent.
type Sockets struct {
	TCP    *os.File // ListenTransparentTCP: proxied guests' connections
	DNS    *os.File // ListenDNS: Resolver guests' queries over UDP
	DNSTCP *os.File // ListenDNSTCP: the same over TCP
}

// ListenSockets makes all three: the transparent listener on tcpAddr and
// the DNS sockets on dnsAddr.
func ListenSockets(ctx context.Context, tcpAddr, dnsAddr string) (Sockets, error) {
	var s Sockets
	var err error
	if s.TCP, err = ListenTransparentTCP(ctx, tcpAddr); err != nil {
		return s, err
	}
	if s.DNS, err = ListenDNS(dnsAddr); err == nil {
		s.DNSTCP, err = ListenDNSTCP(dnsAddr)
	}
	if err != nil {
		s.Close()
		return Sockets{}, err
	}
	return s, nil
}

// Close closes the caller's copies.
func (s Sockets) Close() {
	for _, f := range s.files() {
		if f != nil {
			f.Close()
		}
	}
}

func (s Sockets) files() []*os.File { return []*os.File{s.TCP, s.DNS, s.DNSTCP} }

func checkIPv4(addr string, anyOK bool) error {
	ap, err := netip.ParseAddrPort(addr)
	switch {
	case err != nil || !ap.Addr().Is4():
		return fmt.Errorf("want IPv4 ADDRESS:PORT")
	case ap.Port() == 0:
		return fmt.Errorf("want a fixed port: the node's rules name it")
	case !anyOK && ap.Addr().IsUnspecified():
		return fmt.Errorf("want a specific address: answers must leave from the address queries were DNATed to")
	}
	return nil
}

// boundTo says whether the socket of f is bound to addr (IPv4 HOST:PORT).
func boundTo(f *os.File, addr string) bool {
	want, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getsockname(int(fd)) }); err != nil || serr != nil {
		return false
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	return ok && netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)) == want
}
