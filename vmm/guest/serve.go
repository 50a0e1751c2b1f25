package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// Options configure Serve.
type Options struct {
	// MinProtocol and MaxProtocol default to this build's range.
	MinProtocol, MaxProtocol int
	AgentVersion             string
	// BootID defaults to /proc/sys/kernel/random/boot_id.
	BootID string
	Logger *slog.Logger
	// ReapOrphans makes the agent the one reaper of all children
	// (wait4(-1)); set it when the agent is PID 1 or a subreaper.
	ReapOrphans bool
	// KillAll makes Stop also signal every process (kill(-1)), as PID 1.
	KillAll bool
	// PowerOff is called after Stop ended the processes and synced. Nil:
	// Serve just returns. In production it is reboot(POWER_OFF).
	PowerOff func() error
	// ReopenDelay is the pause before reopening the channel after it
	// failed or reached EOF; zero means 20ms, doubling up to 250ms.
	ReopenDelay time.Duration
	// ResolvConf is where Configure writes DNS servers; default /etc/resolv.conf.
	ResolvConf string
}

// errStopped ends Serve after a Stop call.
var errStopped = errors.New("guest agent stopped")

type agent struct {
	opts    Options
	log     *slog.Logger
	reaper  reaper
	attach  attachments
	info    guestproto.GuestInfo
	procsMu sync.Mutex
	procs   map[int]*managed
	stopped bool // no new execs once Stop began
	stopCh  chan struct{}
	stopErr error
	wg      sync.WaitGroup // stream handlers
	execs   sync.WaitGroup // running execs, until their exit was reported
}

// Serve runs the agent until ctx ends or a Stop call completed. opener
// opens the channel to the node (the virtio-serial port); it is called
// again whenever the channel reaches EOF or fails, because a host-side
// disconnect shows up that way in the guest.
func Serve(ctx context.Context, opener func() (io.ReadWriteCloser, error), opts Options) error {
	a := newAgent(opts)
	defer a.shutdown()
	delay := a.opts.ReopenDelay
	for {
		if ctx.Err() != nil {
			return nil
		}
		conn, err := opener()
		if err != nil {
			a.log.Warn("guest agent channel open failed", "err", err)
		} else {
			handshakes, err := a.serveConn(ctx, conn)
			conn.Close()
			if errors.Is(err, errStopped) {
				return a.stopErr
			}
			if handshakes > 0 {
				delay = a.opts.ReopenDelay
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
				a.log.Info("guest agent channel ended", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.stopCh:
			return a.stopErr
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

func newAgent(opts Options) *agent {
	if opts.MinProtocol == 0 {
		opts.MinProtocol = guestproto.MinProtocolVersion
	}
	if opts.MaxProtocol == 0 {
		opts.MaxProtocol = guestproto.ProtocolVersion
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ReopenDelay == 0 {
		opts.ReopenDelay = 20 * time.Millisecond
	}
	if opts.ResolvConf == "" {
		opts.ResolvConf = "/etc/resolv.conf"
	}
	if opts.BootID == "" {
		b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		opts.BootID = strings.TrimSpace(string(b))
	}
	a := &agent{
		opts:   opts,
		log:    opts.Logger,
		procs:  map[int]*managed{},
		stopCh: make(chan struct{}),
		attach: attachments{m: map[string]*attachSet{}},
	}
	if opts.ReapOrphans {
		a.reaper = newOrphanReaper(a.log)
	} else {
		a.reaper = pidReaper{}
	}
	a.info = guestproto.GuestInfo{
		Capabilities: []string{guestproto.CapExec, guestproto.CapPTY, guestproto.CapFiles,
			guestproto.CapConfigure, guestproto.CapFreeze, guestproto.CapStop},
		BootID:       opts.BootID,
		AgentVersion: opts.AgentVersion,
	}
	return a
}

// shutdown ends what Serve started: running handlers and managed processes.
func (a *agent) shutdown() {
	a.killAll(unixSIGKILL)
	a.waitProcs(5 * time.Second)
	a.wg.Wait()
	a.reaper.close()
}

// serveConn runs sessions over one opened channel until it fails. After a
// session ends the agent looks for a new hello in the bytes the session
// consumed last: a node that reconnects without the channel closing (a new
// hello in the middle of a session) is picked up at once.
func (a *agent) serveConn(ctx context.Context, conn io.ReadWriteCloser) (int, error) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	in := io.Reader(conn)
	handshakes := 0
	for {
		br := bufio.NewReaderSize(in, guestproto.HandshakeBufferSize)
		info, err := guestproto.AcceptHandshake(br, conn, a.info, a.opts.MinProtocol, a.opts.MaxProtocol)
		if err != nil {
			var verr *guestproto.VersionError
			if errors.As(err, &verr) {
				a.log.Error("guest agent handshake refused", "err", err)
				in = br
				continue
			}
			return handshakes, err
		}
		handshakes++
		a.log.Info("guest agent session started", "protocol", info.Protocol)
		rec := &recorder{r: br}
		err = a.serveSession(ctx, rec, conn, info.Protocol)
		if err != nil {
			return handshakes, err
		}
		if rec.busy() {
			// The session's reader is still blocked on the channel and
			// would swallow the next hello: start over with a fresh open.
			return handshakes, errors.New("session ended with a read in flight")
		}
		rest := rec.tail()
		if n := br.Buffered(); n > 0 {
			p, _ := br.Peek(n)
			rest = append(rest, p...)
		}
		if i := guestproto.LastHello(rest); i >= 0 {
			rest = rest[i:]
		}
		in = io.MultiReader(bytes.NewReader(rest), conn)
	}
}

// serveSession runs one yamux session until it ends.
func (a *agent) serveSession(ctx context.Context, r io.Reader, conn io.ReadWriteCloser, protocol int) error {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// No keepalive: the session must only end when its reader returned, so
	// no read is left pending on the channel (see serveConn).
	cfg.EnableKeepAlive = false
	cfg.ConnectionWriteTimeout = 30 * time.Second
	ic := &interruptCloser{conn: conn}
	sess, err := yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{r, conn, ic}, cfg)
	if err != nil {
		return err
	}
	defer func() {
		sess.Close()
		if ic.interrupted.Load() {
			conn.(readDeadliner).SetReadDeadline(time.Time{})
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
		case <-a.stopCh:
		case <-sess.CloseChan():
			return
		}
		sess.Close()
	}()
	for {
		s, err := sess.AcceptStream()
		if err != nil {
			select {
			case <-a.stopCh:
				return errStopped
			default:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			a.log.Info("guest agent session ended")
			return nil
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.handle(ctx, s, protocol)
		}()
	}
}

// handle serves one stream: one call.
func (a *agent) handle(ctx context.Context, s net.Conn, protocol int) {
	s.SetReadDeadline(time.Now().Add(30 * time.Second))
	var req guestproto.Request
	if err := guestproto.ReadFrame(s, &req); err != nil {
		s.Close()
		return
	}
	s.SetReadDeadline(time.Time{})
	switch req.Call {
	case guestproto.CallExecAttach:
		a.handleAttach(s, req.Args) // keeps or closes s itself
		return
	case guestproto.CallExec:
		a.handleExec(ctx, s, req.Args)
		return
	}
	defer s.Close()
	var res any
	var err error
	switch req.Call {
	case guestproto.CallGuestInfo:
		info := a.info
		info.Protocol = protocol
		info.MinProtocol, info.MaxProtocol = a.opts.MinProtocol, a.opts.MaxProtocol
		res = info
	case guestproto.CallConfigure:
		var r guestproto.ConfigureRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = a.configure(ctx, r)
		}
	case guestproto.CallStat:
		var r guestproto.StatRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			res, err = stat(r.Path)
		}
	case guestproto.CallFileWrite:
		var r guestproto.FileWriteRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			res, err = writeFile(s, r)
		}
	case guestproto.CallFileRead:
		var r guestproto.FileReadRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			a.readFile(s, r)
			return
		}
	case guestproto.CallSync:
		syncAll()
	case guestproto.CallFreeze, guestproto.CallThaw:
		var r guestproto.FreezeRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = freeze(r.Path, req.Call == guestproto.CallFreeze)
		}
	case guestproto.CallStop:
		var r guestproto.StopRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			a.stop(s, r)
			return
		}
	default:
		err = &guestproto.Error{Code: guestproto.CodeUnsupported, Message: fmt.Sprintf("unknown call %q", req.Call)}
	}
	respond(s, res, err)
}

