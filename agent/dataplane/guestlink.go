package dataplane

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// guestLink is the one guest agent session of an Instance's data socket.
// The VMM serves that socket to one client at a time, so every client
// connection to the Instance shares this session. It is dialled when a
// connection first needs it and again (with backoff) after it ended.
type guestLink struct {
	instanceID string
	socket     string
	// gone ends dials in progress when the target goes away.
	gone     context.Context
	markGone context.CancelFunc

	mu      sync.Mutex // held while dialling: one dial at a time
	client  *guestproto.Client
	closed  bool
	backoff time.Duration
	lastErr error
	lastTry time.Time
}

// Backoff of redials after a failed dial.
const (
	minRedial = 50 * time.Millisecond
	maxRedial = 2 * time.Second
)

func newGuestLink(instanceID, socket string) *guestLink {
	gone, markGone := context.WithCancel(context.Background())
	return &guestLink{instanceID: instanceID, socket: socket, gone: gone, markGone: markGone}
}

// get returns a live session, dialling until ctx ends if there is none.
func (l *guestLink) get(ctx context.Context) (*guestproto.Client, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.gone, cancel)()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.closed || l.gone.Err() != nil {
			return nil, fmt.Errorf("instance %s is no longer a target of this node", l.instanceID)
		}
		if l.client != nil {
			select {
			case <-l.client.Done():
				l.client = nil
			default:
				return l.client, nil
			}
		}
		// Wait out the backoff of the last failure, then try once more.
		if wait := time.Until(l.lastTry.Add(l.backoff)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, l.unreachable(ctx)
			case <-t.C:
			}
		}
		l.lastTry = time.Now()
		c, err := l.dial(ctx)
		if err == nil {
			l.client, l.backoff, l.lastErr = c, 0, nil
			return c, nil
		}
		l.lastErr = err
		l.backoff = min(max(2*l.backoff, minRedial), maxRedial)
		if ctx.Err() != nil {
			return nil, l.unreachable(ctx)
		}
	}
}

func (l *guestLink) unreachable(ctx context.Context) error {
	if l.lastErr != nil {
		return fmt.Errorf("guest agent of instance %s does not answer on %s: %v", l.instanceID, l.socket, l.lastErr)
	}
	return fmt.Errorf("guest agent of instance %s: %w", l.instanceID, context.Cause(ctx))
}

func (l *guestLink) dial(ctx context.Context) (*guestproto.Client, error) {
	// One attempt never takes all of ctx: a socket whose other client has
	// not let go yet is retried.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(actx, "unix", l.socket)
	if err != nil {
		return nil, err
	}
	c, err := guestproto.Dial(actx, conn)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// close ends the session for good (the target went away).
func (l *guestLink) close() {
	l.markGone()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.client != nil {
		l.client.Close()
		l.client = nil
	}
}
