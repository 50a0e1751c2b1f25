package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// guestSession is what a client connection relays to: a session with the
// guest agent of its Instance, either this process's own (direct) or one
// the previous generation lends while its own connections still hold the
// Instance's data channel (lentSession).
type guestSession interface {
	Info() guestproto.GuestInfo
	// Done is closed when the session ended.
	Done() <-chan struct{}
	// open opens a stream for req; release is called when the relay on
	// it ended.
	open(ctx context.Context, req guestproto.Request) (st net.Conn, release func(), err error)
	// retired: the session ended because the link moves on to a direct
	// one, not because the guest or the lender went away.
	retired() bool
	close()
}

// directSession is this process's own session with a guest agent.
type directSession struct{ *guestproto.Client }

func (d directSession) open(ctx context.Context, req guestproto.Request) (net.Conn, func(), error) {
	st, err := d.OpenRaw(ctx, req)
	return st, func() {}, err
}

func (directSession) retired() bool { return false }
func (d directSession) close()      { d.Close() }

// errRetired: a lent session moved on; the link has (or dials) the
// direct one.
var errRetired = errors.New("the lent guest session was retired")

// errLentEnded: a lent session ended with its lender; the link dials its
// next session, which may reach the same guest boot.
var errLentEnded = errors.New("the lent guest session ended with its lender")

// movedOn: err says a lent session is over and a stream may be opened
// again on the link's next session.
func movedOn(err error) bool { return errors.Is(err, errRetired) || errors.Is(err, errLentEnded) }

// opener opens a stream to the guest for req.
type opener func(ctx context.Context, req guestproto.Request) (st net.Conn, release func(), err error)

// guestLink is the one guest agent session of an Instance's data socket.
// The VMM serves that socket to one client at a time, so every client
// connection to the Instance shares this session. It is dialled when a
// connection first needs it and again (with backoff) after it ended.
type guestLink struct {
	instanceID string
	socket     string
	log        *slog.Logger
	// lender is the draining generation to borrow the session from while
	// it holds the data socket; nil when there is none (any more).
	lender *lender
	// gone ends dials in progress when the target goes away.
	gone     context.Context
	markGone context.CancelFunc

	mu      sync.Mutex // held while dialling: one dial at a time
	client  guestSession
	closed  bool
	backoff time.Duration
	lastErr error
	lastTry time.Time

	curMu sync.Mutex
	cur   *guestproto.Client // the live direct session, for lending

	// claimed is the guest boot the node configured (Target.GuestBoot),
	// "" for any; reclaimed is closed when it changes.
	claimMu   sync.Mutex
	claimed   string
	reclaimed chan struct{}
}

// Backoff of redials after a failed dial.
const (
	minRedial = 50 * time.Millisecond
	maxRedial = 2 * time.Second
)

// How long a dial waits for the answer to a hello before it sends another
// on the same connection. A hello can be lost without trace: a guest
// agent that closes its port (it does so while no host is connected,
// e.g. right after a boot or a restore) drops what the port had
// buffered, so the first wait is short; it doubles up to lastAttempt for
// a guest that is merely slow (a restored TCG guest answers in 0.1-0.5 s
// here). The connection is kept: the guest may see a closed one's end
// only after the next one's hello and end the session it began on it
// (guestproto.DialOptions.Resend), which failed an exec after 25 s.
const (
	firstAttempt = time.Second
	lastAttempt  = 5 * time.Second
)

func (s *Server) newLink(instanceID, socket, boot string) *guestLink {
	gone, markGone := context.WithCancel(s.life)
	l := &guestLink{instanceID: instanceID, socket: socket, gone: gone, markGone: markGone, log: s.log,
		claimed: boot, reclaimed: make(chan struct{})}
	if s.cfg.Predecessor != 0 {
		l.lender = &lender{socketDir: s.cfg.SocketDir, gen: s.cfg.Predecessor, log: s.log, owner: &s.borrowed}
	}
	return l
}

// claim sets the guest boot the node configured.
func (l *guestLink) claim(boot string) {
	l.claimMu.Lock()
	defer l.claimMu.Unlock()
	if boot != l.claimed {
		l.claimed = boot
		close(l.reclaimed)
		l.reclaimed = make(chan struct{})
	}
}

