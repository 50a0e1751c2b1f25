package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/agent"
	"github.com/kibotos/kibotos/agent/dataplane"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// guestEnv is the environment of processes started in a Workspace.
var guestEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}

// dataPlane opens a session to the Workspace's guest through the data
// plane of its node, with a fresh credential from ctrl.
func (g *Globals) dataPlane(id string) (*guestproto.Client, error) {
	var cred api.DataPlaneCredential
	if _, err := g.call("POST", workspacePath(id, "credentials"), struct{}{}, &cred); err != nil {
		return nil, err
	}
	// The cluster CA of the operator credential the call above used: a
	// person's credential brings it, off a member's host too.
	tc, err := g.findCredentials(g.dir())
	if err != nil {
		return nil, err
	}
	roots := tc.Pool
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	defer cancel()
	c, err := dataplane.Connect(ctx, cred, roots)
	if err != nil {
		var re *dataplane.RefusedError
		if errors.As(err, &re) {
			return nil, api.Errorf(api.CodeUnavailable, "%v", err)
		}
		return nil, api.Errorf(api.CodeUnavailable, "workspace %s: %v", id, err)
	}
	return c, nil
}

// WorkspaceExecCmd is `workspace exec WS -- CMD...`.
type WorkspaceExecCmd struct {
	ID      string   `arg:"" name:"workspace"`
	Command []string `arg:"" name:"command" passthrough:"" help:"The command and its arguments (after --)."`
	TTY     bool     `short:"t" name:"tty" help:"Run in a pseudo-terminal (resized with this terminal)."`
	Dir     string   `name:"workdir" short:"w" help:"Working directory in the Workspace."`
	Env     []string `name:"env" short:"e" help:"Environment KEY=VALUE (KEY alone: its value here); repeat for more."`
}

// execEnv is -e as the guest takes it: KEY=VALUE, or KEY alone for the
// value it has in kibo's environment (as docker exec -e does), which must
// then be set.
func execEnv(env []string) ([]string, error) {
	out := make([]string, 0, len(env))
	for _, e := range env {
		k, _, hasValue := strings.Cut(e, "=")
		switch {
		case k == "" || strings.ContainsRune(e, 0):
			return nil, usagef("-e %q: want KEY=VALUE with a KEY", e)
		case hasValue:
			out = append(out, e)
		default:
			v, ok := os.LookupEnv(k)
			if !ok {
				return nil, usagef("-e %s: %s is not set here; give its value: -e %s=VALUE", k, k, k)
			}
			out = append(out, k+"="+v)
		}
	}
	return out, nil
}

func (c *WorkspaceExecCmd) Run(g *Globals) error {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return usagef("workspace exec %s: give the command after --, e.g. kibo workspace exec %s -- uname -a", c.ID, c.ID)
	}
	env, err := execEnv(c.Env)
	if err != nil {
		return err
	}
	code, err := runInWorkspace(g, c.ID, argv, c.TTY, c.Dir, env)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code, ""}
	}
	return nil
}

// WorkspaceTerminalCmd is `workspace terminal WS`.
type WorkspaceTerminalCmd struct {
	ID    string `arg:"" name:"workspace"`
	Shell string `name:"shell" default:"/bin/sh" help:"Shell to run."`
}

func (c *WorkspaceTerminalCmd) Run(g *Globals) error {
	code, err := runInWorkspace(g, c.ID, []string{c.Shell, "-l"}, true, "", nil)
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code, ""}
	}
	return nil
}

