package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/ctxsleep"
)

// DefaultConsoleLogCap bounds what the node keeps of a guest's serial
// console: console.log plus console.log.1.
const DefaultConsoleLogCap = 8 << 20

// The serial console of a confined VMM is a socket QEMU listens on, read
// here into a ring of two files, rather than a file QEMU appends to: a
// guest root user writing to /dev/ttyS0 without end would fill the host
// disk, and QEMU has no size-capped file chardev. A reader in the node
// (not a helper process) needs no extra unit to take over; a new node
// reconnects. While no node reads (between a node's exit and its
// successor's takeover) QEMU's socket chardev discards what the guest
// writes (its write with no client connected reports the bytes consumed;
// read from QEMU's char-socket.c, not measured here); while the node reads
// slower than the guest writes, the guest's UART waits, nothing grows.
//
// The ring: console.log is appended to until it would pass half the cap,
// then renamed to console.log.1 (replacing the older half) and started
// afresh, so at most cap bytes are on disk and at least the last cap/2 are
// kept. Both files are the node's (root, 0600, in a directory the VMM
// account can only search).

// consoleRing appends to console.log within the cap.
type consoleRing struct {
	path string
	half int64
	f    *os.File
	size int64
}

func openConsoleRing(path string, cap int64) (*consoleRing, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("console log %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("console log %s: %w", path, err)
	}
	return &consoleRing{path: path, half: max(cap/2, 4096), f: f, size: st.Size()}, nil
}