// claimedBoot is the boot the node configured and a channel closed when
// that changes.
func (l *guestLink) claimedBoot() (string, <-chan struct{}) {
	l.claimMu.Lock()
	defer l.claimMu.Unlock()
	return l.claimed, l.reclaimed
}

// get returns a live session of the guest boot the node configured,
// dialling until ctx ends if there is none. A session of a guest that
// restarted waits for the node to reconfigure it (and say so).
func (l *guestLink) get(ctx context.Context) (guestSession, error) {
	for {
		g, err := l.session(ctx)
		if err != nil {
			return nil, err
		}
		claimed, reclaimed := l.claimedBoot()
		boot := g.Info().BootID
		if claimed == "" || boot == claimed {
			return g, nil
		}
		select {
		case <-reclaimed:
		case <-g.Done():
		case <-ctx.Done():
			return nil, fmt.Errorf("the guest of instance %s restarted (boot %s) and its node has not reconfigured it yet: retry in a few seconds", l.instanceID, boot)
		}
	}
}

// session returns a live session, dialling until ctx ends if there is none.
func (l *guestLink) session(ctx context.Context) (guestSession, error) {
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
				l.setClient(nil)
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
			l.setClient(c)
			l.backoff, l.lastErr = 0, nil
			return c, nil
		}
		l.lastErr = err
		l.backoff = min(max(2*l.backoff, minRedial), maxRedial)
		l.log.Info("guest session dial failed", "instance", l.instanceID, "err", err, "redial_in", l.backoff)
		if ctx.Err() != nil {
			return nil, l.unreachable(ctx)
		}
	}
}

// setClient replaces the session (l.mu held).
func (l *guestLink) setClient(c guestSession) {
	l.client = c
	d, _ := c.(directSession)
	l.curMu.Lock()
	l.cur = d.Client
	l.curMu.Unlock()
}

// current is the live direct session, or nil; it does not wait for a
// dial in progress.
func (l *guestLink) current() *guestproto.Client {
	l.curMu.Lock()
	defer l.curMu.Unlock()
	if l.cur == nil {
		return nil
	}
	select {
	case <-l.cur.Done():
		return nil
	default:
		return l.cur
	}
}

func (l *guestLink) unreachable(ctx context.Context) error {
	if l.lastErr != nil {
		return fmt.Errorf("guest agent of instance %s does not answer on %s: %v", l.instanceID, l.socket, l.lastErr)
	}
	return fmt.Errorf("guest agent of instance %s: %w", l.instanceID, context.Cause(ctx))
}

// dial borrows the previous generation's session while that one needs the
// data socket, and otherwise connects to the socket. A lender that is gone
// (it drained and exited), or that lets go of the socket, is not asked
// again: a draining lender never takes the socket back. A lender that is
// busy (it may need the socket but has no session this moment) is asked
// again, and the socket left to it. The connection to the socket waits
// for the guest's answer until ctx ends, sending its hello again: one
// whose other client has not let go yet is served once that one has.
func (l *guestLink) dial(ctx context.Context) (guestSession, error) {
	// A busy lender is asked for one attempt's time, then the link backs
	// off and asks again.
	actx, cancel := context.WithTimeout(ctx, firstAttempt)
	defer cancel()
	for l.lender != nil {
		ls, err := l.lender.borrow(actx, l.instanceID)
		if err == nil {
			return ls, nil
		}
		var ce *controlError
		if !errors.As(err, &ce) || ce.code != codeBusy {
			l.lender = nil
			break
		}
		if err := ctxsleep.Sleep(actx, lenderRetry); err != nil {
			return nil, ce
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", l.socket)
	if err != nil {
		return nil, err
	}
	c, err := guestproto.DialWith(ctx, conn, guestproto.DialOptions{Resend: firstAttempt, ResendMax: lastAttempt})
	if err != nil {
		return nil, err
	}
	return directSession{c}, nil
}

// lenderRetry is how often a busy lender is asked again.
const lenderRetry = 20 * time.Millisecond

// close ends the session for good (the target went away).
func (l *guestLink) close() {
	l.markGone()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.client != nil {
		l.client.close()
		l.setClient(nil)
	}
}
