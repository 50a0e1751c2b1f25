package dataplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// handshakeTimeout bounds TLS, the credential frame and the guest protocol
// hello of a new connection.
const handshakeTimeout = 10 * time.Second

// clientConn is one client connection: after the credential, a guest
// protocol session whose streams are relayed to one Instance's guest.
type clientConn struct {
	s   *Server
	raw net.Conn

	// Set by authorize under s.mu.
	workspaceID, instanceID string
	link                    *guestLink

	// guest is the session streams are relayed to: the link's, which
	// changes when a lent one is retired.
	gmu   sync.Mutex
	guest guestSession

	// ctx ends when the connection is killed; killed is its Done.
	ctx      context.Context
	cancel   context.CancelFunc
	killed   <-chan struct{}
	killOnce sync.Once
}

func newClientConn(s *Server, raw net.Conn) *clientConn {
	ctx, cancel := context.WithCancel(s.life)
	return &clientConn{s: s, raw: raw, ctx: ctx, cancel: cancel, killed: ctx.Done()}
}

// kill closes the connection and everything relayed on it.
func (c *clientConn) kill() {
	c.killOnce.Do(func() {
		c.cancel()
		c.raw.Close()
	})
}

// serve runs the connection. It follows c.ctx, not the server's: a
// stopping server lets connections in progress finish their handshake.
func (c *clientConn) serve() {
	defer c.s.untrack(c)
	defer c.kill()
	log := c.s.log.With("remote", c.raw.RemoteAddr().String())
	c.raw.SetDeadline(time.Now().Add(handshakeTimeout))
	tc := tls.Server(c.raw, c.s.tlsConfig())
	if err := tc.HandshakeContext(c.ctx); err != nil {
		log.Info("data-plane TLS handshake failed", "err", err)
		return
	}
	var req connectRequest
	if err := guestproto.ReadFrame(tc, &req); err != nil {
		log.Info("data-plane connection sent no credential", "err", err)
		return
	}
	link, err := c.s.authorize(c, req.Credential)
	if err != nil {
		c.refuse(tc, log, err)
		return
	}
	log = log.With("workspace", c.workspaceID, "instance", c.instanceID)
	// Reaching the guest may take its own timeout on top of the handshake's.
	c.raw.SetDeadline(time.Now().Add(c.s.cfg.GuestTimeout + handshakeTimeout))
	gctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.GuestTimeout)
	guest, err := link.get(gctx)
	cancel()
	if err != nil {
		c.refuse(tc, log, refuse(CodeUnavailable, "%v: retry, or check that the instance is running", err))
		return
	}
	if err := guestproto.WriteFrame(tc, connectReply{OK: true}); err != nil {
		return
	}
	c.setGuest(guest)
	// The client now talks to us as to its guest: same info, the calls we
	// do not relay taken out, and exactly the protocol of our session with
	// the guest, which is what relayed streams speak.
	info := dataInfo(guest.Info())
	br := bufio.NewReaderSize(tc, guestproto.HandshakeBufferSize)
	if _, err := guestproto.AcceptHandshake(br, tc, info, info.Protocol, info.Protocol); err != nil {
		log.Info("data-plane guest protocol handshake failed", "err", err)
		return
	}
	c.raw.SetDeadline(time.Time{})
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.MaxStreamWindowSize = guestproto.HostStreamWindow
	sess, err := yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{br, tc, tc}, cfg)
	if err != nil {
		return
	}
	defer sess.Close()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		c.watch(sess, guest)
	}()
	log.Info("data-plane connection opened")
	var streams sync.WaitGroup
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		streams.Go(func() { c.stream(st) })
	}
	// The kill ends the watch too (it follows c.killed and c.ctx).
	c.kill()
	streams.Wait()
	<-watched
	log.Info("data-plane connection ended")
}

// watch ends the connection with the client's session, with the guest
// session it relays to, and with its target (kill). The end of a lent
// guest session is no end when the link's next session reaches the same
// guest boot: the lent one was given back (retired), or its lender was
// ended by a newer switch, which drops only the streams that ran on it.
func (c *clientConn) watch(sess *yamux.Session, g guestSession) {
	defer func() {
		sess.Close()
		c.kill()
	}()
	for {
		select {
		case <-sess.CloseChan():
			return
		case <-c.killed:
			return
		case <-g.Done():
			if _, lent := g.(*lentSession); !lent {
				return
			}
			ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.GuestTimeout)
			next, err := c.after(ctx, g)
			cancel()
			if err != nil {
				c.s.log.Info("data-plane connection lost its guest with a lent session", "workspace", c.workspaceID, "instance", c.instanceID, "retired", g.retired(), "err", err)
				return
			}
			c.setGuest(next)
			g = next
		}
	}
}

