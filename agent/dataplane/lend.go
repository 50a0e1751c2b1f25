package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Lending guest sessions across a hand-over.
//
// A VMM serves an Instance's data socket to one client at a time. While a
// draining generation still has connections to an Instance, it holds that
// socket, and its successor could not reach the guest: new connections
// would wait for the old ones to end. So the successor borrows: it asks
// the draining generation's control socket to lend the Instance's session,
// and the connection becomes a yamux session whose streams the lender
// relays unchanged to its own guest session.
//
// The successor gives the lent session back, and the lender lets go of the
// data socket, without racing each other: the lender says once, on a watch
// stream, that its own connections to the Instance ended; the successor
// retires the lent session at the first moment after that when none of its
// streams runs on it (it alone opens streams, so none can be in flight),
// and dials the socket itself, which the lender then closes. A stream never
// waits and a connection is never refused; a lender whose successor keeps
// streams running on a lent session without pause stays until a pause.

// Why a lender does not lend.
const (
	// codeNotHeld: the lender lets go of the Instance's data socket (its
	// own connections to it ended, or it is ending): dial the socket.
	codeNotHeld = "not_held"
	// codeBusy: the lender has no session of the Instance this moment but
	// may need one for its own connections (it is dialling, or still
	// serving): ask again shortly, and leave the socket to it.
	codeBusy = "busy"
)

// callWatch opens the watch stream of a lent session. It is no guest call:
// the lender answers it itself, with one byte once its own connections to
// the Instance ended.
const callWatch = "kibotos.dataplane.watch"

// lendSession is a session this process lends (the lender's side).
type lendSession struct {
	instanceID string
	gone       chan struct{} // closed when the lender's own connections ended
	goneOnce   sync.Once

	mu     sync.Mutex
	sess   *yamux.Session
	killed bool
}

func (ls *lendSession) ownerGone() { ls.goneOnce.Do(func() { close(ls.gone) }) }

func (ls *lendSession) kill() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.killed = true
	if ls.sess != nil {
		ls.sess.Close()
	}
}

// lend serves a lend request on cc, which it owns: the Instance's live
// session is lent if this process holds one and (draining) its own
// connections still use it.
func (s *Server) lend(cc *ctlConn, instanceID string) {
	defer cc.close()
	s.mu.Lock()
	var guest *guestproto.Client
	if l := s.links[instanceID]; l != nil {
		guest = l.current()
	}
	bound, unbound := s.connsOf(instanceID)
	switch {
	case s.stopping || s.ended || (s.draining && bound+unbound == 0):
		s.mu.Unlock()
		cc.write(controlReply{Code: codeNotHeld, Error: fmt.Sprintf("dataplane: generation %d is letting go of instance %s: dial its data socket", s.cfg.Generation, instanceID)})
		return
	case guest != nil:
		// Lent, also while connections that may still name this Instance
		// are in their handshake: the session stays until they did.
	case s.draining && bound == 0:
		// No session, and only connections in their handshake that might
		// want one: they must not hold up the successor.
		s.mu.Unlock()
		cc.write(controlReply{Code: codeNotHeld, Error: fmt.Sprintf("dataplane: generation %d holds no session of instance %s: dial its data socket", s.cfg.Generation, instanceID)})
		return
	default:
		s.mu.Unlock()
		cc.write(controlReply{Code: codeBusy, Error: fmt.Sprintf("dataplane: generation %d has no session of instance %s this moment but may need one: ask again", s.cfg.Generation, instanceID)})
		return
	}
	ls := &lendSession{instanceID: instanceID, gone: make(chan struct{})}
	s.lends[ls] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lends, ls)
		s.settleLocked()
		s.mu.Unlock()
		s.signalGone()
	}()

	info := guest.Info()
	if err := cc.write(controlReply{Lend: &info}); err != nil {
		return
	}
	// The borrower speaks yamux only after it read the reply, so what the
	// line reader holds beyond the request is nothing.
	sess, err := yamux.Server(rwc{cc.br, cc.c}, sessionConfig())
	if err != nil {
		return
	}
	ls.mu.Lock()
	ls.sess = sess
	if ls.killed {
		sess.Close()
	}
	ls.mu.Unlock()
	s.mu.Lock()
	s.settleLocked() // the watch may be due at once
	s.mu.Unlock()
	log := s.log.With("instance", instanceID)
	log.Info("data-plane guest session lent to the next generation")
	// The lent session ends with the guest session it relays to.
	guestWatched := make(chan struct{})
	go func() {
		defer close(guestWatched)
		select {
		case <-guest.Done():
		case <-sess.CloseChan():
		}
		sess.Close()
	}()
	var streams sync.WaitGroup
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		streams.Go(func() { s.lentStream(ls, sess, st, guest) })
	}
	sess.Close()
	<-guestWatched
	streams.Wait()
	log.Info("data-plane guest session given back")
}

