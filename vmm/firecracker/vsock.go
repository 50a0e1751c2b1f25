package firecracker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultHandshakeTimeout bounds the CONNECT handshake when the caller's
// context has no earlier deadline.
const DefaultHandshakeTimeout = 5 * time.Second

// maxReplyLen bounds the "OK <port>\n" line: "OK " and a u32 and "\n" is
// at most 14 bytes; anything longer is not Firecracker.
const maxReplyLen = 32

// VsockConn is an established host-to-guest vsock stream: after the
// handshake, reads and writes are the guest program's.
type VsockConn struct {
	net.Conn
	// HostPort is the port Firecracker assigned to the host end ("OK <n>").
	HostPort uint32
}

// HandshakeError says why the hybrid vsock handshake failed.
type HandshakeError struct {
	Socket string
	Port   uint32
	Reply  string // what was read, if anything
	Err    error
}

func (e *HandshakeError) Error() string {
	s := fmt.Sprintf("vsock %s port %d: CONNECT handshake", e.Socket, e.Port)
	if e.Reply != "" {
		s += fmt.Sprintf(" (read %q)", e.Reply)
	}
	return s + ": " + e.Err.Error()
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// ErrNoListener is the handshake's end when Firecracker closes the
// connection without "OK": by docs/vsock.md, nothing listens on that guest
// port (yet — during boot this is the normal answer; retry).
var ErrNoListener = errors.New("connection closed before OK: no guest program listens on the port (yet)")

// DialVsock opens a host-initiated stream to guest vsock port through
// Firecracker's hybrid vsock socket udsPath: connect, send "CONNECT
// <port>\n", read "OK <hostport>\n". The handshake is bounded by ctx and
// by DefaultHandshakeTimeout, whichever ends first.
func DialVsock(ctx context.Context, udsPath string, port uint32) (*VsockConn, error) {
	return dialVsock(ctx, udsPath, port, DefaultHandshakeTimeout)
}

func dialVsock(ctx context.Context, udsPath string, port uint32, timeout time.Duration) (*VsockConn, error) {
	deadline := time.Now().Add(timeout)
	fromCtx := false
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline, fromCtx = d, true
	}
	budget := time.Until(deadline)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "unix", udsPath)
	if err != nil {
		return nil, fmt.Errorf("vsock %s port %d: %w", udsPath, port, err)
	}
	fail := func(reply string, err error) (*VsockConn, error) {
		c.Close()
		switch {
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		case fromCtx && errors.Is(err, os.ErrDeadlineExceeded):
			// The connection's deadline is ctx's, and may fire first.
			err = fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
		case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("no complete answer within %v: %w", budget.Round(time.Millisecond), err)
		}
		return nil, &HandshakeError{Socket: udsPath, Port: port, Reply: reply, Err: err}
	}
	c.SetDeadline(deadline)
	// A cancelled ctx interrupts a blocked read or write.
	stop := context.AfterFunc(dctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if _, err := io.WriteString(c, "CONNECT "+strconv.FormatUint(uint64(port), 10)+"\n"); err != nil {
		return fail("", err)
	}
	// Read byte by byte: whatever follows the newline is the guest's and
	// must stay in the connection.
	var line []byte
	var b [1]byte
	for {
		n, err := c.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				break
			}
			line = append(line, b[0])
			if len(line) > maxReplyLen {
				return fail(string(line), errors.New("reply line too long: not a Firecracker vsock socket?"))
			}
			continue
		}
		if errors.Is(err, io.EOF) {
			return fail(string(line), ErrNoListener)
		}
		if errors.Is(err, syscall.ECONNRESET) {
			return fail(string(line), fmt.Errorf("%w: %v", ErrNoListener, err))
		}
		if err != nil {
			return fail(string(line), err)
		}
	}
	if !stop() {
		// ctx ended just as the reply arrived; the deadline was poisoned.
		return fail(string(line), context.Cause(dctx))
	}
	reply := string(line)
	rest, ok := strings.CutPrefix(reply, "OK ")
	if !ok {
		return fail(reply, errors.New(`want "OK <port>"`))
	}
	hp, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return fail(reply, fmt.Errorf(`want "OK <port>": %w`, err))
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return fail(reply, err)
	}
	return &VsockConn{Conn: c, HostPort: uint32(hp)}, nil
}
