package guestproto

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// HostStreamWindow is the largest receive window of one stream in the
// sessions hosts hold (the node's and the data plane's to a guest, a
// client's to the data plane, the data plane's to a client). yamux's
// default of 256 KiB caps one stream at 256 KiB per round trip: 26 MB/s at
// 10 ms between a client and a node. Each side sets only its own receive
// window, so peers of any build keep working. Guests keep the default: their
// channel's round trip is short and their memory small.
const HostStreamWindow = 8 << 20

// DialOptions tune Dial; the zero value speaks this build's protocol range.
type DialOptions struct {
	MinProtocol, MaxProtocol int
	// KeepAlive is how often the node pings the guest to notice a dead
	// session; zero means 15s.
	KeepAlive time.Duration
	// PingTimeout is how long a keepalive ping (or a write) may go
	// unanswered before the session ends; zero means yamux's 10s.
	PingTimeout time.Duration
	// Resend, when not zero, sends a fresh hello on the same connection
	// each time this long passes without an answer to the last one,
	// doubling up to ResendMax; only the answer to the last one sent is
	// taken. A guest agent that closes its port while no host is
	// connected drops a hello that arrived meanwhile, and the next one
	// reaches it. A new connection would too, but the guest may learn of
	// the old one's end only after the new one's hello (virtio-serial
	// reports a disconnect on another queue than the data) and end the
	// session it just began, which the host then holds alone.
	Resend, ResendMax time.Duration
}

// Client is the node's side of one guest agent session.
type Client struct {
	sess *yamux.Session
	info GuestInfo

	// pingMu is held across a keepalive ping; held says the keepalive is
	// paused (Hold).
	pingMu sync.Mutex
	held   bool

	keepAliveDone chan struct{} // closed when keepAlive returned
}

// Dial performs the handshake over conn and starts the session. Dial owns
// conn: it is closed on failure and by Client.Close.
func Dial(ctx context.Context, conn io.ReadWriteCloser) (*Client, error) {
	return DialWith(ctx, conn, DialOptions{})
}

// DialWith is Dial with options.
func DialWith(ctx context.Context, conn io.ReadWriteCloser, opts DialOptions) (*Client, error) {
	if opts.MinProtocol == 0 {
		opts.MinProtocol = MinProtocolVersion
	}
	if opts.MaxProtocol == 0 {
		opts.MaxProtocol = ProtocolVersion
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = 15 * time.Second
	}
	hello, err := NewHello(opts.MinProtocol, opts.MaxProtocol)
	if err != nil {
		conn.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	br := bufio.NewReaderSize(conn, HandshakeBufferSize)
	info, err := func() (GuestInfo, error) {
		if _, err := conn.Write(hello.Marshal()); err != nil {
			return GuestInfo{}, fmt.Errorf("guestproto: send hello: %w", err)
		}
		hs := &helloSender{conn: conn, min: opts.MinProtocol, max: opts.MaxProtocol, latest: hello.NonceString()}
		if opts.Resend > 0 {
			done := make(chan struct{})
			var resends sync.WaitGroup
			resends.Go(func() { hs.resend(done, opts.Resend, max(opts.ResendMax, opts.Resend)) })
			// Nothing is sent after the answer: the session's bytes follow it.
			defer resends.Wait()
			defer close(done)
		}
		info, _, err := readInfoFor(br, hs.accept)
		if err != nil {
			return info, fmt.Errorf("guestproto: read guest info: %w", err)
		}
		return info, nil
	}()
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("guestproto: handshake: %w", context.Cause(ctx))
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	if _, verr := Negotiate(opts.MinProtocol, opts.MaxProtocol, info.MinProtocol, info.MaxProtocol, "node", "guest agent"); verr != nil {
		conn.Close()
		return nil, verr
	}
	if info.Refused != "" || info.Protocol < opts.MinProtocol || info.Protocol > opts.MaxProtocol {
		conn.Close()
		return nil, fmt.Errorf("guestproto: guest agent refused the handshake (protocol %d): %s", info.Protocol, info.Refused)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	// The client pings itself (keepAlive), so that Hold can pause it.
	cfg.EnableKeepAlive = false
	if opts.PingTimeout > 0 {
		cfg.ConnectionWriteTimeout = opts.PingTimeout
	}
	cfg.MaxStreamWindowSize = HostStreamWindow
	sess, err := yamux.Client(struct {
		io.Reader
		io.Writer
		io.Closer
	}{br, conn, conn}, cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("guestproto: start session: %w", err)
	}
	c := &Client{sess: sess, info: info, keepAliveDone: make(chan struct{})}
	go c.keepAlive(opts.KeepAlive)
	return c, nil
}

// helloSender sends the hellos of one handshake and takes the answer to
// the last one.
type helloSender struct {
	conn     io.Writer
	min, max int

	mu       sync.Mutex // held across a send, so no hello follows the answer taken
	latest   string     // the nonce of the last hello sent
	answered bool
}

// accept takes the answer to the last hello sent.
func (h *helloSender) accept(nonce string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if nonce != h.latest {
		return false // an earlier hello's: the guest answers the last one too
	}
	h.answered = true
	return true
}

// resend sends a fresh hello every interval, doubling up to most, until
// done is closed or one was answered. A failed send ends it: the reader
// fails on the connection too.
func (h *helloSender) resend(done <-chan struct{}, every, most time.Duration) {
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		hello, err := NewHello(h.min, h.max)
		if err != nil {
			return
		}
		h.mu.Lock()
		if h.answered {
			h.mu.Unlock()
			return
		}
		_, err = h.conn.Write(hello.Marshal())
		if err == nil {
			h.latest = hello.NonceString()
		}
		h.mu.Unlock()
		if err != nil {
			return
		}
		every = min(2*every, most)
		t.Reset(every)
	}
}

// keepAlive pings the guest every interval and ends the session when a
// ping goes unanswered (yamux's own keepalive, which cannot pause), until
// the session ends.
func (c *Client) keepAlive(every time.Duration) {
	defer close(c.keepAliveDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.sess.CloseChan():
			return
		case <-t.C:
		}
		c.pingMu.Lock()
		var err error
		if !c.held {
			_, err = c.sess.Ping()
		}
		c.pingMu.Unlock()
		if err != nil {
			c.sess.Close()
			return
		}
	}
}