func decodeArgs(raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: "missing arguments"}
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return &guestproto.Error{Code: guestproto.CodeInvalid, Message: "bad arguments: " + err.Error()}
	}
	return nil
}

// respond writes the Response frame of a call.
func respond(w io.Writer, res any, err error) error {
	var resp guestproto.Response
	if err != nil {
		var ge *guestproto.Error
		if !errors.As(err, &ge) {
			code := guestproto.CodeFailed
			if errors.Is(err, os.ErrNotExist) {
				code = guestproto.CodeNotFound
			}
			ge = &guestproto.Error{Code: code, Message: err.Error()}
		}
		resp.Error = ge
	} else if res != nil {
		b, merr := json.Marshal(res)
		if merr != nil {
			resp.Error = &guestproto.Error{Code: guestproto.CodeFailed, Message: merr.Error()}
		}
		resp.Result = b
	}
	return guestproto.WriteFrame(w, resp)
}

// recorder remembers the last bytes a session read, so a hello that ended
// the session can be found again, and whether a read is still in flight.
type recorder struct {
	r       io.Reader
	mu      sync.Mutex
	reading bool
	buf     []byte
}

const recordSize = 64 << 10

func (r *recorder) Read(p []byte) (int, error) {
	r.mu.Lock()
	r.reading = true
	r.mu.Unlock()
	n, err := r.r.Read(p)
	r.mu.Lock()
	r.reading = false
	r.buf = append(r.buf, p[:n]...)
	if len(r.buf) > 2*recordSize {
		r.buf = append(r.buf[:0:0], r.buf[len(r.buf)-recordSize:]...)
	}
	r.mu.Unlock()
	return n, err
}

func (r *recorder) busy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reading
}

func (r *recorder) tail() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.buf...)
}

type readDeadliner interface{ SetReadDeadline(time.Time) error }

// interruptCloser is the Closer yamux gets. Closing a session must not
// close the channel (the next hello arrives on it), but yamux waits for its
// reader to return: a past read deadline wakes it without losing bytes.
// Channels without deadlines are closed and reopened instead.
type interruptCloser struct {
	conn        io.ReadWriteCloser
	interrupted atomic.Bool
}

func (c *interruptCloser) Close() error {
	if d, ok := c.conn.(readDeadliner); ok && d.SetReadDeadline(time.Unix(1, 0)) == nil {
		c.interrupted.Store(true)
		return nil
	}
	return c.conn.Close()
}