func (r *consoleRing) Write(p []byte) (int, error) {
	n := len(p)
	if int64(len(p)) > r.half {
		p = p[int64(len(p))-r.half:]
	}
	if r.size+int64(len(p)) > r.half {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	m, err := r.f.Write(p)
	r.size += int64(m)
	if err != nil {
		return 0, fmt.Errorf("console log %s: %w", r.path, err)
	}
	return n, nil
}

func (r *consoleRing) rotate() error {
	r.f.Close()
	if err := os.Rename(r.path, r.path+".1"); err != nil {
		return fmt.Errorf("rotate console log %s: %w", r.path, err)
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("rotate console log %s: %w", r.path, err)
	}
	r.f, r.size = f, 0
	return nil
}

func (r *consoleRing) Close() error { return r.f.Close() }

// startConsole reads the Instance's console socket into its ring until the
// VMM exits or the node closes. It reconnects while the VMM runs (the node
// may have come up before QEMU made the socket).
func (rt *Runtime) startConsole(in *instance) {
	in.mu.Lock()
	rec, sock := in.rec, in.paths.ConsoleSocket
	done := make(chan struct{})
	in.consoleDone = done
	in.mu.Unlock()
	rt.wg.Add(1)
	go func() {
		defer rt.wg.Done()
		defer close(done)
		alive := func() bool {
			st, err := procStartTime(rec.Process.HostPID)
			return err == nil && st == rec.Process.StartTime
		}
		ring, err := openConsoleRing(in.paths.Console, rt.cfg.ConsoleLogCap)
		if err != nil {
			rt.log.Warn("instance console not kept", "instance_id", in.id, "err", err)
			return
		}
		defer ring.Close()
		backoff := time.Millisecond
		for rt.ctx.Err() == nil && alive() {
			var d net.Dialer
			c, err := d.DialContext(rt.ctx, "unix", sock)
			if err != nil {
				if ctxsleep.Sleep(rt.ctx, backoff) != nil {
					return
				}
				backoff = min(2*backoff, 500*time.Millisecond)
				continue
			}
			backoff = time.Millisecond
			stop := context.AfterFunc(rt.ctx, func() { c.Close() })
			_, err = io.Copy(ring, c)
			stop()
			c.Close()
			var werr *os.PathError
			if err != nil && errors.As(err, &werr) {
				rt.log.Warn("instance console not kept", "instance_id", in.id, "err", err)
				return
			}
			// EOF: QEMU exited (or closed the client); the loop checks.
		}
	}()
}

// awaitConsole waits, briefly, for the console reader to take what an
// exited VMM wrote last, before its tail is copied.
func (in *instance) awaitConsole(d time.Duration) {
	in.mu.Lock()
	done := in.consoleDone
	in.mu.Unlock()
	if done == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// readConsoleTail is the last n bytes of console.log.1 followed by console.log.
func readConsoleTail(path string, n int64) ([]byte, error) {
	b, _, _, err := readConsoleSince(path, ConsoleCursor{}, n)
	return b, err
}

// ConsoleCursor is where a read of a console ring ended: the file (its
// inode, which a rotation's rename keeps) and the offset in it. It stays
// valid across node restarts and one rotation of the ring. After two
// rotations (the guest wrote the whole cap since) the file is gone and a
// new console.log may reuse its inode: a read then misses that file's
// first Off bytes without saying so.
type ConsoleCursor struct {
	Ino uint64
	Off int64
}

// String is the cursor as the API carries it ("" for none).
func (c ConsoleCursor) String() string {
	if c == (ConsoleCursor{}) {
		return ""
	}
	return strconv.FormatUint(c.Ino, 10) + "." + strconv.FormatInt(c.Off, 10)
}

// ParseConsoleCursor reads String's form ("" is the zero cursor).
func ParseConsoleCursor(s string) (ConsoleCursor, error) {
	if s == "" {
		return ConsoleCursor{}, nil
	}
	i, o, ok := strings.Cut(s, ".")
	ino, err1 := strconv.ParseUint(i, 10, 64)
	off, err2 := strconv.ParseInt(o, 10, 64)
	if !ok || err1 != nil || err2 != nil || off < 0 {
		return ConsoleCursor{}, fmt.Errorf("console cursor %q: want INODE.OFFSET", s)
	}
	return ConsoleCursor{Ino: ino, Off: off}, nil
}

// readConsoleSince reads the ring at path (console.log, console.log.1)
// after from, or all of it from the zero cursor, keeping the last limit
// bytes; cut says that bytes before those were left out (also when from
// is older than the ring's oldest half). next is the cursor of the end.
func readConsoleSince(path string, from ConsoleCursor, limit int64) (b []byte, cut bool, next ConsoleCursor, err error) {
	cur, err := os.Open(path)
	if err != nil {
		return nil, false, next, err
	}
	defer cur.Close()
	ino, size, err := inodeSize(cur)
	if err != nil {
		return nil, false, next, err
	}
	next = ConsoleCursor{Ino: ino, Off: size}
	parts := []*io.SectionReader{}
	if from.Ino == ino && from.Off <= size {
		parts = append(parts, io.NewSectionReader(cur, from.Off, size-from.Off))
	} else {
		start := int64(0)
		old, err := os.Open(path + ".1")
		switch {
		case err == nil:
			defer old.Close()
			oino, osize, err := inodeSize(old)
			if err != nil {
				return nil, false, next, err
			}
			if from.Ino == oino && from.Off <= osize {
				start = from.Off
			} else {
				cut = from != (ConsoleCursor{})
			}
			parts = append(parts, io.NewSectionReader(old, start, osize-start))
		case errors.Is(err, fs.ErrNotExist):
			cut = from != (ConsoleCursor{})
		default:
			return nil, false, next, err
		}
		parts = append(parts, io.NewSectionReader(cur, 0, size))
	}
	var total int64
	for _, p := range parts {
		total += p.Size()
	}
	skip := max(total-limit, 0)
	cut = cut || skip > 0
	for _, p := range parts {
		n := p.Size()
		if skip >= n {
			skip -= n
			continue
		}
		chunk := make([]byte, n-skip)
		if _, err := p.ReadAt(chunk, skip); err != nil && !errors.Is(err, io.EOF) {
			return nil, false, next, err
		}
		skip = 0
		b = append(b, chunk...)
	}
	return b, cut, next, nil
}

func inodeSize(f *os.File) (uint64, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("%s: no inode", f.Name())
	}
	return sys.Ino, st.Size(), nil
}