// lentStream relays one stream of a lent session. Its bytes are not
// counted here: the borrower counts them for its client.
func (s *Server) lentStream(ls *lendSession, sess *yamux.Session, st net.Conn, guest *guestproto.Client) {
	st.SetReadDeadline(time.Now().Add(30 * time.Second))
	var req guestproto.Request
	if err := guestproto.ReadFrame(st, &req); err != nil {
		st.Close()
		return
	}
	st.SetReadDeadline(time.Time{})
	if req.Call == callWatch {
		select {
		case <-ls.gone:
			st.Write([]byte{1})
		case <-sess.CloseChan():
		}
		st.Close()
		return
	}
	if !slices.Contains(relayed, req.Call) {
		respondError(st, &guestproto.Error{Code: guestproto.CodeUnsupported, Message: fmt.Sprintf("the data plane does not relay %q", req.Call)})
		return
	}
	ctx, cancel := context.WithTimeout(s.life, 30*time.Second)
	gs, err := guest.OpenRaw(ctx, req)
	cancel()
	if err != nil {
		respondError(st, err)
		return
	}
	var in, out atomic.Uint64
	relay(st, gs, sess.CloseChan(), &in, &out)
}

// lender is the borrower's handle on the draining generation.
type lender struct {
	socketDir string
	gen       uint64
	log       *slog.Logger
	// owner waits for the goroutines of the sessions borrowed (the
	// Server's borrowed): each ends once its session is closed.
	owner *sync.WaitGroup
}

// borrow asks the lender for instanceID's session.
func (ld *lender) borrow(ctx context.Context, instanceID string) (*lentSession, error) {
	socket := ControlSocket(ld.socketDir, ld.gen)
	cc, stop, err := dialControl(ctx, socket)
	if err != nil {
		return nil, err // gone: it drained and exited
	}
	fail := func(err error) (*lentSession, error) {
		stop()
		cc.close()
		return nil, err
	}
	if err := cc.write(controlRequest{Op: opLend, InstanceID: instanceID}); err != nil {
		return fail(ctxErr(ctx, err))
	}
	var rep controlReply
	if err := cc.read(&rep); err != nil {
		return fail(ctxErr(ctx, err))
	}
	if rep.Error != "" || rep.Lend == nil {
		return fail(&controlError{code: rep.Code, msg: rep.Error})
	}
	if !stop() { // the session outlives ctx, which bounded only the request
		return fail(context.Cause(ctx))
	}
	sess, err := yamux.Client(rwc{cc.br, cc.c}, sessionConfig())
	if err != nil {
		cc.close()
		return nil, err
	}
	ls := &lentSession{sess: sess, info: *rep.Lend, done: make(chan struct{}), owner: ld.owner}
	ld.owner.Go(func() {
		<-sess.CloseChan()
		ls.finish()
	})
	watch, err := sess.OpenStream()
	if err == nil {
		err = guestproto.WriteFrame(watch, guestproto.Request{Call: callWatch})
	}
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("dataplane: borrow instance %s from generation %d: watch: %w", instanceID, ld.gen, err)
	}
	// The watch stream ends with the session at the latest.
	ld.owner.Go(func() {
		var b [1]byte
		if n, _ := watch.Read(b[:]); n == 1 {
			ls.markOwnerGone()
		}
		watch.Close()
	})
	ld.log.Info("data-plane guest session borrowed from the previous generation", "instance", instanceID, "lender", ld.gen)
	return ls, nil
}

