package dataplane

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// relayBufSize is the copy buffer of one relay direction: as large as the
// guest client's file chunks' write buffer, so a chunk is rarely split.
const relayBufSize = 256 << 10

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// relay copies client and guest streams into each other until both
// directions ended. A clean EOF on one side is passed on as a half-close
// (Close on a yamux stream sends FIN and leaves the read side open), so
// calls whose peer finishes sending first (file-write data, stdin, a
// forwarded TCP connection) keep working. An error in either direction, or
// abort closing, ends both streams at once.
//
// in and out count the bytes written to the guest and to the client.
func relay(client, guest net.Conn, abort <-chan struct{}, in, out *atomic.Uint64) {
	done := make(chan struct{})
	watched := make(chan struct{})
	defer func() {
		close(done)
		<-watched
	}()
	kill := sync.OnceFunc(func() {
		// A past deadline unblocks a copy stuck in Read or Write.
		past := time.Unix(1, 0)
		client.SetDeadline(past)
		guest.SetDeadline(past)
		client.Close()
		guest.Close()
	})
	go func() {
		defer close(watched)
		select {
		case <-abort:
			kill()
		case <-done:
		}
	}()
	errc := make(chan error, 2)
	pipe := func(dst, src net.Conn, n *atomic.Uint64) {
		bp := relayBufs.Get().(*[]byte)
		defer relayBufs.Put(bp)
		_, err := io.CopyBuffer(countingWriter{dst, n}, src, *bp)
		if err == nil {
			err = dst.Close() // pass the EOF on
		}
		errc <- err
	}
	go pipe(guest, client, in)
	go pipe(client, guest, out)
	for range 2 {
		if err := <-errc; err != nil {
			kill()
		}
	}
	kill()
}

// countingWriter adds what it writes to n as it goes, so a long stream
// shows in the counters while it runs.
type countingWriter struct {
	w net.Conn
	n *atomic.Uint64
}

func (c countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(uint64(k))
	return k, err
}