// Hold pauses the session's keepalive until Release, waiting for a ping
// in flight: for a guest whose vCPUs the node stops on purpose (a warm
// guest kept ready), which cannot answer and is not dead.
func (c *Client) Hold() {
	c.pingMu.Lock()
	c.held = true
	c.pingMu.Unlock()
}

// Release resumes the keepalive Hold paused.
func (c *Client) Release() {
	c.pingMu.Lock()
	c.held = false
	c.pingMu.Unlock()
}

// Info is the GuestInfo of the handshake.
func (c *Client) Info() GuestInfo { return c.info }

// Close ends the session and closes the connection. The guest agent goes
// back to waiting for a handshake; its processes keep running.
func (c *Client) Close() error {
	err := c.sess.Close()
	<-c.keepAliveDone // returns at the session's end
	return err
}

// Done is closed when the session ended.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// open opens a stream for call and sends its request. The stream follows
// ctx until release is called.
func (c *Client) open(ctx context.Context, call string, args any) (net.Conn, func(), error) {
	s, err := c.sess.OpenStream()
	if err != nil {
		return nil, nil, fmt.Errorf("guest agent: %s: open stream: %w", call, err)
	}
	stop := context.AfterFunc(ctx, func() { s.SetDeadline(time.Unix(1, 0)) })
	release := func() { stop() }
	req := Request{Call: call}
	if args != nil {
		if req.Args, err = json.Marshal(args); err != nil {
			release()
			s.Close()
			return nil, nil, err
		}
	}
	if err := WriteFrame(s, req); err != nil {
		release()
		s.Close()
		return nil, nil, c.streamErr(ctx, call, err)
	}
	return s, release, nil
}

func (c *Client) streamErr(ctx context.Context, call string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("guest agent: %s: %w", call, context.Cause(ctx))
	}
	return fmt.Errorf("guest agent: %s: %w", call, err)
}

// readResponse reads a Response and decodes its result into out.
func readResponse(s io.Reader, call string, out any) error {
	var resp Response
	if err := ReadFrame(s, &resp); err != nil {
		return err
	}
	if resp.Error != nil {
		resp.Error.Call = call
		return resp.Error
	}
	if out != nil && len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, out); err != nil {
			return fmt.Errorf("decode result: %w", err)
		}
	}
	return nil
}

// call is a plain request/response call.
func (c *Client) call(ctx context.Context, call string, args, out any) error {
	s, release, err := c.open(ctx, call, args)
	if err != nil {
		return err
	}
	defer s.Close()
	defer release()
	if err := readResponse(s, call, out); err != nil {
		var ge *Error
		if errors.As(err, &ge) {
			return err
		}
		return c.streamErr(ctx, call, err)
	}
	return nil
}