// lentSession is a session borrowed from the draining generation (the
// borrower's side).
type lentSession struct {
	sess *yamux.Session
	info guestproto.GuestInfo

	// done closes when the session ended, or was retired: then at once,
	// so the link and the connections move on before yamux closed.
	done     chan struct{}
	doneOnce sync.Once

	// owner waits for the session's goroutines (lender.owner).
	owner *sync.WaitGroup

	mu        sync.Mutex
	inflight  int
	ownerGone bool
	isRetired bool
}

func (ls *lentSession) Info() guestproto.GuestInfo { return ls.info }
func (ls *lentSession) Done() <-chan struct{}      { return ls.done }
func (ls *lentSession) close()                     { ls.sess.Close() }
func (ls *lentSession) finish()                    { ls.doneOnce.Do(func() { close(ls.done) }) }

func (ls *lentSession) retired() bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.isRetired
}

func (ls *lentSession) open(ctx context.Context, req guestproto.Request) (net.Conn, func(), error) {
	ls.mu.Lock()
	if ls.isRetired {
		ls.mu.Unlock()
		return nil, nil, errRetired
	}
	ls.inflight++
	ls.mu.Unlock()
	release := sync.OnceFunc(func() {
		ls.mu.Lock()
		ls.inflight--
		ls.maybeRetire()
		ls.mu.Unlock()
	})
	st, err := ls.sess.OpenStream()
	if err != nil {
		release()
		if ls.sess.IsClosed() {
			// The lender ended (a newer switch ended it) before the
			// watcher of CloseChan closed done: say so now, so the
			// caller moves on to the link's next session.
			ls.finish()
			return nil, nil, fmt.Errorf("guest agent (lent session): %s: %w", req.Call, errLentEnded)
		}
		return nil, nil, fmt.Errorf("guest agent (lent session): %s: open stream: %w", req.Call, err)
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	err = guestproto.WriteFrame(st, req)
	if !stop() {
		err = context.Cause(ctx)
	}
	if err != nil {
		st.Close()
		release()
		return nil, nil, fmt.Errorf("guest agent (lent session): %s: %w", req.Call, err)
	}
	return st, release, nil
}

func (ls *lentSession) markOwnerGone() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.ownerGone = true
	ls.maybeRetire()
}

// maybeRetire gives the session back once the lender's connections ended
// and no stream runs on it (mu held). Done follows: a client connection
// on it moves to the link's next session, which is direct.
func (ls *lentSession) maybeRetire() {
	if ls.ownerGone && ls.inflight == 0 && !ls.isRetired {
		ls.isRetired = true
		ls.finish()
		// Not under mu, and not in the way of the caller: Done is
		// what the link and the connections follow.
		ls.owner.Go(func() { ls.sess.Close() })
	}
}

// sessionConfig is the yamux configuration of lent sessions, as of the
// client sessions (8 MiB windows: a lent stream carries file copies too).
func sessionConfig() *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.MaxStreamWindowSize = guestproto.HostStreamWindow
	return cfg
}

// rwc reads through the line reader (which may hold bytes already) and
// writes and closes the connection.
type rwc struct {
	r io.Reader
	c net.Conn
}

func (x rwc) Read(p []byte) (int, error)  { return x.r.Read(p) }
func (x rwc) Write(p []byte) (int, error) { return x.c.Write(p) }
func (x rwc) Close() error                { return x.c.Close() }

// guestInfo answers a guest-info call on g.
func guestInfo(ctx context.Context, open opener) (guestproto.GuestInfo, error) {
	st, release, err := open(ctx, guestproto.Request{Call: guestproto.CallGuestInfo})
	if err != nil {
		return guestproto.GuestInfo{}, err
	}
	defer release()
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var resp guestproto.Response
	if err := guestproto.ReadFrame(st, &resp); err != nil {
		return guestproto.GuestInfo{}, fmt.Errorf("guest agent: %s: %w", guestproto.CallGuestInfo, err)
	}
	if resp.Error != nil {
		return guestproto.GuestInfo{}, resp.Error
	}
	var info guestproto.GuestInfo
	if err := json.Unmarshal(resp.Result, &info); err != nil {
		return info, fmt.Errorf("guest agent: %s: decode result: %w", guestproto.CallGuestInfo, err)
	}
	return info, nil
}
