package cli

import (
	"errors"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// forwardSignals passes SIGINT/SIGTERM/SIGHUP to the guest process while
// it runs (with a PTY, Ctrl-C arrives as a byte instead).
func forwardSignals(p *guestproto.Process, tty bool) func() {
	ch := make(chan os.Signal, 4)
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGHUP}
	if !tty {
		sigs = append(sigs, syscall.SIGINT)
	}
	signal.Notify(ch, sigs...)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case s := <-ch:
				p.Signal(s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done); <-ended }
}

func forwardResize(f *os.File, p *guestproto.Process) func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
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
	return func() { signal.Stop(ch); close(done); <-ended }
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
