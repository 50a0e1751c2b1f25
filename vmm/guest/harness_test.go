package guest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// harness runs the agent in-process on both channels. Each channel behaves
// like a QEMU socket chardev: each host connection is a fresh socketpair
// handed to the agent's next open of that channel. Until a test plugs the
// data channel, its open waits, like a guest whose host has no data port.
type harness struct {
	t         *testing.T
	ports     chan io.ReadWriteCloser // the node channel
	dataPorts chan io.ReadWriteCloser // the data-plane channel
	done      chan error
	logs      *testenv.Buffer
}

func startAgent(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, ports: make(chan io.ReadWriteCloser, 4), dataPorts: make(chan io.ReadWriteCloser, 4),
		done: make(chan error, 1), logs: &testenv.Buffer{}}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.BootID == "" {
		opts.BootID = "test-boot"
	}
	ctx, cancel := context.WithCancel(context.Background())
	opener := func(ports chan io.ReadWriteCloser) Opener {
		return func(ctx context.Context) (io.ReadWriteCloser, error) {
			select {
			case c := <-ports:
				return c, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	go func() { h.done <- ServeChannels(ctx, opts, opener(h.ports), opener(h.dataPorts)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return after cancel")
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", h.logs.String())
		}
	})
	return h
}

// plug connects a new host socket to the agent and returns the host end.
// staleToHost is written by the guest end first, like bytes the guest wrote
// while no node was connected.
func (h *harness) plug(staleToHost ...[]byte) net.Conn {
	h.t.Helper()
	return h.plugInto(h.ports, staleToHost...)
}

// plugData is plug for the data-plane channel.
func (h *harness) plugData() net.Conn {
	h.t.Helper()
	return h.plugInto(h.dataPorts)
}

func (h *harness) plugInto(ports chan io.ReadWriteCloser, staleToHost ...[]byte) net.Conn {
	h.t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			h.t.Fatal(err)
		}
		return c
	}
	host, guest := conn(fds[0]), conn(fds[1])
	h.t.Cleanup(func() { host.Close(); guest.Close() })
	for _, b := range staleToHost {
		guest.Write(b)
	}
	ports <- guest
	return host
}

func (h *harness) dial() *guestproto.Client {
	h.t.Helper()
	return h.dialOn(h.plug())
}

func (h *harness) dialOn(conn net.Conn) *guestproto.Client {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := guestproto.Dial(ctx, conn)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// collect reads r into a buffer in the background.
func collect(r io.Reader) (*testenv.Buffer, <-chan struct{}) {
	b := &testenv.Buffer{}
	done := make(chan struct{})
	go func() {
		io.Copy(b, r)
		close(done)
	}()
	return b, done
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}