// GuestInfo asks the agent for its current info.
func (c *Client) GuestInfo(ctx context.Context) (GuestInfo, error) {
	var info GuestInfo
	err := c.call(ctx, CallGuestInfo, nil, &info)
	return info, err
}

// Configure sets hostname, network, DNS and mounts.
func (c *Client) Configure(ctx context.Context, req ConfigureRequest) error {
	return c.call(ctx, CallConfigure, req, nil)
}

// Stat returns a guest path's metadata.
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.call(ctx, CallStat, StatRequest{Path: path}, &fi)
	return fi, err
}

// Sync flushes all guest filesystems.
func (c *Client) Sync(ctx context.Context) error { return c.call(ctx, CallSync, nil, nil) }

// SetTime sets the guest's clock to t.
func (c *Client) SetTime(ctx context.Context, t time.Time) error {
	return c.call(ctx, CallSetTime, SetTimeRequest{UnixNano: t.UnixNano()}, nil)
}

// SetIdentity gives a restored fork its own random state, hostname and
// machine id (CapIdentity).
func (c *Client) SetIdentity(ctx context.Context, req IdentityRequest) error {
	return c.call(ctx, CallIdentity, req, nil)
}

// Freeze freezes the filesystem mounted at path (FIFREEZE).
func (c *Client) Freeze(ctx context.Context, path string) error {
	return c.call(ctx, CallFreeze, FreezeRequest{Path: path}, nil)
}

// Thaw thaws the filesystem mounted at path (FITHAW).
func (c *Client) Thaw(ctx context.Context, path string) error {
	return c.call(ctx, CallThaw, FreezeRequest{Path: path}, nil)
}

// GrowFS grows the ext4 filesystem mounted at req.Path to fill its device,
// once the device has at least req.MinBytes; a filesystem already filling
// it is left as it is.
func (c *Client) GrowFS(ctx context.Context, req GrowFSRequest) (GrowFSResult, error) {
	var res GrowFSResult
	err := c.call(ctx, CallGrowFS, req, &res)
	return res, err
}

// Stop ends the guest's processes (SIGTERM, SIGKILL after grace), syncs and
// powers the guest off. The result arrives before the poweroff.
func (c *Client) Stop(ctx context.Context, grace time.Duration) (StopResult, error) {
	var res StopResult
	err := c.call(ctx, CallStop, StopRequest{Grace: grace}, &res)
	return res, err
}

// WriteFile replaces path in the guest with the data of r (atomically).
func (c *Client) WriteFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader) (FileInfo, error) {
	return c.WriteFileAs(ctx, FileWriteRequest{Path: path, Mode: mode}, r)
}

// WriteFileAs writes r to the file req names: as a user of a root with
// req.User and req.Root (CapFilesAs).
func (c *Client) WriteFileAs(ctx context.Context, req FileWriteRequest, r io.Reader) (FileInfo, error) {
	var fi FileInfo
	s, release, err := c.open(ctx, CallFileWrite, req)
	if err != nil {
		return fi, err
	}
	defer s.Close()
	defer release()
	cw := &ChunkWriter{W: s}
	if _, err := io.CopyBuffer(cw, fullReader{r}, make([]byte, 256<<10)); err != nil {
		return fi, c.streamErr(ctx, CallFileWrite, err)
	}
	if err := cw.Close(); err != nil {
		return fi, c.streamErr(ctx, CallFileWrite, err)
	}
	if err := readResponse(s, CallFileWrite, &fi); err != nil {
		var ge *Error
		if errors.As(err, &ge) {
			return fi, err
		}
		return fi, c.streamErr(ctx, CallFileWrite, err)
	}
	return fi, nil
}

// fullReader fills each buffer unless the data ends first. A request
// body reads a TLS record (16 KiB) at a time: copied as it comes, each
// would be a chunk of its own, which the guest receives and writes on its
// own, where a file's bytes fill 256 KiB chunks.
type fullReader struct{ r io.Reader }

func (f fullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if err == io.ErrUnexpectedEOF {
		err = nil // the end, which the next read returns
	}
	return n, err
}

// ReadFile copies the guest file at path to w.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (FileInfo, error) {
	return c.ReadFileAs(ctx, FileReadRequest{Path: path}, w)
}

