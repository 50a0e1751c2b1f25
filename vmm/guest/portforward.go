package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// portForwardDialTimeout bounds the connect: the target is inside the
// guest (or one hop away), so a slow connect is a dead one.
const portForwardDialTimeout = 5 * time.Second

// portForward connects to a TCP port and relays the stream to it. The
// Response comes first: an error if the connect failed, else ok and then
// raw bytes both ways until both directions ended.
func (a *agent) portForward(ctx context.Context, ss session, s net.Conn, raw json.RawMessage) {
	defer s.Close()
	var req guestproto.PortForwardRequest
	if err := decodeArgs(raw, &req); err != nil {
		respond(s, nil, err)
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		respond(s, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("port %d out of range 1..65535", req.Port)})
		return
	}
	host := req.Host
	if host == "" {
		host = "127.0.0.1"
	}
	d := net.Dialer{Timeout: portForwardDialTimeout}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(req.Port)))
	if err != nil {
		respond(s, nil, err) // CodeFailed, e.g. "... connection refused"
		return
	}
	tc := c.(*net.TCPConn)
	defer tc.Close()
	if err := respond(s, nil, nil); err != nil {
		return
	}
	ss.log.Debug("port forward connected", "addr", tc.RemoteAddr())
	relay(s, tc, ss.done)
}

// relay copies between the stream and the TCP connection, passing
// half-closes on: the node closing its write half (a FIN, EOF here) shuts
// down the TCP write side; the TCP side's EOF closes the stream (a FIN to
// the node), whose read half stays open. It returns once both directions
// ended, or at once when either side failed or the session ended (a yamux
// stream reads EOF then, and the TCP peer might never close): then both
// are cut, so no copy is left behind.
func relay(s net.Conn, tc *net.TCPConn, sessDone <-chan struct{}) {
	var once sync.Once
	abort := func() {
		once.Do(func() {
			tc.Close()
			s.SetDeadline(time.Unix(1, 0))
		})
	}
	finished := make(chan struct{})
	watchDone := make(chan struct{})
	defer func() {
		close(finished)
		<-watchDone
	}()
	go func() {
		defer close(watchDone)
		select {
		case <-sessDone:
			abort()
		case <-finished:
		}
	}()

	toTCP := make(chan struct{})
	go func() {
		defer close(toTCP)
		if _, err := io.Copy(tc, s); err != nil {
			abort()
			return
		}
		tc.CloseWrite()
	}()
	if _, err := io.Copy(s, tc); err != nil {
		abort()
	}
	s.Close() // FIN: the guest's server sent everything
	<-toTCP
}
