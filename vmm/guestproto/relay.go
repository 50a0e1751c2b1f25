package guestproto

import (
	"context"
	"fmt"
	"net"
	"time"
)

// OpenRaw opens a stream, sends req as its first frame and hands the stream
// over as is: the caller speaks the rest of the call (a relay such as the
// data-plane process copies it from another session unchanged). ctx bounds
// the open only. Close is a half-close (FIN); the peer can still send.
func (c *Client) OpenRaw(ctx context.Context, req Request) (net.Conn, error) {
	s, err := c.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("guest agent: %s: open stream: %w", req.Call, err)
	}
	stop := context.AfterFunc(ctx, func() { s.SetDeadline(time.Unix(1, 0)) })
	err = WriteFrame(s, req)
	if !stop() {
		s.Close()
		return nil, c.streamErr(ctx, req.Call, context.Cause(ctx))
	}
	if err != nil {
		s.Close()
		return nil, c.streamErr(ctx, req.Call, err)
	}
	return s, nil
}
