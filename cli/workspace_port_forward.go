package cli

import (
	"context"
	"io"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
)

// WorkspacePortForwardCmd is `workspace port-forward WS LOCAL:REMOTE`.
type WorkspacePortForwardCmd struct {
	ID      string `arg:"" name:"workspace"`
	Ports   string `arg:"" name:"ports" help:"LOCAL:REMOTE, e.g. 8080:80 (LOCAL 0 picks a free port)."`
	Address string `name:"bind" default:"127.0.0.1" help:"Local address to listen on."`
}

func (c *WorkspacePortForwardCmd) Run(g *Globals) error {
	l, r, ok := strings.Cut(c.Ports, ":")
	lp, err1 := strconv.Atoi(l)
	rp, err2 := strconv.Atoi(r)
	if !ok || err1 != nil || err2 != nil || lp < 0 || lp > 65535 || rp <= 0 || rp > 65535 {
		return usagef("port-forward: %q is not LOCAL:REMOTE with ports 1-65535 (LOCAL may be 0)", c.Ports)
	}
	// Ctrl-C (or SIGTERM) is the normal way to stop: close the listener
	// and the data-plane session and exit 0.
	ctx, stop := signal.NotifyContext(g.ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// On return the session closes, then every connection is cut
	// (stopConns) and its relay waited for.
	var conns sync.WaitGroup
	defer conns.Wait()
	ctx, stopConns := context.WithCancel(ctx)
	defer stopConns()
	client, err := g.dataPlane(c.ID)
	if err != nil {
		return err
	}
	defer client.Close()
	ln, err := net.Listen("tcp", net.JoinHostPort(c.Address, strconv.Itoa(lp)))
	if err != nil {
		return api.Errorf(api.CodeFailedPrecondition, "port-forward: listen on %s:%d: %v; choose another local port", c.Address, lp, err)
	}
	defer ln.Close()
	g.note("Forwarding %s -> %s:%d (Ctrl-C to stop)\n", ln.Addr(), c.ID, rp)
	conns.Go(func() {
		select {
		case <-ctx.Done():
		case <-client.Done():
		}
		ln.Close()
	})
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-client.Done():
				return api.Errorf(api.CodeUnavailable, "port-forward to workspace %s: the data-plane session ended; run the command again", c.ID)
			default:
				return nil
			}
		}
		conns.Go(func() {
			defer conn.Close()
			defer context.AfterFunc(ctx, func() { conn.Close() })()
			cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			remote, err := client.PortForward(cctx, "", rp)
			cancel()
			if err != nil {
				g.note("port-forward: connection to %s:%d failed: %v\n", c.ID, rp, err)
				return
			}
			defer remote.Close()
			relay(conn, remote)
		})
	}
}

// relay copies both ways with half-close and returns when both ended.
func relay(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	half := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go half(a, b)
	go half(b, a)
	wg.Wait()
}
