package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/fdpass"
)

// The process's side of a hand-over. The node asks the serving generation
// for its state (exportState) and a copy of its listening socket
// (takeListener), starts the next generation with AwaitListener, gives it
// the state and the socket (installListener), and only then tells the old
// one to drain: both accept on the one socket for a moment, and a
// connection the kernel queued is taken by whichever accepts first, so
// none is refused.

// exportState is the state applied last, for a successor to serve the
// same targets with the same key and certificate; nil before any push.
func (s *Server) exportState() (*State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.applied {
		return nil, nil
	}
	st := State{PublicKey: s.pubs[0], PublicKeys: s.pubs, CertPEM: s.certPEM, KeyPEM: s.keyPEM, Targets: make([]Target, 0, len(s.targets))}
	for _, t := range s.targets {
		st.Targets = append(st.Targets, t)
	}
	slices.SortFunc(st.Targets, func(a, b Target) int { return strings.Compare(a.WorkspaceID, b.WorkspaceID) })
	return &st, nil
}

// takeListener returns a copy of the listening socket for the caller to
// send and close.
func (s *Server) takeListener() ([]int, error) {
	s.mu.Lock()
	ln, draining := s.ln, s.draining
	s.mu.Unlock()
	if ln == nil {
		if draining {
			return nil, errors.New("dataplane: take-listener: this generation is draining and let its listening socket go")
		}
		return nil, errors.New("dataplane: take-listener: this generation has no listening socket yet")
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return nil, fmt.Errorf("dataplane: take-listener: the listener is a %T, not TCP", ln)
	}
	f, err := tl.File() // a copy; the caller's copy below is another
	if err != nil {
		return nil, fmt.Errorf("dataplane: take-listener: %w", err)
	}
	defer f.Close()
	fd, err := fdpass.FileFD(f)
	if err == nil {
		fd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("dataplane: take-listener: %w", err)
	}
	return []int{fd}, nil
}

// installListener starts serving the listening socket the node handed
// over (fds[0], owned by the caller). It must be a listening TCP socket
// bound to the address this process was started for.
func (s *Server) installListener(fds []int) error {
	if len(fds) != 1 {
		return fmt.Errorf("dataplane: listener: got %d descriptors, want 1 (the listening socket)", len(fds))
	}
	if err := checkListener(fds[0], s.cfg.Listen); err != nil {
		return err
	}
	s.mu.Lock()
	busy := s.ln != nil || s.draining || s.stopping
	s.mu.Unlock()
	if busy {
		return errors.New("dataplane: listener: this generation listens already, or no longer: hand the socket to the newest generation")
	}
	nfd, err := unix.FcntlInt(uintptr(fds[0]), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dataplane: listener: %w", err)
	}
	f := os.NewFile(uintptr(nfd), "dataplane-listener")
	ln, err := net.FileListener(f) // its own copy
	f.Close()
	if err != nil {
		return fmt.Errorf("dataplane: listener: %w", err)
	}
	s.mu.Lock()
	if s.ln != nil || s.draining || s.stopping {
		s.mu.Unlock()
		ln.Close()
		return errors.New("dataplane: listener: this generation listens already, or no longer")
	}
	s.serveLocked(ln)
	s.mu.Unlock()
	s.log.Info("data plane listening", "listen", ln.Addr().String(), "handed_over", true)
	return nil
}

// checkListener wants a listening TCP socket bound to listen (HOST:PORT;
// port 0 takes any port, a host name any address).
func checkListener(fd int, listen string) error {
	const what = "dataplane: listener: the descriptor"
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return fmt.Errorf("%s is not a stream socket", what)
	}
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || v != 1 {
		return fmt.Errorf("%s does not listen", what)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	var got netip.AddrPort
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		got = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		got = netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		return fmt.Errorf("%s is not a TCP socket", what)
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("dataplane: listener: listen address %q: %w", listen, err)
	}
	wrong := func() error {
		return fmt.Errorf("%s is bound to %s, not to %s: the node hands over only a socket of the same address", what, got, listen)
	}
	if port != "0" && port != fmt.Sprint(got.Port()) {
		return wrong()
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap() != got.Addr().Unmap() {
		return wrong()
	}
	if host == "" && !got.Addr().IsUnspecified() {
		return wrong()
	}
	return nil
}
