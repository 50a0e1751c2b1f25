package guest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// openPTYIn opens a pseudo-terminal pair from the devpts instance that a
// process chrooted into root sees at /dev/pts. Every devpts mount is an
// instance of its own: a pair from the agent's /dev/pts has no name in a
// Workspace's, so tty(1), ttyname(3) and what needs them (tmux, screen,
// ssh, sudo) fail there with "not a tty". A root without a devpts of its
// own, and no root, get the agent's (/dev/ptmx).
//
// The master is always opened through the runtime poller: closing it must
// end a read of it in progress, or an exec whose background job keeps the
// terminal open would not end until that job does (creack/pty's Open
// gives a blocking descriptor).
func openPTYIn(root string) (master, slave *os.File, err error) {
	ptmx := "/dev/ptmx"
	if root != "" {
		ptmx = filepath.Join(root, "dev", "pts", "ptmx")
	}
	master, err = os.OpenFile(ptmx, os.O_RDWR|syscall.O_NOCTTY, 0)
	if root != "" && errors.Is(err, os.ErrNotExist) {
		return openPTYIn("")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", ptmx, err)
	}
	var n uint32
	var sfd int
	var ioErr error
	rc, err := master.SyscallConn()
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty of %s: %w", ptmx, err)
	}
	ctlErr := rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			ioErr = fmt.Errorf("unlock: %w", ioErr)
			return
		}
		if n, ioErr = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN); ioErr != nil {
			ioErr = fmt.Errorf("number: %w", ioErr)
			return
		}
		// The peer by descriptor, not by path: no name to race for.
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
		if errno != 0 {
			ioErr = fmt.Errorf("open the peer: %w", errno)
			return
		}
		sfd = int(r)
	})
	if err := errors.Join(ctlErr, ioErr); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty of %s: %w", ptmx, err)
	}
	return master, os.NewFile(uintptr(sfd), "/dev/pts/"+strconv.FormatUint(uint64(n), 10)), nil
}

// setWinSize sets a terminal's window size through the runtime poller's
// descriptor: File.Fd (which pty.Setsize calls) would switch the master
// to blocking mode for good, and closing it would then no longer end a
// read in progress.
func setWinSize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ioErr
}