// ReadFileAs copies the file req names to w: as a user of a root with
// req.User and req.Root (CapFilesAs).
func (c *Client) ReadFileAs(ctx context.Context, req FileReadRequest, w io.Writer) (FileInfo, error) {
	var fi FileInfo
	s, release, err := c.open(ctx, CallFileRead, req)
	if err != nil {
		return fi, err
	}
	defer s.Close()
	defer release()
	if err := readResponse(s, CallFileRead, &fi); err != nil {
		var ge *Error
		if errors.As(err, &ge) {
			return fi, err
		}
		return fi, c.streamErr(ctx, CallFileRead, err)
	}
	if _, err := io.Copy(w, &ChunkReader{R: s}); err != nil {
		return fi, c.streamErr(ctx, CallFileRead, err)
	}
	if err := readResponse(s, CallFileRead, nil); err != nil {
		return fi, err
	}
	return fi, nil
}

// PortForward connects to host:port inside the guest (host "" is the
// guest's 127.0.0.1). ctx bounds the connect only. The returned conn
// carries the TCP connection's bytes both ways; its Close is a half-close
// (the guest shuts down the write side of its TCP connection and keeps
// sending what the guest's server still writes, until that reaches EOF).
// Read it to EOF, or close the Client, to free the stream.
func (c *Client) PortForward(ctx context.Context, host string, port int) (net.Conn, error) {
	s, release, err := c.open(ctx, CallPortForward, PortForwardRequest{Port: port, Host: host})
	if err != nil {
		return nil, err
	}
	err = readResponse(s, CallPortForward, nil)
	release()
	if err != nil {
		s.Close()
		var ge *Error
		if errors.As(err, &ge) {
			return nil, err
		}
		return nil, c.streamErr(ctx, CallPortForward, err)
	}
	if ctx.Err() != nil {
		// ctx ended as the connect succeeded: the stream may already
		// carry its expired deadline.
		s.Close()
		return nil, c.streamErr(ctx, CallPortForward, ctx.Err())
	}
	return s, nil
}

// Process is a process started by Exec.
type Process struct {
	PID    int
	Stdin  io.WriteCloser // nil unless ExecRequest.Stdin
	Stdout io.Reader      // with PTY: the terminal output
	Stderr io.Reader      // nil with PTY

	ctl     net.Conn
	streams []net.Conn
	mu      sync.Mutex // serializes control frames
	done    chan struct{}
	exit    ExecExit
	err     error
}

// Exec starts a process in the guest. ctx bounds the start only.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*Process, error) {
	if len(req.Argv) == 0 {
		return nil, errors.New("guest agent: exec: empty argv")
	}
	if len(req.Meta) > MaxExecMeta {
		return nil, fmt.Errorf("guest agent: exec: meta of %d bytes: at most %d", len(req.Meta), MaxExecMeta)
	}
	req.ID = streamID()
	return c.attachExec(ctx, CallExec, req, req.ID, req.Stdin, req.PTY != nil)
}

// ConnectExec attaches to the kept exec pid (CapExecKeep): its output
// from now on, its exit, its stdin with stdin; pty says it has a
// terminal (no stderr), as ListExecs tells. Close detaches; the process
// runs on. ctx bounds the attach only.
func (c *Client) ConnectExec(ctx context.Context, pid int, stdin, pty bool) (*Process, error) {
	id := streamID()
	return c.attachExec(ctx, CallExecConnect, ExecConnect{ID: id, PID: pid, Stdin: stdin, PTY: pty}, id, stdin, pty)
}

// ControlExec attaches to the kept exec pid for control frames only
// (ExecConnect.ControlOnly): end it with Detach, which returns once the
// guest took them. ctx bounds the attach only.
func (c *Client) ControlExec(ctx context.Context, pid int) (*Process, error) {
	ctl, release, err := c.open(ctx, CallExecConnect, ExecConnect{ID: streamID(), PID: pid, ControlOnly: true})
	if err != nil {
		return nil, err
	}
	defer release()
	var started ExecStarted
	if err := readResponse(ctl, CallExecConnect, &started); err != nil {
		ctl.Close()
		var ge *Error
		if errors.As(err, &ge) {
			return nil, err
		}
		return nil, c.streamErr(ctx, CallExecConnect, err)
	}
	p := &Process{PID: started.PID, ctl: ctl, done: make(chan struct{})}
	go p.waitExit()
	return p, nil
}

// Detach ends the caller's side of an attach to a kept exec and waits
// until the guest ended its own, having taken every control frame sent
// before, or until ctx ends; the process runs on. Closing the session
// right after a control frame could lose it on the way.
func (p *Process) Detach(ctx context.Context) error {
	p.mu.Lock()
	err := p.ctl.Close() // its writing half: the guest reads to the end
	p.mu.Unlock()
	for _, s := range p.streams {
		s.Close()
	}
	select {
	case <-p.done:
		return err
	case <-ctx.Done():
		p.Close()
		return ctx.Err()
	}
}

