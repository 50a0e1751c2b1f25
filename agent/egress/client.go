package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/fdpass"
)

// Client is the node's connection to one egress process's control socket.
// Calls are serialized; the process serves one Client at a time.
type Client struct {
	// Hello is what the process said when the Client connected.
	Hello Hello

	socket string
	mu     sync.Mutex
	l      *link
	broken bool // the connection is closed: every later call fails
}

// Dial connects to the control socket at socketPath (ControlSocket) and
// checks that the process speaks this protocol.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("egress: control socket %s: %w", socketPath, err)
	}
	cl := &Client{socket: socketPath, l: newLink(c.(*net.UnixConn))}
	rep, _, err := cl.call(ctx, request{Op: opHello})
	if err == nil && rep.Hello == nil {
		err = errors.New("hello without one")
	}
	if err == nil && rep.Hello.Protocol != ProtocolVersion {
		err = fmt.Errorf("the process speaks control protocol %d, this node %d", rep.Hello.Protocol, ProtocolVersion)
	}
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("egress: control socket %s: %w", socketPath, err)
	}
	cl.Hello = *rep.Hello
	return cl, nil
}

// Close ends the connection; the process keeps running.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.l.close()
	c.broken = true
	return nil
}

// Broken reports that the connection is gone (closed, or a call was cut
// short): the process may be fine, and Dial would reach it again.
func (c *Client) Broken() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// SendListeners hands over the node's sockets (ListenSockets). The
// process keeps its own copies: the caller closes its files afterwards. A
// process takes them once.
func (c *Client) SendListeners(ctx context.Context, socks Sockets) error {
	fds := make([]int, 0, listenerFDsCount)
	for _, f := range socks.files() {
		if f == nil {
			return errors.New("egress: send listeners: need the TCP listener and both DNS sockets")
		}
		fd, err := fdpass.FileFD(f)
		if err != nil {
			return fmt.Errorf("egress: send listeners: %s: %w", f.Name(), err)
		}
		fds = append(fds, fd)
	}
	_, _, err := c.call(ctx, request{Op: opListeners}, fds...)
	runtime.KeepAlive(socks)
	return c.wrap("send listeners", err)
}

// Listeners gets copies of the process's sockets, to hand to a newer
// generation before this one drains. The caller closes them. A process of
// an older build has no DNS TCP listener: DNSTCP is nil then.
func (c *Client) Listeners(ctx context.Context) (Sockets, error) {
	_, fds, err := c.call(ctx, request{Op: opTakeListeners})
	if err == nil && len(fds) != listenerFDsCount && len(fds) != oldListenerFDs {
		fdpass.Close(fds)
		err = fmt.Errorf("the reply carried %d descriptors, want %d", len(fds), listenerFDsCount)
	}
	if err != nil {
		return Sockets{}, c.wrap("take listeners", err)
	}
	socks := Sockets{TCP: os.NewFile(uintptr(fds[0]), "egress-tcp-listener"), DNS: os.NewFile(uintptr(fds[1]), "egress-dns-socket")}
	if len(fds) == listenerFDsCount {
		socks.DNSTCP = os.NewFile(uintptr(fds[2]), "egress-dns-tcp-listener")
	}
	return socks, nil
}

// SetConfig replaces the process's routes and resolvers whole; it returns
// once they apply to new connections and queries.
func (c *Client) SetConfig(ctx context.Context, cfg Config) error {
	if cfg.Routes == nil {
		cfg.Routes = []Route{}
	}
	if cfg.Resolvers == nil {
		cfg.Resolvers = []string{}
	}
	_, _, err := c.call(ctx, request{Op: opConfig, Config: &cfg})
	return c.wrap("set config", err)
}

// Drain makes the process stop accepting and reading, drop its
// credentials, and close what is still open at deadline; it exits once
// everything ended. Draining again moves the deadline.
func (c *Client) Drain(ctx context.Context, deadline time.Time) error {
	_, _, err := c.call(ctx, request{Op: opDrain, Deadline: &deadline})
	return c.wrap("drain", err)
}

// Stats returns the process's state and counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	rep, _, err := c.call(ctx, request{Op: opStats})
	if err == nil && rep.Stats == nil {
		err = errors.New("stats reply without stats")
	}
	if err != nil {
		return Stats{}, c.wrap("stats", err)
	}
	return *rep.Stats, nil
}

func (c *Client) wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("egress: %s on %s: %w", what, c.socket, err)
}

// call sends one request and reads its reply with the descriptors that
// came with it. ctx bounds both.
func (c *Client) call(ctx context.Context, req request, fds ...int) (reply, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { c.l.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		c.l.c.SetDeadline(dl)
		defer c.l.c.SetDeadline(time.Time{})
	}
	// A call cut short leaves half a frame on the stream: the connection
	// is closed then, and later calls fail until the node dials again.
	if c.broken {
		return reply{}, nil, errors.New("the control connection is closed")
	}
	if err := c.l.writeFrame(req, fds...); err != nil {
		c.l.close()
		c.broken = true
		return reply{}, nil, ctxErr(ctx, err)
	}
	var rep reply
	if err := c.l.readFrame(&rep); err != nil {
		c.l.close()
		c.broken = true
		return reply{}, nil, ctxErr(ctx, err)
	}
	got := c.l.takeFDs()
	if rep.Error != "" {
		fdpass.Close(got)
		return rep, nil, errors.New(rep.Error)
	}
	return rep, got, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}
