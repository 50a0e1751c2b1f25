package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

const unixSIGKILL = unix.SIGKILL

// attachTimeout bounds how long an exec waits for its stdio streams and a
// stdio stream for its exec.
const attachTimeout = 10 * time.Second

// outputDelay is how long the exit report waits for output after the
// process ended (a background child may keep the pipes open).
const outputDelay = 2 * time.Second

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// attachments pairs exec-attach streams with their exec by ID; either may
// arrive first.
type attachments struct {
	mu sync.Mutex
	m  map[string]*attachSet
}

type attachSet struct {
	fds     [3]chan net.Conn
	claimed chan struct{}
}

func (a *attachments) get(id string) *attachSet {
	a.mu.Lock()
	defer a.mu.Unlock()
	set, ok := a.m[id]
	if !ok {
		set = &attachSet{claimed: make(chan struct{})}
		for i := range set.fds {
			set.fds[i] = make(chan net.Conn, 1)
		}
		a.m[id] = set
	}
	return set
}

// done removes the set and closes streams nobody took.
func (a *attachments) done(id string, set *attachSet) {
	a.mu.Lock()
	if a.m[id] == set {
		delete(a.m, id)
		close(set.claimed)
	}
	a.mu.Unlock()
	for _, ch := range set.fds {
		select {
		case s := <-ch:
			s.Close()
		default:
		}
	}
}

func (a *agent) handleAttach(s net.Conn, raw json.RawMessage) {
	var req guestproto.ExecAttach
	if err := decodeArgs(raw, &req); err != nil || req.FD < 0 || req.FD > 2 || req.ID == "" {
		s.Close()
		return
	}
	set := a.attach.get(req.ID)
	select {
	case set.fds[req.FD] <- s:
	default:
		s.Close() // a second stream for the same fd
		return
	}
	t := time.NewTimer(attachTimeout)
	defer t.Stop()
	select {
	case <-set.claimed:
	case <-t.C:
		a.attach.done(req.ID, set)
	}
}

// managed is a process started by exec; Stop ends them.
type managed struct {
	proc *os.Process
	done chan struct{}
}

func (a *agent) handleExec(ctx context.Context, ctl net.Conn, raw json.RawMessage) {
	defer ctl.Close()
	var req guestproto.ExecRequest
	if err := decodeArgs(raw, &req); err != nil {
		respond(ctl, nil, err)
		return
	}
	if req.ID == "" || len(req.Argv) == 0 {
		respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: "exec needs an id and argv"})
		return
	}
	streams, ok := a.takeStreams(ctx, ctl, req.ID, req.Stdin, req.PTY != nil)
	defer closeStreams(streams)
	if !ok {
		return
	}
	if req.Keep {
		a.runKept(ctl, req, streams)
		return
	}
	a.runExec(ctl, req, streams)
}

// takeStreams waits for the stdio streams of id: stdin if asked, stdout,
// and stderr without a PTY. It answers ctl itself when they do not come.
func (a *agent) takeStreams(ctx context.Context, ctl net.Conn, id string, stdin, pty bool) ([3]net.Conn, bool) {
	set := a.attach.get(id)
	defer a.attach.done(id, set)
	var streams [3]net.Conn
	t := time.NewTimer(attachTimeout)
	defer t.Stop()
	for fd := range 3 {
		if (fd == 0 && !stdin) || (fd == 2 && pty) {
			continue
		}
		select {
		case streams[fd] = <-set.fds[fd]:
		case <-t.C:
			respond(ctl, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: fmt.Sprintf("stdio stream %d never attached", fd)})
			return streams, false
		case <-ctx.Done():
			return streams, false
		}
	}
	return streams, true
}

func closeStreams(streams [3]net.Conn) {
	for _, s := range streams {
		if s != nil {
			s.Close()
		}
	}
}

// stdio is the guest end of a process's standard streams.
type stdio struct {
	child   []*os.File // closed in the agent once the child started
	master  *os.File   // PTY master
	outputs sync.WaitGroup
	closers []io.Closer // read ends, closed when output times out
	inputs  sync.WaitGroup
	stdinW  *os.File // the stdin pipe's write end, closed to end its copy

	mu     sync.Mutex // orders resizes against closing the master
	closed bool
}

// resize sets the PTY size unless the master is already closed.
func (st *stdio) resize(ws *guestproto.WinSize) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.master != nil && !st.closed {
		setWinSize(st.master, ws.Rows, ws.Cols)
	}
}

