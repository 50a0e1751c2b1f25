// Package fdpass carries open descriptors between processes over a unix
// stream socket (SCM_RIGHTS): the node hands listening sockets to the data
// plane and egress generations, and files to QEMU. It owns the ancillary
// data and the accounting of received descriptors; it never interprets
// the bytes they ride on, which belong to the caller's protocol.
package fdpass

import (
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Conn is a unix stream connection whose reads collect the descriptors
// that ride on the bytes read, for the caller to claim with TakeFDs once it
// parsed the message they came with. Writes without descriptors are the
// embedded connection's.
type Conn struct {
	*net.UnixConn
	max int
	oob []byte // Read's alone: reads are not concurrent

	// mu guards fds: Close, like a net.Conn's, may be called while a Read
	// is blocked.
	mu  sync.Mutex
	fds []int // received, not yet claimed
}

// NewConn wraps c; a read that brings more than max descriptors is an
// error (what the kernel could not fit in the buffer it closes itself).
func NewConn(c *net.UnixConn, max int) *Conn {
	return &Conn{UnixConn: c, max: max, oob: make([]byte, unix.CmsgSpace(4*max))}
}

// Read reads bytes and keeps the descriptors that came with them.
func (c *Conn) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(p, c.oob)
	n = max(n, 0) // -1 with some errors (a deadline)
	c.mu.Lock()
	defer c.mu.Unlock()
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
		if perr != nil {
			return n, fmt.Errorf("fdpass: ancillary data from %s: %w", c.RemoteAddr(), perr)
		}
		for _, m := range msgs {
			// Not SCM_RIGHTS (credentials are never asked for): skipped.
			if fds, ferr := unix.ParseUnixRights(&m); ferr == nil {
				c.fds = append(c.fds, fds...)
			}
		}
	}
	if flags&unix.MSG_CTRUNC != 0 || len(c.fds) > c.max {
		return n, fmt.Errorf("fdpass: a message carried more than %d descriptors: the peer does not speak this protocol", c.max)
	}
	return n, err
}

// TakeFDs hands the descriptors received so far to the caller, who closes
// them.
func (c *Conn) TakeFDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	fds := c.fds
	c.fds = nil
	return fds
}

// WriteFDs writes b whole, with fds riding on its first bytes (the caller
// keeps them open until WriteFDs returns).
func (c *Conn) WriteFDs(b []byte, fds ...int) error { return Send(c.UnixConn, b, fds...) }

// Close closes the connection and the descriptors nobody claimed.
func (c *Conn) Close() error {
	Close(c.TakeFDs())
	return c.UnixConn.Close()
}

// Send writes b whole on c with fds riding on its first bytes; without fds
// it is a plain write.
func Send(c *net.UnixConn, b []byte, fds ...int) error {
	if len(fds) == 0 {
		_, err := c.Write(b)
		return err
	}
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

// Close closes every descriptor in fds.
func Close(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// FileFD is f's descriptor without (*os.File).Fd, which would switch a
// socket to blocking mode: that flag belongs to the open file
// description, which SCM_RIGHTS shares with the receiving process, whose
// accept loop must stay non-blocking. The caller keeps f alive while it
// uses the number.
func FileFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		return -1, err
	}
	return fd, nil
}
