package guest

import (
	"bufio"
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
	// ResolvConf is where Configure writes DNS servers; default
	// guestproto.ResolvConf.
	ResolvConf string
	// SysRoot and DevRoot are where a disk is looked up by its serial:
	// SysRoot/block/<name>/serial, then DevRoot/<name>; default /sys and
	// /dev. Tests give a fake sysfs.
	SysRoot, DevRoot string
	// DiskWait bounds the wait for a disk to appear (a serial: mount) and
	// for a device to reach a size (grow-fs); zero means 10s.
	DiskWait time.Duration
	// MaxWatchCalls and MaxWatchDirs bound the directory watches: calls
	// watching at once, directories one call watches; zero means
	// guestproto.MaxWatchCalls and MaxWatchDirs.
	MaxWatchCalls, MaxWatchDirs int
	// MaxKeptExecs bounds the kept execs that run at once; zero means
	// guestproto.MaxKeptExecs.
	MaxKeptExecs int
}

// errStopped ends Serve after a Stop call.
var errStopped = errors.New("guest agent stopped")

type agent struct {
	opts    Options
	log     *slog.Logger
	reaper  reaper
	attach  attachments
	kept    keptExecs
	info    guestproto.GuestInfo
	procsMu sync.Mutex
	procs   map[int]*managed
	stopped bool // no new execs once Stop began
	// retained are the mount points of disks configure mounted (the
	// Workspace's writable layer, its Volumes), in mount order: what a
	// stop must sync and freeze before the guest powers off.
	retainedMu sync.Mutex
	retained   []string
	// env is the Workspace's environment (configure's Env), given to
	// every exec with a Root. Kept in memory only: a restored guest has
	// it still, a rebooted one is told it again by its node.
	envMu    sync.Mutex
	env      []string
	stopCh   chan struct{}
	stopErr  error
	watching atomic.Int32   // watch calls running
	wg       sync.WaitGroup // stream handlers
	execs    sync.WaitGroup // running execs, until their exit was reported
}

// Opener opens one channel (a virtio-serial port). It may wait for the
// port to appear, until ctx ends.
type Opener func(ctx context.Context) (io.ReadWriteCloser, error)

// Serve runs the agent on the node channel alone; see ServeChannels.
func Serve(ctx context.Context, opener func() (io.ReadWriteCloser, error), opts Options) error {
	return ServeChannels(ctx, opts, func(context.Context) (io.ReadWriteCloser, error) { return opener() }, nil)
}

// ServeChannels runs the agent until ctx ends or a Stop call completed. node
// opens the channel to the node; data, if not nil, the data plane's channel.
// Both are served at once by one agent: an exec started over one is in the
// same process table as the other's, and either channel's sessions can end
// and restart without disturbing the other. The data channel serves only
// guestproto.DataCalls.
//
// Each channel is served the same way: a host-side disconnect shows up in
// the guest as EOF or a read error: it ends the session, and the agent
// reads the same channel on (a virtio-serial port delivers the next host
// client's bytes to the open file). Only when a read fails with no session
// to end is the channel closed and its opener called again.
func ServeChannels(ctx context.Context, opts Options, node, data Opener) error {
	a := newAgent(opts)
	defer a.shutdown()
	if data == nil {
		return a.serveChannel(ctx, nodeChannel, node)
	}
	// The data channel lives as long as the node's: it has no Stop of its
	// own, and it may never open (a host that gave the VM no data port).
	dctx, cancel := context.WithCancel(ctx)
	dataDone := make(chan struct{})
	go func() {
		defer close(dataDone)
		a.serveChannel(dctx, dataChannel, data)
	}()
	err := a.serveChannel(ctx, nodeChannel, node)
	cancel()
	<-dataDone
	return err
}

// chanKind says which channel a loop, a session or a call belongs to.
type chanKind struct {
	name string // in logs
	data bool   // the data plane's: only guestproto.DataCalls
}

