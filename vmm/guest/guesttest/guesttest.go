// Package guesttest runs a guest agent in a test's process, for tests of
// what talks to guests (the sandbox API, its session cache) without a VM.
package guesttest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guest"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Dialer runs a guest agent until t ends and returns a dial of it: each
// call opens a new session over a new channel. The agent runs as the
// test's process: its port-forward reaches this host's loopback.
func Dialer(t testing.TB) func(context.Context) (*guestproto.Client, error) {
	ports := make(chan io.ReadWriteCloser, 4)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	open := func(ctx context.Context) (io.ReadWriteCloser, error) {
		select {
		case c := <-ports:
			return c, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	wg.Go(func() {
		guest.ServeChannels(ctx, guest.Options{BootID: "test", Logger: slog.New(slog.DiscardHandler)}, open, nil)
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return func(ctx context.Context) (*guestproto.Client, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		conn := func(fd int) (net.Conn, error) {
			f := os.NewFile(uintptr(fd), "socketpair")
			defer f.Close()
			return net.FileConn(f)
		}
		host, err := conn(fds[0])
		if err != nil {
			unix.Close(fds[1])
			return nil, err
		}
		g, err := conn(fds[1])
		if err != nil {
			host.Close()
			return nil, err
		}
		t.Cleanup(func() { host.Close(); g.Close() })
		ports <- g
		return guestproto.Dial(ctx, host)
	}
}
