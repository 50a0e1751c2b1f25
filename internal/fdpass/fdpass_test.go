package fdpass

import (
	"io"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pair is a connected unix stream socketpair, both ends wrapped.
func pair(t *testing.T, max int) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return NewConn(c.(*net.UnixConn), max)
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// A file sent with a message arrives as a descriptor of the same open
// file: what the receiver reads through it is what the sender wrote.
func TestSendFileOverSocketpair(t *testing.T) {
	a, b := pair(t, 2)
	f, err := os.CreateTemp(t.TempDir(), "passed")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("through the socket"); err != nil {
		t.Fatal(err)
	}
	fd, err := FileFD(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.WriteFDs([]byte("hello\n"), fd); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello\n" {
		t.Fatalf("read %q, %v; want hello", buf, err)
	}
	got := b.TakeFDs()
	if len(got) != 1 {
		t.Fatalf("received %d descriptors, want 1", len(got))
	}
	if b.TakeFDs() != nil {
		t.Fatal("descriptors handed out twice")
	}
	r := os.NewFile(uintptr(got[0]), "received")
	defer r.Close()
	// The same open file: its offset is shared, so read from the start.
	content := make([]byte, len("through the socket"))
	if n, err := r.ReadAt(content, 0); err != nil || string(content[:n]) != "through the socket" {
		t.Fatalf("received file reads %q, %v", content[:n], err)
	}
}

// More descriptors than the receiver allows is an error, and none of
// them leaks to the caller unclaimed after Close.
func TestTooManyDescriptors(t *testing.T) {
	a, b := pair(t, 1)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, _ := FileFD(f)
	if err := a.WriteFDs([]byte("x"), fd, fd, fd); err != nil {
		t.Fatal(err)
	}
	_, err = b.Read(make([]byte, 1))
	if err == nil || !strings.Contains(err.Error(), "more than 1 descriptors") {
		t.Fatalf("read: %v, want too many descriptors", err)
	}
}

// Plain bytes pass through Send without ancillary data.
func TestSendWithoutDescriptors(t *testing.T) {
	a, b := pair(t, 1)
	if err := Send(a.UnixConn, []byte("plain")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "plain" || b.TakeFDs() != nil {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// Close, as a net.Conn's, ends a Read blocked on the other side's
// silence; the reader sees an error, not a hang.
func TestCloseWhileReading(t *testing.T) {
	_, b := pair(t, 1)
	read := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 1))
		read <- err
	}()
	b.Close()
	if err := <-read; err == nil {
		t.Fatal("read on a closed connection succeeded")
	}
}