// startProcess starts req's process with the stdio open gives st; the
// error is the exec's answer. The process is managed (Stop ends it) and
// counted in a.execs, which the caller marks done once its exit was
// reported.
func (a *agent) startProcess(req guestproto.ExecRequest, st *stdio, open func() error) (*os.Process, <-chan unix.WaitStatus, *managed, error) {
	setup, err := setupExec(a.log, req, a.workspaceEnv())
	if err != nil {
		return nil, nil, nil, &guestproto.Error{Code: guestproto.CodeInvalid, Message: err.Error()}
	}
	path, err := lookPath(req.Root, req.Argv[0], setup.env)
	if err != nil {
		return nil, nil, nil, &guestproto.Error{Code: guestproto.CodeNotFound, Message: err.Error()}
	}
	defer func() {
		for _, f := range st.child {
			f.Close()
		}
		st.child = nil
	}()
	sys := &syscall.SysProcAttr{Setsid: true, Chroot: req.Root, Credential: setup.cred}
	err = open()
	if req.PTY != nil {
		sys.Setctty, sys.Ctty = true, 0
		if err == nil && setup.cred != nil {
			// The image's user owns its terminal, as on a login: it can
			// open it again by name (script, ssh, a pager on /dev/tty).
			err = st.child[0].Chown(int(setup.cred.Uid), -1)
		}
	}
	if err != nil {
		st.closeAll()
		return nil, nil, nil, err
	}
	a.procsMu.Lock()
	if a.stopped {
		a.procsMu.Unlock()
		st.closeAll()
		return nil, nil, nil, &guestproto.Error{Code: guestproto.CodeFailed, Message: "the guest is stopping"}
	}
	proc, exited, err := a.reaper.start(path, req.Argv, &os.ProcAttr{Dir: setup.dir, Env: setup.env, Files: st.child, Sys: sys})
	if err != nil {
		a.procsMu.Unlock()
		st.closeAll()
		return nil, nil, nil, &guestproto.Error{Code: guestproto.CodeFailed, Message: startFailure(req.Root, setup.dir, req.Argv[0], err)}
	}
	m := &managed{proc: proc, done: make(chan struct{})}
	a.procs[proc.Pid] = m
	a.execs.Add(1) // under procsMu: Stop waits only after setting stopped
	a.procsMu.Unlock()
	a.log.Debug("exec started", "pid", proc.Pid, "argv0", req.Argv[0], "keep", req.Keep)
	return proc, exited, m, nil
}

func (a *agent) runExec(ctl net.Conn, req guestproto.ExecRequest, streams [3]net.Conn) {
	st := &stdio{}
	defer st.finish(streams[0]) // every return: no copy outlives the exec
	proc, exited, m, err := a.startProcess(req, st, func() error {
		if req.PTY != nil {
			return st.openPTY(req.Root, req.PTY, streams[0], streams[1])
		}
		return st.openPipes(req.Stdin, streams[0], [2]io.WriteCloser{streams[1], streams[2]})
	})
	if err != nil {
		respond(ctl, nil, err)
		return
	}
	defer a.execs.Done()

	pid := proc.Pid
	respond(ctl, guestproto.ExecStarted{PID: pid}, nil)
	controlDone := make(chan struct{})
	go func() {
		defer close(controlDone)
		a.execControl(ctl, proc, pid, st)
		// The client went away (or its exit was reported, when this is
		// a no-op): as sshd does, close the process's end of its output
		// so it gets EPIPE/SIGPIPE, or its terminal's hangup, instead of
		// blocking on output nobody reads.
		st.closeAll()
	}()

	exit := a.ended(pid, m, <-exited)

	var waits sync.WaitGroup
	defer waits.Wait()
	if !waitTimeout(&waits, &st.outputs, outputDelay) {
		// A background child holds the output open, or the node stopped
		// reading: cut both ends loose.
		st.closeAll()
		for _, s := range streams[1:] {
			if s != nil {
				s.SetWriteDeadline(time.Unix(1, 0))
			}
		}
		st.outputs.Wait()
	}
	st.finish(streams[0])
	guestproto.WriteFrame(ctl, exit)
	ctl.SetReadDeadline(time.Unix(1, 0)) // end execControl
	<-controlDone
	proc.Release() // only now: Release clears proc.Pid
}

// ended forgets the managed process pid that exited with ws and says
// how it ended.
func (a *agent) ended(pid int, m *managed, ws unix.WaitStatus) guestproto.ExecExit {
	a.procsMu.Lock()
	delete(a.procs, pid)
	a.procsMu.Unlock()
	close(m.done)
	exit := guestproto.ExecExit{ExitCode: ws.ExitStatus()}
	if ws.Signaled() {
		exit.ExitCode, exit.Signal = -1, int(ws.Signal())
	}
	return exit
}