var (
	nodeChannel = chanKind{name: "node"}
	dataChannel = chanKind{name: "data", data: true}
)

// serveChannel opens one channel and serves it until ctx ends or Stop
// completed, reopening it after it failed.
func (a *agent) serveChannel(ctx context.Context, kind chanKind, opener Opener) error {
	log := a.log.With("channel", kind.name)
	delay := a.opts.ReopenDelay
	for {
		if ctx.Err() != nil {
			return nil
		}
		conn, err := opener(ctx)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("guest agent channel open failed", "err", err)
			}
		} else {
			handshakes, err := a.serveConn(ctx, kind, log, conn)
			conn.Close()
			if errors.Is(err, errStopped) {
				return a.stopErr
			}
			if handshakes > 0 {
				delay = a.opts.ReopenDelay
			}
			if err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
				log.Info("guest agent channel ended", "err", err)
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
		opts.ResolvConf = guestproto.ResolvConf
	}
	if opts.SysRoot == "" {
		opts.SysRoot = "/sys"
	}
	if opts.DevRoot == "" {
		opts.DevRoot = "/dev"
	}
	if opts.DiskWait == 0 {
		opts.DiskWait = 10 * time.Second
	}
	if opts.MaxWatchCalls == 0 {
		opts.MaxWatchCalls = guestproto.MaxWatchCalls
	}
	if opts.MaxWatchDirs == 0 {
		opts.MaxWatchDirs = guestproto.MaxWatchDirs
	}
	if opts.MaxKeptExecs == 0 {
		opts.MaxKeptExecs = guestproto.MaxKeptExecs
	}
	if opts.BootID == "" {
		// Never the kernel's boot_id: the kernel makes it on its first
		// read and never again, so reading it here would fix it before
		// any pause, and every fork of the paused guest would share it.
		// uuid is a new random id on each read.
		b, _ := os.ReadFile("/proc/sys/kernel/random/uuid")
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
		Capabilities: append([]string(nil), guestproto.Capabilities...),
		BootID:       opts.BootID,
		AgentVersion: opts.AgentVersion,
	}
	return a
}

// nodeOnlyCaps are the capabilities of calls the data channel refuses; it
// does not announce them.
var nodeOnlyCaps = map[string]bool{guestproto.CapConfigure: true, guestproto.CapBindMount: true, guestproto.CapFreeze: true, guestproto.CapStop: true,
	guestproto.CapMountSerial: true, guestproto.CapGrowFS: true, guestproto.CapSetTime: true, guestproto.CapIdentity: true}

// infoFor is the GuestInfo a channel announces: the data channel's lists
// only what it serves.
func (a *agent) infoFor(kind chanKind) guestproto.GuestInfo {
	info := a.info
	if kind.data {
		info.Capabilities = nil
		for _, c := range a.info.Capabilities {
			if !nodeOnlyCaps[c] {
				info.Capabilities = append(info.Capabilities, c)
			}
		}
	}
	return info
}

// dataCalls is guestproto.DataCalls as a set.
var dataCalls = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range guestproto.DataCalls {
		m[c] = true
	}
	return m
}()

// nodeOnlyCalls are the known calls the data channel refuses by name.
var nodeOnlyCalls = map[string]bool{guestproto.CallConfigure: true, guestproto.CallSync: true,
	guestproto.CallFreeze: true, guestproto.CallThaw: true, guestproto.CallStop: true, guestproto.CallGrowFS: true, guestproto.CallSetTime: true,
	guestproto.CallIdentity: true}

// shutdown ends what Serve started: running handlers and managed processes.
func (a *agent) shutdown() {
	a.killAll(unixSIGKILL)
	a.waitProcs(5 * time.Second)
	a.wg.Wait()
	a.reaper.close()
}

