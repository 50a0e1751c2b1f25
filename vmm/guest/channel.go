package guest

import (
	"errors"
	"io"
	"net"
	"sync"
)

// maxBuffered is how much the channel reader reads ahead of its consumers.
const maxBuffered = 1 << 20

// errInterrupted is what a session's view returns once the session closed.
var errInterrupted = errors.New("guest agent: session closed")

// channel owns all reads of one opened channel to the node. Its one reader
// goroutine appends what it reads to buf; handshakes and sessions consume
// buf through views. A consumer that stops (a session that ended) never
// abandons a read of the channel: the reader keeps going and the bytes wait
// in buf for the next consumer. conn is only closed when the reader has
// stopped on an error, or when its serveConn ends; close waits for the
// reader.
type channel struct {
	conn io.ReadWriteCloser

	mu      sync.Mutex
	cond    *sync.Cond
	buf     []byte // read from conn, not consumed yet
	store   []byte // buf's backing array while it fits: reused, never reallocated
	reading bool   // the reader goroutine runs
	err     error  // why the reader stopped
	closed  bool
	readers sync.WaitGroup // the reader goroutine (one at a time)
}

func newChannel(conn io.ReadWriteCloser) *channel {
	c := &channel{conn: conn}
	c.cond = sync.NewCond(&c.mu)
	c.reading = true
	c.readers.Add(1)
	go c.readLoop()
	return c
}

func (c *channel) readLoop() {
	defer c.readers.Done()
	b := make([]byte, 32<<10)
	for {
		n, err := c.conn.Read(b)
		c.mu.Lock()
		if c.closed {
			c.reading = false
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		c.add(b[:n])
		if err != nil {
			c.reading, c.err = false, err
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		c.cond.Broadcast()
		for len(c.buf) >= maxBuffered && !c.closed {
			c.cond.Wait()
		}
		c.mu.Unlock()
	}
}

// add appends b to buf (c.mu held). Consumers copy out of buf, so its
// unconsumed bytes can be moved to the front of the one store it lives in:
// a channel read (at most a page from virtio-serial) then costs no
// allocation and, under emulation, no garbage collection.
func (c *channel) add(b []byte) {
	if len(b) == 0 {
		return
	}
	if c.store == nil {
		c.store = make([]byte, 0, maxBuffered+64<<10)
	}
	if len(c.buf) == 0 {
		c.buf = c.store[:0]
	}
	if cap(c.buf)-len(c.buf) < len(b) && len(c.buf)+len(b) <= cap(c.store) {
		// Compact: buf is a tail of store (or a slice unread allocated).
		n := copy(c.store[:cap(c.store)], c.buf)
		c.buf = c.store[:n]
	}
	c.buf = append(c.buf, b...)
}

// rearm restarts the reader after it stopped on an error: the error was a
// disconnect of the node, and the channel may deliver the next node's bytes.
func (c *channel) rearm() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.reading && !c.closed {
		c.reading, c.err = true, nil
		c.readers.Add(1)
		go c.readLoop()
	}
}

// readErr is the error that stopped the reader, nil while it runs. Bytes
// still buffered then are the tail of what the failed handshake could not
// use (a cut hello at most).
func (c *channel) readErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	if c.reading {
		return nil
	}
	return c.err
}

// unread puts b back in front of the unconsumed bytes.
func (c *channel) unread(b []byte) {
	if len(b) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(append(make([]byte, 0, len(b)+len(c.buf)), b...), c.buf...)
	c.cond.Broadcast()
}

// close closes conn, wakes every consumer and waits for the reader, which
// the closed conn ends; the serveConn that made the channel is ending.
// Calling it again only waits.
func (c *channel) close() {
	c.mu.Lock()
	was := c.closed
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	if !was {
		c.conn.Close()
	}
	c.readers.Wait()
}

// view is a consumer of the channel's bytes.
func (c *channel) view() *chanView { return &chanView{c: c} }

// chanView reads the channel's bytes; Close (yamux closing its session)
// wakes its reader without touching the channel.
type chanView struct {
	c           *channel
	interrupted bool // guarded by c.mu
}

func (v *chanView) Read(p []byte) (int, error) {
	c := v.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case v.interrupted:
			return 0, errInterrupted
		case len(c.buf) > 0:
			n := copy(p, c.buf)
			c.buf = c.buf[n:]
			if len(c.buf) == 0 {
				c.buf = nil
			}
			c.cond.Broadcast() // the reader may wait for room
			return n, nil
		case c.closed:
			return 0, net.ErrClosed
		case !c.reading:
			return 0, c.err
		}
		c.cond.Wait()
	}
}

// Close interrupts the view; the channel stays open.
func (v *chanView) Close() error {
	v.c.mu.Lock()
	v.interrupted = true
	v.c.cond.Broadcast()
	v.c.mu.Unlock()
	return nil
}
