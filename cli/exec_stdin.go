package cli

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// copyInput copies in to dst in a goroutine until in ends, then closes
// dst; stop ends the copy early (closing dst) and returns once it ended. A read of a
// terminal or a pipe cannot be interrupted (stdin is a blocking
// descriptor, and making it non-blocking would change it for the shell
// that shares it), so the copy waits in poll(2) on in and on a pipe that
// stop writes to, and reads in only once it is ready.
func copyInput(dst io.WriteCloser, in *os.File) (stop func(), err error) {
	var wake [2]int
	if err := unix.Pipe2(wake[:], unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollCopy(dst, int(in.Fd()), wake[0])
		dst.Close()
	}()
	return func() {
		unix.Write(wake[1], []byte{0})
		dst.Close() // ends a write waiting for the guest's window
		<-done
		unix.Close(wake[0])
		unix.Close(wake[1])
	}, nil
}

// pollCopy copies from fd to dst until fd ends, a write fails, or wake
// becomes readable.
func pollCopy(dst io.Writer, fd, wake int) {
	buf := make([]byte, 32<<10)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if n <= 0 || err != nil {
			return // the input ended (or failed: as an end)
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