// serveConn runs sessions over one opened channel until reading it fails.
//
// One goroutine (channel.readLoop) owns every read of conn; sessions and
// handshakes consume what it read. Ending a session never closes conn nor
// leaves a read of it behind: whatever the channel delivers after a session
// ended, including the beginning of the next node's hello, stays in the
// channel's buffer for the next handshake. The bytes the ended session had
// consumed are searched for a hello too, so a node that reconnects without
// the channel reporting a disconnect (a new hello in the middle of a
// session) is answered at once.
func (a *agent) serveConn(ctx context.Context, kind chanKind, log *slog.Logger, conn io.ReadWriteCloser) (int, error) {
	info := a.infoFor(kind)
	ch := newChannel(conn)
	// The channel's reader ends before serveConn returns: ctx's end closes
	// the channel (waiting for the reader), and so does any other return.
	closedByCtx := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		ch.close()
		close(closedByCtx)
	})
	defer func() {
		if stop() {
			ch.close()
		} else {
			<-closedByCtx
		}
	}()
	handshakes := 0
	for {
		v := ch.view()
		br := bufio.NewReaderSize(v, guestproto.HandshakeBufferSize)
		hs, err := guestproto.AcceptHandshake(br, conn, info, a.opts.MinProtocol, a.opts.MaxProtocol)
		if err != nil {
			ch.unread(buffered(br))
			var verr *guestproto.VersionError
			if errors.As(err, &verr) {
				log.Error("guest agent handshake refused", "err", err)
				continue
			}
			if rerr := ch.readErr(); rerr != nil || ctx.Err() != nil {
				return handshakes, err
			}
			// Reading still works, only the reply could not be written
			// (the node went away): wait for the next hello.
			log.Info("guest agent handshake failed", "err", err)
			continue
		}
		handshakes++
		log.Info("guest agent session started", "protocol", hs.Protocol)
		rec := &recorder{r: br}
		err = a.serveSession(ctx, session{kind: kind, log: log, protocol: hs.Protocol}, rec, conn, v)
		if err != nil {
			return handshakes, err
		}
		rest := append(rec.tail(), buffered(br)...)
		if i := guestproto.LastHello(rest); i >= 0 {
			rest = rest[i:]
		}
		ch.unread(rest)
		// A disconnect (EOF or an error) ends the session, not
		// necessarily the channel: a virtio-serial port delivers the next
		// node's bytes to the same open file. Read on; if the channel
		// fails again before a hello, Serve reopens it.
		ch.rearm()
	}
}

// buffered returns a copy of what br read ahead.
func buffered(br *bufio.Reader) []byte {
	p, _ := br.Peek(br.Buffered())
	return append([]byte(nil), p...)
}

// session is what a call needs to know of the session it came in on.
type session struct {
	kind     chanKind
	log      *slog.Logger
	protocol int
	done     <-chan struct{} // closed when the yamux session ended
}

// serveSession runs one yamux session until it ends. The session reads
// from r (fed by v); closing the session interrupts v, never the channel.
func (a *agent) serveSession(ctx context.Context, ss session, r io.Reader, conn io.Writer, v *chanView) error {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// No keepalive: the node pings; a host-side disconnect shows up as
	// EOF or an error of the channel.
	cfg.EnableKeepAlive = false
	cfg.ConnectionWriteTimeout = 30 * time.Second
	sess, err := yamux.Server(struct {
		io.Reader
		io.Writer
		io.Closer
	}{r, conn, v}, cfg)
	if err != nil {
		return err
	}
	ss.done = sess.CloseChan()
	watchDone := make(chan struct{})
	defer func() {
		sess.Close()
		<-watchDone // the closed session ends the watch
	}()
	go func() {
		defer close(watchDone)
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
			ss.log.Info("guest agent session ended")
			return nil
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.handle(ctx, ss, s)
		}()
	}
}

