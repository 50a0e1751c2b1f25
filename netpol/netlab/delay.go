package netlab

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// WireDelayed joins a and b like Wire, but through a user-space wire that
// holds every frame for oneWay before passing it on: a network with a
// round trip of 2×oneWay, for benchmarks that must show what happens
// when the far end is not next door. The kernel here has no netem qdisc,
// so the wire is a TAP device on each side and a relay between their file
// descriptors in this process. The devices live as long as those
// descriptors: they are closed, and the devices gone, at cleanup.
//
// Go's timers wake the relay up to about a millisecond late, so a frame
// is held between oneWay and about oneWay+1 ms; a benchmark states the
// round trip it measured (e.g. with a TCP connect) beside its figures.
func (l *Lab) WireDelayed(a, aName, aAddr, b, bName, bAddr string, oneWay time.Duration) {
	l.t.Helper()
	fa, fb := l.tap(a, aName), l.tap(b, bName)
	var lines sync.WaitGroup
	l.t.Cleanup(func() {
		fa.Close() // ends both lines: reads and writes of a closed TAP fail
		fb.Close()
		lines.Wait()
	})
	l.configure(a, aName, aAddr)
	l.configure(b, bName, bAddr)
	lines.Go(func() { delayLine(fa, fb, oneWay) })
	lines.Go(func() { delayLine(fb, fa, oneWay) })
}

// tap makes a TAP device (frames without a packet-information header) in
// namespace ns and returns its descriptor, non-blocking so that reads
// wait in Go's poller rather than on a thread.
func (l *Lab) tap(ns, name string) *os.File {
	l.t.Helper()
	var f *os.File
	err := l.Do(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(name)
		if err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	if err != nil {
		l.t.Fatalf("netlab: TAP device %s in %s: %v", name, ns, err)
	}
	return f
}

// delayLine passes the frames read from src to dst, each oneWay after it
// was read, in order, until either side is closed.
func delayLine(src, dst *os.File, oneWay time.Duration) {
	type frame struct {
		b   []byte
		due time.Time
	}
	q := make(chan frame, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		for f := range q {
			if d := time.Until(f.due); d > 0 {
				time.Sleep(d)
			}
			dst.Write(f.b) // fails once closed at cleanup; the reader ends then
		}
	})
	buf := make([]byte, 1<<16)
	for {
		n, err := src.Read(buf)
		if err != nil {
			break
		}
		q <- frame{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(oneWay)}
	}
	close(q)
	wg.Wait()
}