// runInWorkspace runs argv in the Workspace's root with this process's
// stdio and returns its exit code (128+signal when a signal ended it).
func runInWorkspace(g *Globals, id string, argv []string, tty bool, dir string, env []string) (int, error) {
	c, err := g.dataPlane(id)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	in := g.stdin
	inIsTerm := in != nil && isTerminal(in.Fd())
	req := guestproto.ExecRequest{Argv: argv, Root: agent.WorkspaceRoot, Dir: dir, Env: append([]string(nil), env...)}
	if c.Info().Has(guestproto.CapExecImageConfig) {
		// Only the user's -e are explicit: a template built from an OCI
		// image replaces these defaults with the image's Env.
		req.DefaultEnv = guestEnv
	} else {
		req.Env = append(append([]string(nil), guestEnv...), env...)
	}
	// A terminal's stdin is forwarded only with -t (it would never end);
	// a pipe or file is always forwarded.
	req.Stdin = in != nil && (tty || !inIsTerm)
	var restore func()
	if tty {
		ws := guestproto.WinSize{Rows: 24, Cols: 80}
		if inIsTerm {
			if r, cl, err := termSize(in); err == nil {
				ws = guestproto.WinSize{Rows: r, Cols: cl}
			}
		}
		req.PTY = &ws
		t := os.Getenv("TERM")
		if t == "" {
			t = "xterm"
		}
		req.Env = append(req.Env, "TERM="+t)
	}
	ctx, cancel := context.WithTimeout(g.ctx, 30*time.Second)
	p, err := c.Exec(ctx, req)
	cancel()
	if err != nil {
		return 0, execStartError(id, argv[0], err)
	}
	if tty && inIsTerm {
		if restore, err = makeRaw(in); err != nil {
			return 0, err
		}
		defer restore()
		stopResize := forwardResize(in, p)
		defer stopResize()
	}
	stopSignals := forwardSignals(p, tty)
	defer stopSignals()
	var wg sync.WaitGroup
	if p.Stdin != nil {
		// Not waited for: a read of the terminal or of a pipe cannot be
		// interrupted (os.Stdin has no deadline), so this copy ends with
		// the input or with the process, which exits once the command's
		// output is copied.
		go func() {
			io.Copy(p.Stdin, in)
			p.Stdin.Close()
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(g.stdout, p.Stdout) }()
	if p.Stderr != nil {
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(g.stderr, p.Stderr) }()
	}
	exit, err := p.Wait()
	wg.Wait()
	if err != nil {
		return 0, lostExec(g, id, err)
	}
	if exit.Signal != 0 {
		return 128 + exit.Signal, nil
	}
	return exit.ExitCode, nil
}

// execStartError is the error of a command the guest did not start, with
// the exit code a shell gives it: 127 when the command is not found, 126
// when it cannot run (not executable, its working directory missing).
func execStartError(id, name string, err error) error {
	var ge *guestproto.Error
	if !errors.As(err, &ge) {
		return fmt.Errorf("workspace %s: exec %s: %w", id, name, err)
	}
	code := 126
	if ge.Code == guestproto.CodeNotFound {
		code = 127
	}
	return exitError{code, fmt.Sprintf("workspace %s: %s", id, ge.Message)}
}

// lostExec is the error of an exec whose stream broke: when the
// Workspace was paused or stopped meanwhile, that is what the user needs
// to hear.
func lostExec(g *Globals, id string, err error) error {
	var ws api.Workspace
	if _, gerr := g.call("GET", workspacePath(id), nil, &ws); gerr == nil {
		switch ws.State {
		case api.WorkspacePausing, api.WorkspacePaused:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s was paused while the command ran: its process is paused with the guest and goes on, without this stream, after kibo workspace resume %s", id, id)}
		case api.WorkspaceStopping, api.WorkspaceStopped, api.WorkspaceDeleting, api.WorkspaceFailed:
			return exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s is %s: the command ended with its guest (%v)", id, ws.State, err)}
		}
	}
	return fmt.Errorf("workspace %s: %w", id, err)
}

// forwardSignals passes SIGINT/SIGTERM/SIGHUP to the guest process while
// it runs (with a PTY, Ctrl-C arrives as a byte instead).
func forwardSignals(p *guestproto.Process, tty bool) func() {
	ch := make(chan os.Signal, 4)
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGHUP}
	if !tty {
		sigs = append(sigs, syscall.SIGINT)
	}
	signal.Notify(ch, sigs...)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-ch:
				p.Signal(s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

func forwardResize(f *os.File, p *guestproto.Process) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if r, c, err := termSize(f); err == nil {
					p.Resize(r, c)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// termSize is f's window size. A terminal that does not know its size
// (script(1), a serial line) says 0x0, which the guest would take as a
// size: programs then refuse to draw (stty size: "standard input"), so it
// is an error here and the caller keeps what it had.
func termSize(f *os.File) (rows, cols uint16, err error) {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0, err
	}
	if ws.Row == 0 || ws.Col == 0 {
		return 0, 0, errors.New("the terminal does not know its size")
	}
	return ws.Row, ws.Col, nil
}

// makeRaw puts the terminal in raw mode (cfmakeraw) and returns the undo.
func makeRaw(f *os.File) (func(), error) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}

