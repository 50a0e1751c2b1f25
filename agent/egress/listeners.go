package egress

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/kibotos/kibotos/internal/fdpass"
	"golang.org/x/sys/unix"
)

// installListeners takes the node's TCP listener, DNS socket and DNS TCP
// listener (fds, in that order, owned by the caller until this returns)
// and starts serving them. They are checked first: a plain listener would
// lose the original destination of every connection.
func (s *Server) installListeners(fds []int) error {
	if len(fds) != listenerFDsCount {
		return fmt.Errorf("egress: listeners: got %d descriptors, want %d (the TCP listener, the DNS socket, the DNS TCP listener)", len(fds), listenerFDsCount)
	}
	if err := checkTCPListener(fds[0]); err != nil {
		return err
	}
	if err := checkDNSSocket(fds[1]); err != nil {
		return err
	}
	if err := checkDNSListener(fds[2], fds[1]); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.draining:
		return errors.New("egress: listeners: this process is draining: send them to the newer generation")
	case s.tcp != nil:
		return errors.New("egress: listeners: this process has its listeners already")
	}
	var files []*os.File
	fail := func(err error) error {
		for _, f := range files {
			f.Close()
		}
		return err
	}
	for i, name := range []string{"egress-tcp-listener", "egress-dns-socket", "egress-dns-tcp-listener"} {
		f, err := dupFile(fds[i], name)
		if err != nil {
			return fail(err)
		}
		files = append(files, f)
	}
	ln, err := net.FileListener(files[0])
	if err != nil {
		return fail(fmt.Errorf("egress: listeners: TCP listener: %w", err))
	}
	pc, err := net.FilePacketConn(files[1])
	if err != nil {
		ln.Close()
		return fail(fmt.Errorf("egress: listeners: DNS socket: %w", err))
	}
	dnsLn, err := net.FileListener(files[2])
	if err != nil {
		ln.Close()
		pc.Close()
		return fail(fmt.Errorf("egress: listeners: DNS TCP listener: %w", err))
	}
	s.files = Sockets{TCP: files[0], DNS: files[1], DNSTCP: files[2]}
	s.tcp, s.udp, s.dnsTCP = ln.(*net.TCPListener), pc.(*net.UDPConn), dnsLn.(*net.TCPListener)
	s.log.Info("egress listening", "tcp", s.tcp.Addr().String(), "dns", s.udp.LocalAddr().String())
	go s.acceptLoop(s.tcp)
	s.dns.Add(2)
	go s.dnsLoop(s.udp)
	go s.dnsTCPLoop(s.dnsTCP)
	return nil
}

// takeListeners returns duplicates of the sockets for the caller to send
// and close: the node moves them to a newer generation with them.
func (s *Server) takeListeners() ([]int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files.TCP == nil {
		if s.draining {
			return nil, errors.New("egress: take-listeners: this process is draining and has let its listeners go")
		}
		return nil, errors.New("egress: take-listeners: this process has no listeners yet")
	}
	var fds []int
	for _, f := range s.files.files() {
		fd, err := fdpass.FileFD(f)
		if err == nil {
			fd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		}
		if err != nil {
			fdpass.Close(fds)
			return nil, fmt.Errorf("egress: take-listeners: %w", err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// dupFile wraps a copy of fd, leaving fd to its owner.
func dupFile(fd int, name string) (*os.File, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("egress: listeners: %s: %w", name, err)
	}
	return os.NewFile(uintptr(nfd), name), nil
}

func sockOpt(fd, level, opt int) (int, error) { return unix.GetsockoptInt(fd, level, opt) }

// checkTCPListener wants an IPv4 TCP socket that listens with
// IP_TRANSPARENT: ListenTransparentTCP.
func checkTCPListener(fd int) error {
	const what = "egress: listeners: the first descriptor (TCP listener)"
	if err := checkSocket(fd, unix.SOCK_STREAM, what); err != nil {
		return err
	}
	if v, err := sockOpt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return fmt.Errorf("%s does not listen: make it with ListenTransparentTCP", what)
	}
	if v, err := sockOpt(fd, unix.SOL_IP, unix.IP_TRANSPARENT); err != nil || v != 1 {
		return fmt.Errorf("%s lacks IP_TRANSPARENT: TPROXYed connections would not reach it; make it with ListenTransparentTCP", what)
	}
	return nil
}

// checkDNSSocket wants an IPv4 UDP socket bound to a specific address:
// answers must leave from the address the Instance namespaces DNAT to.
func checkDNSSocket(fd int) error {
	const what = "egress: listeners: the second descriptor (DNS socket)"
	if err := checkSocket(fd, unix.SOCK_DGRAM, what); err != nil {
		return err
	}
	sa, err := unix.Getsockname(fd)
	in4, ok := sa.(*unix.SockaddrInet4)
	if err != nil || !ok || in4.Port == 0 || in4.Addr == [4]byte{} {
		return fmt.Errorf("%s is not bound to a specific IPv4 address and port: make it with ListenDNS", what)
	}
	return nil
}

// checkDNSListener wants an IPv4 TCP socket that listens on the DNS
// socket's own address (dnsFD's).
func checkDNSListener(fd, dnsFD int) error {
	const what = "egress: listeners: the third descriptor (DNS TCP listener)"
	if err := checkSocket(fd, unix.SOCK_STREAM, what); err != nil {
		return err
	}
	if v, err := sockOpt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return fmt.Errorf("%s does not listen: make it with ListenDNSTCP", what)
	}
	sa, err := unix.Getsockname(fd)
	dsa, derr := unix.Getsockname(dnsFD)
	in4, ok := sa.(*unix.SockaddrInet4)
	d4, dok := dsa.(*unix.SockaddrInet4)
	if err != nil || derr != nil || !ok || !dok || in4.Addr != d4.Addr || in4.Port != d4.Port {
		return fmt.Errorf("%s is not bound to the DNS socket's address: make both with ListenSockets", what)
	}
	return nil
}

func checkSocket(fd, typ int, what string) error {
	t, err := sockOpt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("%s is not a socket: %w", what, err)
	}
	if t != typ {
		return fmt.Errorf("%s is a socket of type %d, want %d", what, t, typ)
	}
	if d, err := sockOpt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || d != unix.AF_INET {
		return fmt.Errorf("%s is not an IPv4 socket", what)
	}
	return nil
}