// ListExecs is the kept execs that run (CapExecKeep).
func (c *Client) ListExecs(ctx context.Context) ([]KeptExec, error) {
	var out ExecList
	err := c.call(ctx, CallExecList, nil, &out)
	return out.Processes, err
}

// Control sends m, in order with the other control frames.
func (p *Process) Control(m ExecControl) error { return p.control(m) }

// CloseStdin closes a kept exec's stdin.
func (p *Process) CloseStdin() error { return p.control(ExecControl{CloseStdin: true}) }

// Input writes b to a kept exec's stdin or terminal, in order with the
// other control frames.
func (p *Process) Input(b []byte) error { return p.control(ExecControl{Input: b}) }

// streamID names the stdio streams of one exec call.
func streamID() string {
	var id [12]byte
	rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// attachExec makes call with args and attaches the stdio streams of id:
// stdin when asked, stdout, and stderr without a PTY.
func (c *Client) attachExec(ctx context.Context, call string, args any, id string, stdin, pty bool) (*Process, error) {
	ctl, release, err := c.open(ctx, call, args)
	if err != nil {
		return nil, err
	}
	defer release()
	p := &Process{ctl: ctl, done: make(chan struct{})}
	fail := func(err error) (*Process, error) {
		p.closeAll()
		return nil, err
	}
	attach := func(fd int) (net.Conn, error) {
		s, rel, err := c.open(ctx, CallExecAttach, ExecAttach{ID: id, FD: fd})
		if err != nil {
			return nil, err
		}
		rel()
		p.streams = append(p.streams, s)
		return s, nil
	}
	if stdin {
		s, err := attach(0)
		if err != nil {
			return fail(err)
		}
		p.Stdin = s
	}
	s, err := attach(1)
	if err != nil {
		return fail(err)
	}
	p.Stdout = &closeOnEOF{Conn: s}
	if !pty {
		s, err := attach(2)
		if err != nil {
			return fail(err)
		}
		p.Stderr = &closeOnEOF{Conn: s}
	}
	var started ExecStarted
	if err := readResponse(ctl, call, &started); err != nil {
		var ge *Error
		if errors.As(err, &ge) {
			return fail(err)
		}
		return fail(c.streamErr(ctx, call, err))
	}
	p.PID = started.PID
	go p.waitExit()
	return p, nil
}

func (p *Process) waitExit() {
	defer close(p.done)
	if err := ReadFrame(p.ctl, &p.exit); err != nil {
		p.err = fmt.Errorf("guest agent: exec: lost the process: %w", err)
	} else if p.exit.Error != "" {
		p.err = fmt.Errorf("guest agent: exec: %s", p.exit.Error)
	}
	p.ctl.Close()
	if p.Stdin != nil {
		p.Stdin.Close()
	}
}

func (p *Process) control(m ExecControl) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return errors.New("guest agent: exec: process already exited")
	default:
	}
	return WriteFrame(p.ctl, m)
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) error { return p.control(ExecControl{Signal: int(sig)}) }

// Resize sets the PTY's window size.
func (p *Process) Resize(rows, cols uint16) error {
	return p.control(ExecControl{Resize: &WinSize{Rows: rows, Cols: cols}})
}

// Wait waits for the process to exit. The guest reports the exit after the
// process's output was sent, so Stdout and Stderr then read to EOF.
func (p *Process) Wait() (ExecExit, error) {
	<-p.done
	return p.exit, p.err
}

// Done is closed when the exit is known.
func (p *Process) Done() <-chan struct{} { return p.done }

// Close abandons the process's streams and its exit; the process keeps
// running. It returns once the exit reader ended: closing a stream only
// ends its writing half, so the reader's deadline ends it at once.
func (p *Process) Close() error {
	p.closeAll()
	p.ctl.SetReadDeadline(time.Unix(1, 0))
	<-p.done
	return nil
}

func (p *Process) closeAll() {
	p.ctl.Close()
	for _, s := range p.streams {
		s.Close()
	}
}

// closeOnEOF closes its stream once the guest finished sending, so the
// stream is freed on both sides.
type closeOnEOF struct{ net.Conn }

func (c *closeOnEOF) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err == io.EOF {
		c.Conn.Close()
	}
	return n, err
}
