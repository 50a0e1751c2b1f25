package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// fakePort behaves like the guest end of a virtio-serial port behind a QEMU
// socket chardev, as the agent sees /dev/virtio-ports/<name> opened without
// read deadlines (a blocking character device):
//
//   - one open at a time (EBUSY otherwise);
//   - a read returns buffered data, at most one delivered chunk per read (so
//     a frame can arrive split across reads); without data it returns EOF
//     (or discErr) while the host is disconnected and blocks otherwise;
//   - a write blocks while the host is disconnected, like the kernel's
//     wait_port_writable;
//   - Close does not interrupt a read or write in flight: the file is
//     released when the last one returned, and the release discards the
//     data the port holds but nobody read (discard_port_data);
//   - bytes the host writes while the guest end is closed wait in QEMU and
//     are delivered at the next open.
type fakePort struct {
	mu   sync.Mutex
	cond *sync.Cond

	host    *fakeHost
	open    *fakeHandle
	inbuf   [][]byte // delivered to the guest, unread
	waiting [][]byte // held by QEMU while the guest end is closed
	dead    bool

	discErr       error // what a read returns while disconnected; nil: EOF
	quietDisc     bool  // a disconnect wakes no pending read (it stays blocked)
	writeErrDisc  bool  // writes fail instead of blocking while disconnected
	holdWrites    bool  // guest writes block (the host stopped draining)
	releaseOnData bool  // the next host data releases held writes
	chunk         int   // split host writes into chunks of this size

	readsInFlight, writesInFlight, writesHeld int
	opens, discarded                          int
}

func newFakePort() *fakePort {
	p := &fakePort{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

type fakeHandle struct {
	p      *fakePort
	closed bool
	io     int // reads and writes in flight
}

var errFakeClosed = errors.New("fake port: file already closed")
var errFakeBusy = errors.New("fake port: device busy")

func (p *fakePort) openGuest() (io.ReadWriteCloser, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return nil, errors.New("fake port: gone")
	}
	if p.open != nil {
		return nil, errFakeBusy
	}
	h := &fakeHandle{p: p}
	p.open = h
	p.opens++
	p.inbuf = append(p.inbuf, p.waiting...)
	p.waiting = nil
	p.cond.Broadcast()
	return h, nil
}

func (h *fakeHandle) Read(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed {
		return 0, errFakeClosed
	}
	h.io++
	p.readsInFlight++
	p.cond.Broadcast()
	defer func() {
		h.io--
		p.readsInFlight--
		h.maybeRelease()
		p.cond.Broadcast()
	}()
	quiet := false
	for {
		if p.dead {
			return 0, errors.New("fake port: gone")
		}
		if len(p.inbuf) > 0 {
			n := copy(b, p.inbuf[0])
			if n == len(p.inbuf[0]) {
				p.inbuf = p.inbuf[1:]
			} else {
				p.inbuf[0] = p.inbuf[0][n:]
			}
			return n, nil
		}
		if p.host == nil && !quiet {
			if p.quietDisc {
				quiet = true // this read sleeps through the disconnect
			} else if p.discErr != nil {
				return 0, p.discErr
			} else {
				return 0, io.EOF
			}
		}
		p.cond.Wait()
	}
}

func (h *fakeHandle) Write(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed {
		return 0, errFakeClosed
	}
	h.io++
	p.writesInFlight++
	defer func() {
		h.io--
		p.writesInFlight--
		h.maybeRelease()
		p.cond.Broadcast()
	}()
	held := false
	for !p.dead && (p.holdWrites || p.host == nil) {
		if p.host == nil && p.writeErrDisc {
			return 0, errors.New("fake port: host disconnected")
		}
		if !held {
			held = true
			p.writesHeld++
			p.cond.Broadcast()
		}
		p.cond.Wait()
	}
	if held {
		p.writesHeld--
	}
	if p.dead {
		return 0, errors.New("fake port: gone")
	}
	p.host.in = append(p.host.in, b...)
	p.cond.Broadcast()
	return len(b), nil
}

// Close releases the port once no read or write is in flight.
func (h *fakeHandle) Close() error {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed {
		return errFakeClosed
	}
	h.closed = true
	h.maybeRelease()
	return nil
}

func (h *fakeHandle) maybeRelease() {
	p := h.p
	if h.closed && h.io == 0 && p.open == h {
		p.open = nil
		for _, c := range p.inbuf {
			p.discarded += len(c)
		}
		p.inbuf = nil
		p.cond.Broadcast()
	}
}

// fakeHost is the node's end: a connection to the chardev socket.
type fakeHost struct {
	p      *fakePort
	in     []byte // what the guest wrote
	closed bool
	glue   []byte // stale bytes sent glued to the host's first write
}

// connect connects a new host whose first write is glued to stale bytes
// (from the previous host, still held by QEMU).
func (p *fakePort) connect(stale []byte) *fakeHost {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := &fakeHost{p: p, glue: stale}
	p.host = h
	p.cond.Broadcast()
	return h
}

func (p *fakePort) deliver(b []byte) {
	b = append([]byte(nil), b...)
	for len(b) > 0 {
		n := len(b)
		if p.chunk > 0 {
			n = min(n, p.chunk)
		}
		if p.open != nil {
			p.inbuf = append(p.inbuf, b[:n])
		} else {
			p.waiting = append(p.waiting, b[:n])
		}
		b = b[n:]
	}
}

func (h *fakeHost) Write(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.closed || p.host != h {
		return 0, errFakeClosed
	}
	n := len(b)
	if h.glue != nil {
		b = append(h.glue, b...)
		h.glue = nil
	}
	p.deliver(b)
	if p.releaseOnData {
		// The new host's first bytes reach the guest before the guest's
		// blocked write completes.
		p.releaseOnData = false
		p.holdWrites = false
	}
	p.cond.Broadcast()
	return n, nil
}

func (h *fakeHost) Read(b []byte) (int, error) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(h.in) == 0 {
		if h.closed || p.dead {
			return 0, io.EOF
		}
		p.cond.Wait()
	}
	n := copy(b, h.in)
	h.in = h.in[n:]
	return n, nil
}

// Close is the node process dying: the guest sees the host disconnect.
func (h *fakeHost) Close() error {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !h.closed {
		h.closed = true
		if p.host == h {
			p.host = nil
		}
		p.cond.Broadcast()
	}
	return nil
}

func (p *fakePort) set(f func(p *fakePort)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
	p.cond.Broadcast()
}

// String is the port's state, for the failure of a wait on it.
func (p *fakePort) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("port open %v, %d opens, reads in flight %d, writes in flight %d (%d held), %d chunks unread, %d bytes discarded",
		p.open != nil, p.opens, p.readsInFlight, p.writesInFlight, p.writesHeld, len(p.inbuf), p.discarded)
}

func (p *fakePort) get(f func(p *fakePort) bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return f(p)
}

// startAgentOnPort runs Serve with the fake port as its channel.
func startAgentOnPort(t *testing.T, port *fakePort) *testenv.Buffer {
	t.Helper()
	logs := &testenv.Buffer{}
	opts := Options{BootID: "test-boot", ReapOrphans: false,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, port.openGuest, opts) }()
	t.Cleanup(func() {
		cancel()
		port.set(func(p *fakePort) { p.dead = true }) // unblock what Close cannot
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return after cancel")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	return logs
}

// dialFake dials like the node's runtime does: the first hello must be
// answered within timeout.
func dialFake(t *testing.T, host *fakeHost, timeout time.Duration) (*guestproto.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := guestproto.Dial(ctx, host)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}