// WorkspaceCpCmd is `workspace cp SRC DST`: one side is WS:PATH.
type WorkspaceCpCmd struct {
	Src      string `arg:"" name:"src" help:"Local path, - (stdin) or WS:PATH."`
	Dst      string `arg:"" name:"dst" help:"Local path, - (stdout) or WS:PATH."`
	Mode     string `name:"mode" default:"0644" help:"File mode of a file copied into the Workspace."`
	Progress bool   `name:"progress" negatable:"" default:"true" help:"Show a progress bar when stderr is a terminal."`
}

// splitRemote parses WS:PATH; a local path has no colon before its first slash.
func splitRemote(s string) (ws, p string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.Contains(s[:i], "/") {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

// inWorkspace is p as an absolute path in the Workspace (relative to
// /root, as a shell there would take it).
func inWorkspace(p string) string {
	if !path.IsAbs(p) {
		p = "/root/" + p
	}
	return path.Clean(p)
}

// guestPath is a Workspace path as the guest agent sees it.
func guestPath(p string) string {
	return path.Join(agent.WorkspaceRoot, inWorkspace(p))
}

// guestNotFound says whether err is the guest's "no such file".
func guestNotFound(err error) bool {
	var ge *guestproto.Error
	return errors.As(err, &ge) && ge.Code == guestproto.CodeNotFound
}

func (c *WorkspaceCpCmd) Run(g *Globals) error {
	sws, sp, sRemote := splitRemote(c.Src)
	dws, dp, dRemote := splitRemote(c.Dst)
	switch {
	case sRemote == dRemote:
		return usagef("workspace cp: exactly one of SRC and DST must be WS:PATH")
	case sRemote:
		return c.download(g, sws, sp, dp)
	default:
		return c.upload(g, sp, dws, dp)
	}
}

func (c *WorkspaceCpCmd) upload(g *Globals, local, ws, remote string) error {
	mode, err := strconv.ParseUint(c.Mode, 8, 32)
	if err != nil {
		return usagef("--mode %q is not an octal file mode", c.Mode)
	}
	var r io.Reader = g.stdin
	var size int64 = -1
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return api.Errorf(api.CodeNotFound, "%v", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
			if st.IsDir() {
				return usagef("workspace cp: %s is a directory; copy files one at a time (or tar them: tar c DIR | kibo workspace cp - %s:/tmp/dir.tar)", local, ws)
			}
		}
		r = f
	}
	client, err := g.dataPlane(ws)
	if err != nil {
		return err
	}
	defer client.Close()
	if strings.HasSuffix(remote, "/") && local != "-" {
		remote += path.Base(local)
	}
	// Where it goes, told before a byte is sent and in the Workspace's
	// terms: into a directory as cp(1) does, and never under a directory
	// that is not there.
	fi, err := client.Stat(g.ctx, guestPath(remote))
	switch {
	case err == nil && fi.Mode.IsDir() && local == "-":
		return usagef("workspace cp: %s:%s is a directory; name the file to write in it", ws, inWorkspace(remote))
	case err == nil && fi.Mode.IsDir():
		remote = path.Join(inWorkspace(remote), path.Base(local))
	case guestNotFound(err):
		dir := path.Dir(inWorkspace(remote))
		if _, err := client.Stat(g.ctx, guestPath(dir)); guestNotFound(err) {
			return api.Errorf(api.CodeNotFound, "workspace %s: directory %s does not exist: make it first (kibo workspace exec %s -- mkdir -p %s)", ws, dir, ws, dir)
		}
	}
	pb := g.progress(c.Progress, "upload "+path.Base(local), size)
	fi, err = client.WriteFile(g.ctx, guestPath(remote), os.FileMode(mode), pb.reader(r))
	pb.done()
	if err != nil {
		return fmt.Errorf("workspace %s: write %s: %w", ws, remote, err)
	}
	if !g.JSON {
		g.note("%s: %d bytes written to %s:%s\n", path.Base(local), fi.Size, ws, inWorkspace(remote))
	}
	return nil
}

func (c *WorkspaceCpCmd) download(g *Globals, ws, remote, local string) error {
	client, err := g.dataPlane(ws)
	if err != nil {
		return err
	}
	defer client.Close()
	gp := guestPath(remote)
	var size int64 = -1
	fi, err := client.Stat(g.ctx, gp)
	switch {
	case err == nil && fi.Mode.IsDir():
		dir := inWorkspace(remote)
		return usagef("workspace cp: %s:%s is a directory; copy files one at a time (or tar them: kibo workspace exec %s -- tar c -C %s . > dir.tar)", ws, dir, ws, dir)
	case err == nil:
		size = fi.Size
	case guestNotFound(err):
		// Said before a local file is created, and without the guest's
		// mount point in the path.
		return api.Errorf(api.CodeNotFound, "workspace %s: %s: no such file or directory", ws, remote)
	}
	var w io.Writer = g.stdout
	var f *os.File
	tmp := ""
	if local != "-" {
		if st, err := os.Stat(local); err == nil && st.IsDir() {
			local = local + "/" + path.Base(remote)
		}
		// Written beside the target and renamed: an interrupted copy
		// leaves no half file under the target's name.
		f, err = os.CreateTemp(path.Dir(local), "."+path.Base(local)+".kibo-cp-*")
		if err != nil {
			return err
		}
		tmp = f.Name()
		defer os.Remove(tmp)
		w = f
	}
	pb := g.progress(c.Progress && local != "-", "download "+path.Base(remote), size)
	_, err = client.ReadFile(g.ctx, gp, pb.writer(w))
	pb.done()
	if err != nil {
		if f != nil {
			f.Close()
		}
		return fmt.Errorf("workspace %s: read %s: %w", ws, remote, err)
	}
	if f != nil {
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp, local); err != nil {
			return err
		}
		// Said as an upload says it; not for stdout, which is the data.
		if st, err := os.Stat(local); err == nil {
			g.note("%s:%s: %d bytes written to %s\n", ws, inWorkspace(remote), st.Size(), local)
		}
	}
	return nil
}