func (c *clientConn) setGuest(g guestSession) {
	c.gmu.Lock()
	c.guest = g
	c.gmu.Unlock()
}

// session is the guest session a new stream goes to: the link's next one
// once a lent one ended, if it reaches the same guest boot (the
// connection's watch ends the connection otherwise).
func (c *clientConn) session(ctx context.Context) (guestSession, error) {
	c.gmu.Lock()
	g := c.guest
	c.gmu.Unlock()
	if _, lent := g.(*lentSession); lent {
		select {
		case <-g.Done():
			return c.after(ctx, g)
		default:
		}
	}
	return g, nil
}

// after is the link's session that follows the ended lent session g, if
// it reaches the same guest boot.
func (c *clientConn) after(ctx context.Context, g guestSession) (guestSession, error) {
	next, err := c.link.get(ctx)
	if err == nil && next.Info().BootID != g.Info().BootID {
		err = fmt.Errorf("the guest restarted (boot %s, now %s)", g.Info().BootID, next.Info().BootID)
	}
	return next, err
}

// open opens a stream to the guest for req, on the link's next session
// when a lent one was retired or lost its lender meanwhile (its Done is
// closed by then, so a second try finds the next one).
func (c *clientConn) open(ctx context.Context, req guestproto.Request) (net.Conn, func(), error) {
	g, err := c.session(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, release, err := g.open(ctx, req)
	if movedOn(err) {
		if g, err = c.session(ctx); err != nil {
			return nil, nil, err
		}
		st, release, err = g.open(ctx, req)
	}
	return st, release, err
}

// refuse answers a refused connection with its code and message.
func (c *clientConn) refuse(w io.Writer, log interface{ Info(string, ...any) }, err error) {
	r, ok := err.(*refusal)
	if !ok {
		r = refuse(CodeUnavailable, "%v", err)
	}
	if n := c.s.refused[r.code]; n != nil {
		n.Add(1)
	}
	log.Info("data-plane connection refused", "code", r.code, "reason", r.msg)
	guestproto.WriteFrame(w, connectReply{Code: r.code, Message: r.msg})
}

// relayed are the calls a client may make through the data plane. The
// others (configure, sync, freeze, thaw, stop) act on the guest as a whole
// and stay with the node.
var relayed = guestproto.DataCalls

// dataInfo is the guest's info without the capabilities of calls the data
// plane does not relay.
func dataInfo(info guestproto.GuestInfo) guestproto.GuestInfo {
	info.Capabilities = slices.DeleteFunc(slices.Clone(info.Capabilities), func(c string) bool {
		return c == guestproto.CapConfigure || c == guestproto.CapFreeze || c == guestproto.CapStop
	})
	return info
}

// stream serves one client stream: one call, relayed to the guest.
func (c *clientConn) stream(st net.Conn) {
	st.SetReadDeadline(time.Now().Add(30 * time.Second))
	var req guestproto.Request
	if err := guestproto.ReadFrame(st, &req); err != nil {
		st.Close()
		return
	}
	st.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	if !slices.Contains(relayed, req.Call) {
		respondError(st, &guestproto.Error{Code: guestproto.CodeUnsupported,
			Message: fmt.Sprintf("the data plane does not relay %q: only %v (the node does the rest)", req.Call, relayed)})
		return
	}
	if req.Call == guestproto.CallGuestInfo {
		info, err := guestInfo(ctx, c.open)
		if err != nil {
			respondError(st, err)
			return
		}
		writeResult(st, dataInfo(info))
		return
	}
	gs, release, err := c.open(ctx, req)
	if err != nil {
		respondError(st, err)
		return
	}
	defer release()
	relay(st, gs, c.killed, &c.s.bytesIn, &c.s.bytesOut)
}

func respondError(st net.Conn, err error) {
	defer st.Close()
	var ge *guestproto.Error
	if !errors.As(err, &ge) {
		ge = &guestproto.Error{Code: guestproto.CodeFailed, Message: err.Error()}
	}
	guestproto.WriteFrame(st, guestproto.Response{Error: ge})
}

func writeResult(st net.Conn, v any) {
	defer st.Close()
	b, err := json.Marshal(v)
	if err != nil {
		respondError(st, err)
		return
	}
	guestproto.WriteFrame(st, guestproto.Response{Result: b})
}