// handle serves one stream: one call.
func (a *agent) handle(ctx context.Context, ss session, s net.Conn) {
	s.SetReadDeadline(time.Now().Add(30 * time.Second))
	var req guestproto.Request
	if err := guestproto.ReadFrame(s, &req); err != nil {
		s.Close()
		return
	}
	s.SetReadDeadline(time.Time{})
	if ss.kind.data && !dataCalls[req.Call] {
		msg := fmt.Sprintf("unknown call %q", req.Call)
		if nodeOnlyCalls[req.Call] {
			msg = fmt.Sprintf("%s is only served on the node channel, not on the data channel", req.Call)
		}
		respond(s, nil, &guestproto.Error{Code: guestproto.CodeUnsupported, Message: msg})
		s.Close()
		return
	}
	switch req.Call {
	case guestproto.CallExecAttach:
		a.handleAttach(s, req.Args) // keeps or closes s itself
		return
	case guestproto.CallExec:
		a.handleExec(ctx, s, req.Args)
		return
	case guestproto.CallExecConnect:
		a.handleExecConnect(ctx, s, req.Args)
		return
	case guestproto.CallPortForward:
		a.portForward(ctx, ss, s, req.Args)
		return
	case guestproto.CallWatch:
		a.watch(s, req.Args)
		return
	}
	defer s.Close()
	var res any
	var err error
	switch req.Call {
	case guestproto.CallGuestInfo:
		info := a.infoFor(ss.kind)
		info.Protocol = ss.protocol
		info.MinProtocol, info.MaxProtocol = a.opts.MinProtocol, a.opts.MaxProtocol
		res = info
	case guestproto.CallConfigure:
		var r guestproto.ConfigureRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = a.configure(ctx, r)
		}
	case guestproto.CallExecList:
		res = guestproto.ExecList{Processes: a.kept.list()}
	case guestproto.CallStat:
		var r guestproto.StatRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			res, err = stat(r.Path)
		}
	case guestproto.CallFileWrite:
		var r guestproto.FileWriteRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			if r.User != "" || r.Root != "" {
				res, err = writeFileAs(s, r)
			} else {
				res, err = writeFile(s, r)
			}
		}
	case guestproto.CallFileRead:
		var r guestproto.FileReadRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			a.readFile(s, r)
			return
		}
	case guestproto.CallSync:
		syncAll()
	case guestproto.CallSetTime:
		var r guestproto.SetTimeRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = setTime(r)
		}
	case guestproto.CallIdentity:
		var r guestproto.IdentityRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = setIdentity(r)
		}
	case guestproto.CallFreeze, guestproto.CallThaw:
		var r guestproto.FreezeRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			err = freeze(r.Path, req.Call == guestproto.CallFreeze)
		}
	case guestproto.CallGrowFS:
		var r guestproto.GrowFSRequest
		if err = decodeArgs(req.Args, &r); err == nil {
			res, err = a.growFS(ctx, r)
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
// the session can be found again. It keeps them in a fixed ring: every
// byte of every call passes through it, and under emulation an append that
// reallocates (and the garbage it leaves) cost the inbound path a third of
// the agent's CPU.
type recorder struct {
	r    io.Reader
	mu   sync.Mutex
	ring []byte // recordSize bytes once the first read came
	pos  int    // next write position in ring
	full bool   // ring wrapped at least once
}

const recordSize = 64 << 10

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.mu.Lock()
	r.record(p[:n])
	r.mu.Unlock()
	return n, err
}

func (r *recorder) record(b []byte) {
	if len(b) == 0 {
		return
	}
	if r.ring == nil {
		r.ring = make([]byte, recordSize)
	}
	if len(b) >= recordSize {
		copy(r.ring, b[len(b)-recordSize:])
		r.pos, r.full = 0, true
		return
	}
	n := copy(r.ring[r.pos:], b)
	if n < len(b) {
		copy(r.ring, b[n:])
		r.full = true
	}
	r.pos = (r.pos + len(b)) % recordSize
	if r.pos == 0 {
		r.full = true
	}
}

func (r *recorder) tail() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.full {
		return append([]byte(nil), r.ring[:r.pos]...)
	}
	return append(append(make([]byte, 0, recordSize), r.ring[r.pos:]...), r.ring[:r.pos]...)
}
