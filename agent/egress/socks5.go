package egress

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// SOCKS5 constants (RFC 1928, RFC 1929).
const (
	socksVersion     = 5
	socksNoAuth      = 0x00
	socksUserPass    = 0x02
	socksNoMethod    = 0xff
	socksConnect     = 0x01
	socksIPv4        = 0x01
	socksDomain      = 0x03
	socksIPv6        = 0x04
	userPassVersion  = 0x01
	userPassSucceeds = 0x00
)

var socksReplies = map[byte]string{
	1: "general SOCKS server failure",
	2: "connection not allowed by ruleset",
	3: "network unreachable",
	4: "host unreachable",
	5: "connection refused",
	6: "TTL expired",
	7: "command not supported",
	8: "address type not supported",
}

// dialProxy gives a connection to p's server on which CONNECT to dst
// succeeded, within the handshake timeout: from p's warm pool when it has
// one (one round trip left), else dialed and greeted afresh.
func (s *Server) dialProxy(ctx context.Context, p *proxyRoute, dst netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.HandshakeTimeout)
	defer cancel()
	if c, ok := p.warm.take(s); ok {
		err := withDeadline(ctx, c, func() error { return socksRequest(c, dst) })
		var refused *socksReplyError
		switch {
		case err == nil:
			return c, nil
		case errors.As(err, &refused) || ctx.Err() != nil:
			// The proxy's answer about dst: a fresh connection gets the same.
			c.Close()
			return nil, fmt.Errorf("egress %s: SOCKS5 server %s: %w", p.name, p.server, err)
		}
		c.Close() // a warm connection the server dropped: dial afresh
	}
	c, err := s.dialGreeted(ctx, p)
	if err != nil {
		return nil, err
	}
	if err := withDeadline(ctx, c, func() error { return socksRequest(c, dst) }); err != nil {
		c.Close()
		return nil, fmt.Errorf("egress %s: SOCKS5 server %s: %w", p.name, p.server, err)
	}
	return c, nil
}

// dialGreeted connects to p's server (each of its addresses in turn) and
// negotiates the method and credentials, leaving the request to come.
func (s *Server) dialGreeted(ctx context.Context, p *proxyRoute) (net.Conn, error) {
	addrs, err := s.resolve(ctx, p.server)
	if err != nil {
		return nil, fmt.Errorf("egress %s: %w", p.name, err)
	}
	var d net.Dialer
	var c net.Conn
	for _, a := range addrs {
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, p.server.port).String())
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("egress %s: reach SOCKS5 server %s: %w", p.name, p.server, err)
	}
	if err := withDeadline(ctx, c, func() error { return socksGreet(c, p.username, p.password) }); err != nil {
		c.Close()
		return nil, fmt.Errorf("egress %s: SOCKS5 server %s: %w", p.name, p.server, err)
	}
	return c, nil
}

// withDeadline runs f, whose reads and writes on c are not
// context-aware, so that ctx's deadline or cancellation (a kill) ends it.
func withDeadline(ctx context.Context, c net.Conn, f func() error) error {
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err := f()
	if !stop() || ctx.Err() != nil {
		return fmt.Errorf("SOCKS5 handshake: %w", context.Cause(ctx))
	}
	c.SetDeadline(time.Time{})
	return err
}

// socksHandshake is the client side of a CONNECT to dst on c: method
// negotiation, username/password when user is set, the request, and the
// reply read to its last byte (what follows is the destination's).
func socksHandshake(c io.ReadWriter, dst netip.AddrPort, user, pass string) error {
	if err := socksGreet(c, user, pass); err != nil {
		return err
	}
	return socksRequest(c, dst)
}

// socksGreet negotiates the method and, when user is set, authenticates.
func socksGreet(c io.ReadWriter, user, pass string) error {
	method := byte(socksNoAuth)
	if user != "" {
		// Only the method we were configured for: a server that would let
		// us in without the caller's credentials is not the one meant.
		method = socksUserPass
	}
	if _, err := c.Write([]byte{socksVersion, 1, method}); err != nil {
		return err
	}
	var sel [2]byte
	if _, err := io.ReadFull(c, sel[:]); err != nil {
		return fmt.Errorf("method selection: %w", err)
	}
	if sel[0] != socksVersion {
		return fmt.Errorf("method selection: version %d, not a SOCKS5 server", sel[0])
	}
	if sel[1] != method {
		if sel[1] == socksNoMethod && method == socksUserPass {
			return errors.New("the server accepts no username/password authentication")
		}
		if sel[1] == socksNoMethod {
			return errors.New("the server requires authentication and the egress has no credentials")
		}
		return fmt.Errorf("the server chose method %#x, which was not offered", sel[1])
	}
	if method != socksUserPass {
		return nil
	}
	msg := make([]byte, 0, 3+len(user)+len(pass))
	msg = append(msg, userPassVersion, byte(len(user)))
	msg = append(msg, user...)
	msg = append(msg, byte(len(pass)))
	msg = append(msg, pass...)
	_, err := c.Write(msg)
	clear(msg)
	if err != nil {
		return err
	}
	var st [2]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return fmt.Errorf("authentication: %w", err)
	}
	if st[1] != userPassSucceeds {
		return fmt.Errorf("the server refused the egress's username and password (status %#x)", st[1])
	}
	return nil
}

// socksRequest sends CONNECT dst and reads the reply.
func socksRequest(c io.ReadWriter, dst netip.AddrPort) error {
	if _, err := c.Write(connectRequest(dst)); err != nil {
		return err
	}
	return readConnectReply(c, dst)
}

// socksReplyError is the server's refusal of a CONNECT.
type socksReplyError struct {
	dst  netip.AddrPort
	code byte
}

func (e *socksReplyError) Error() string {
	why, ok := socksReplies[e.code]
	if !ok {
		why = fmt.Sprintf("reply %#x", e.code)
	}
	return fmt.Sprintf("connect to %s: %s", e.dst, why)
}

// connectRequest is VER CMD RSV ATYP DST.ADDR DST.PORT for an address.
func connectRequest(dst netip.AddrPort) []byte {
	req := []byte{socksVersion, socksConnect, 0}
	if a := dst.Addr().Unmap(); a.Is4() {
		b := a.As4()
		req = append(append(req, socksIPv4), b[:]...)
	} else {
		b := a.As16()
		req = append(append(req, socksIPv6), b[:]...)
	}
	return binary.BigEndian.AppendUint16(req, dst.Port())
}

func readConnectReply(c io.Reader, dst netip.AddrPort) error {
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("connect reply: %w", err)
	}
	if hdr[0] != socksVersion {
		return fmt.Errorf("connect reply: version %d", hdr[0])
	}
	if hdr[1] != 0 {
		return &socksReplyError{dst: dst, code: hdr[1]}
	}
	var n int
	switch hdr[3] {
	case socksIPv4:
		n = 4
	case socksIPv6:
		n = 16
	case socksDomain:
		var l [1]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return fmt.Errorf("connect reply: %w", err)
		}
		n = int(l[0])
	default:
		return fmt.Errorf("connect reply: address type %#x", hdr[3])
	}
	rest := make([]byte, n+2) // BND.ADDR, BND.PORT: unused, but read off
	if _, err := io.ReadFull(c, rest); err != nil {
		return fmt.Errorf("connect reply: %w", err)
	}
	return nil
}