// progressBar draws "name  42% 12.3MiB/29.0MiB 85.1MiB/s" on a terminal.
type progressBar struct {
	g       *Globals
	on      bool
	name    string
	total   int64
	mu      sync.Mutex
	n       int64
	start   time.Time
	lastOut time.Time
}

func (g *Globals) progress(want bool, name string, total int64) *progressBar {
	on := want && !g.JSON
	if f, ok := g.stderr.(*os.File); !ok || !isTerminal(f.Fd()) {
		on = false
	}
	return &progressBar{g: g, on: on, name: name, total: total, start: time.Now()}
}

func (p *progressBar) add(n int) { p.update(func() { p.n += int64(n) }) }

// set replaces the label and the count, for work that reports how far it
// is rather than what it added.
func (p *progressBar) set(name string, n int64) { p.update(func() { p.name, p.n = name, n }) }

func (p *progressBar) update(change func()) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	change()
	if time.Since(p.lastOut) > 100*time.Millisecond {
		p.lastOut = time.Now()
		p.draw()
	}
}

func (p *progressBar) draw() {
	rate := float64(p.n) / max(time.Since(p.start).Seconds(), 0.001)
	pctText := ""
	if p.total > 0 {
		pctText = fmt.Sprintf("%3d%% ", p.n*100/p.total)
	}
	total := "?"
	if p.total >= 0 {
		total = formatBytes(uint64(p.total))
	}
	fmt.Fprintf(p.g.stderr, "\r%s  %s%s/%s %s/s   ", p.name, pctText, formatBytes(uint64(p.n)), total, formatBytes(uint64(rate)))
}

func (p *progressBar) done() {
	if !p.on {
		return
	}
	p.mu.Lock()
	p.draw()
	p.mu.Unlock()
	fmt.Fprintln(p.g.stderr)
}

// abandon ends a bar without drawing it again: after a failure, the error
// starts on a line of its own.
func (p *progressBar) abandon() {
	if !p.on {
		return
	}
	p.mu.Lock()
	drawn := !p.lastOut.IsZero()
	p.mu.Unlock()
	if drawn {
		fmt.Fprintln(p.g.stderr)
	}
}

type countingReader struct {
	r io.Reader
	p *progressBar
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.add(n)
	return n, err
}

type countingWriter struct {
	w io.Writer
	p *progressBar
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.p.add(n)
	return n, err
}

func (p *progressBar) reader(r io.Reader) io.Reader {
	if !p.on {
		return r
	}
	return countingReader{r, p}
}

func (p *progressBar) writer(w io.Writer) io.Writer {
	if !p.on {
		return w
	}
	return countingWriter{w, p}
}

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