// execControl applies the node's signals and resizes.
func (a *agent) execControl(ctl net.Conn, proc *os.Process, pid int, st *stdio) {
	for {
		var m guestproto.ExecControl
		if err := guestproto.ReadFrame(ctl, &m); err != nil {
			return
		}
		if m.Signal != 0 {
			if err := proc.Signal(syscall.Signal(m.Signal)); err != nil {
				a.log.Debug("exec signal failed", "pid", pid, "err", err)
			}
		}
		if m.Resize != nil {
			st.resize(m.Resize)
		}
	}
}

// openPTY gives the process a terminal of size: in (if not nil) is
// copied to it, its output to out, closed at its end.
func (st *stdio) openPTY(root string, size *guestproto.WinSize, in io.Reader, out io.WriteCloser) error {
	master, slave, err := openPTYIn(root)
	if err != nil {
		return fmt.Errorf("open pty: %w", err)
	}
	if size.Rows > 0 && size.Cols > 0 {
		setWinSize(master, size.Rows, size.Cols)
	}
	st.master = master
	st.child = []*os.File{slave, slave, slave}
	st.closers = append(st.closers, master)
	if in != nil {
		st.inputs.Go(func() { copyQuiet(master, in) })
	}
	st.outputs.Add(1)
	go func() {
		defer st.outputs.Done()
		copyQuiet(out, master) // EIO once the last slave fd closed
		out.Close()
	}()
	return nil
}

// openPipes gives the process pipes: a stdin (else /dev/null) that in,
// if not nil, is copied to and then closed, and stdout and stderr copied
// to out, each closed at its end.
func (st *stdio) openPipes(stdin bool, in io.Reader, out [2]io.WriteCloser) error {
	if stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		st.child = append(st.child, r)
		st.stdinW = w
		if in != nil {
			st.inputs.Go(func() {
				copyQuiet(w, in)
				w.Close()
			})
		}
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return err
		}
		st.child = append(st.child, null)
	}
	for _, dst := range out {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		st.child = append(st.child, w)
		st.closers = append(st.closers, r)
		st.outputs.Add(1)
		go func() {
			defer st.outputs.Done()
			copyQuiet(dst, r)
			dst.Close()
		}()
	}
	return nil
}

// finish cuts every copy of the exec's stdio and waits for them: the
// output copies end on their closed read ends, the stdin copy on its
// stream's deadline or its closed destination (a background child may
// hold the pipe without reading it). Calling it again only waits.
func (st *stdio) finish(stdin net.Conn) {
	st.closeAll()
	if stdin != nil {
		stdin.SetReadDeadline(time.Unix(1, 0))
	}
	if st.stdinW != nil {
		st.stdinW.Close()
	}
	st.inputs.Wait()
	st.outputs.Wait()
}

func (st *stdio) closeAll() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = true
	for _, c := range st.closers {
		c.Close()
	}
}

func copyQuiet(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitTimeout waits for wg until d passed. Its helper goroutine waits for
// wg to the end: owner counts it, so whoever waits for owner (after wg
// could end) waits for the helper too.
func waitTimeout(owner, wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	owner.Go(func() { wg.Wait(); close(done) })
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// lookPath resolves argv[0] with the PATH of the process's environment,
// not the agent's.
// lookPath finds name in PATH inside root ("" is /) and returns the path as
// seen from root, which is where the process will exec it.
func lookPath(root, name string, env []string) (string, error) {
	if root != "" {
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			return "", fmt.Errorf("root %s is not a directory of the guest: mount the Workspace filesystem first", root)
		}
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := defaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(filepath.Join(root, p)); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found in PATH %s", name, path)
}

// startFailure says why a process did not start. The kernel's ENOENT
// names no culprit and Go's error names the program, so a working
// directory that is missing in the root is told as such; it is looked at
// only after the failure, so an unusual root (a symlink the agent would
// resolve differently) never stops a start that would work.
func startFailure(root, dir, name string, err error) string {
	if dir != "" && errors.Is(err, syscall.ENOENT) {
		if fi, serr := os.Stat(filepath.Join(root, dir)); errors.Is(serr, os.ErrNotExist) || (serr == nil && !fi.IsDir()) {
			return fmt.Sprintf("working directory %s: no such directory", dir)
		}
	}
	return fmt.Sprintf("start %s: %v", name, err)
}

// killAll signals the process group of every managed process.
func (a *agent) killAll(sig syscall.Signal) int {
	a.procsMu.Lock()
	defer a.procsMu.Unlock()
	for pid := range a.procs {
		if err := unix.Kill(-pid, sig); err != nil {
			unix.Kill(pid, sig)
		}
	}
	return len(a.procs)
}

// waitProcs waits until no managed process is left or d passed.
func (a *agent) waitProcs(d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		a.procsMu.Lock()
		var one *managed
		for _, m := range a.procs {
			one = m
			break
		}
		a.procsMu.Unlock()
		if one == nil {
			return true
		}
		select {
		case <-one.done:
		case <-deadline.C:
			return false
		}
	}
}
