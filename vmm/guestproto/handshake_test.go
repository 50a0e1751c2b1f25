package guestproto

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestHelloSkipsGarbage(t *testing.T) {
	h, err := NewHello(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := NewHello(1, 1)
	corrupt := stale.Marshal()
	corrupt[20] ^= 0xff // checksum no longer holds
	var in bytes.Buffer
	in.WriteString("yamux leftovers KIBO KIBOHELO")
	in.Write(corrupt)
	in.Write([]byte{0, 0, 0, 12, 1, 2})
	in.Write(h.Marshal())
	in.WriteString("after")
	br := bufio.NewReaderSize(&in, HandshakeBufferSize)
	got, skipped, err := ReadHello(br)
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Fatalf("got %+v, want %+v", got, h)
	}
	if skipped == 0 {
		t.Fatal("no garbage reported skipped")
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "after" {
		t.Fatalf("bytes after the hello: %q", rest)
	}
}

func TestInfoSkipsStaleReplies(t *testing.T) {
	old, _ := MarshalInfo(GuestInfo{Nonce: "old", Protocol: 1})
	cur, _ := MarshalInfo(GuestInfo{Nonce: "new", Protocol: 1, BootID: "b"})
	var in bytes.Buffer
	in.WriteString("\x00\x00garbageKIBOINFO\xff\xff\xff\xff")
	in.Write(old)
	in.Write(cur[:len(cur)-1]) // broken copy
	in.Write(cur)
	info, _, err := ReadInfo(bufio.NewReaderSize(&in, HandshakeBufferSize), "new")
	if err != nil {
		t.Fatal(err)
	}
	if info.BootID != "b" {
		t.Fatalf("got %+v", info)
	}
}

func TestLastHello(t *testing.T) {
	a, _ := NewHello(1, 1)
	b, _ := NewHello(1, 2)
	buf := append(append(append([]byte("xx"), a.Marshal()...), "yy"...), b.Marshal()...)
	i := LastHello(buf)
	if i < 0 {
		t.Fatal("no hello found")
	}
	if h, _ := ParseHello(buf[i : i+HelloSize]); h != b {
		t.Fatal("did not find the last hello")
	}
	if LastHello(buf[:len(buf)-1]) != 2 {
		t.Fatal("a cut hello was taken")
	}
}

// handshakePair runs Dial against AcceptHandshake over net.Pipe.
func handshakePair(t *testing.T, nodeMin, nodeMax, guestMin, guestMax int) (hostErr, guestErr error) {
	t.Helper()
	host, guest := net.Pipe()
	defer guest.Close()
	done := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(guest, HandshakeBufferSize)
		_, err := AcceptHandshake(br, guest, GuestInfo{Capabilities: []string{CapExec}}, guestMin, guestMax)
		done <- err
		if err == nil {
			io.Copy(io.Discard, guest) // let the client's yamux run
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialWith(ctx, host, DialOptions{MinProtocol: nodeMin, MaxProtocol: nodeMax})
	if err == nil {
		if c.Info().Protocol != min(nodeMax, guestMax) || !c.Info().Has(CapExec) {
			t.Errorf("info %+v", c.Info())
		}
		c.Close()
	}
	return err, <-done
}

func TestHandshakeVersions(t *testing.T) {
	if h, g := handshakePair(t, 1, 2, 1, 3); h != nil || g != nil {
		t.Fatalf("overlapping ranges refused: host %v, guest %v", h, g)
	}
	h, g := handshakePair(t, 1, 2, 3, 3)
	var verr *VersionError
	if !errors.As(h, &verr) || h.Error() != "guest agent speaks protocol 3..3, this node speaks 1..2: upgrade this node" {
		t.Fatalf("host error: %v", h)
	}
	if !errors.As(g, &verr) || g.Error() != "node speaks protocol 1..2, this guest agent speaks 3..3: upgrade the node" {
		t.Fatalf("guest error: %v", g)
	}
	h, g = handshakePair(t, 4, 5, 1, 2)
	if h == nil || !strings.HasSuffix(h.Error(), "upgrade the guest agent") {
		t.Fatalf("host error: %v", h)
	}
	if g == nil || !strings.HasSuffix(g.Error(), "upgrade this guest agent") {
		t.Fatalf("guest error: %v", g)
	}
}

func TestDialHonoursContext(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	go io.Copy(io.Discard, guest) // a guest that never answers
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, host); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

func FuzzReadHello(f *testing.F) {
	h, _ := NewHello(1, 3)
	f.Add(h.Marshal())
	f.Add(append([]byte("garbageKIBOHELO"), h.Marshal()...))
	f.Add(h.Marshal()[:20])
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseHello(b)
		LastHello(b)
		got, _, err := ReadHello(bufio.NewReaderSize(bytes.NewReader(b), HandshakeBufferSize))
		if err == nil && (got.Min < 1 || got.Max < got.Min) {
			t.Fatalf("accepted bad range %+v", got)
		}
	})
}

func FuzzReadInfo(f *testing.F) {
	good, _ := MarshalInfo(GuestInfo{Nonce: "n", Protocol: 1, Capabilities: []string{"exec"}})
	f.Add(good)
	f.Add(append([]byte("KIBOINFO\x00\x00\x00\x10"), good...))
	f.Add([]byte("KIBOINFO\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ReadInfo(bufio.NewReaderSize(bytes.NewReader(b), HandshakeBufferSize), "n")
	})
}

// With Resend, an unanswered hello is followed by another on the same
// connection, and only the answer to the last one sent is taken: the
// guest answers every hello it reads, each answer ending the session the
// one before began.
func TestDialResendsOnTheSameConnection(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	hellos := make(chan string, 2)
	go func() {
		br := bufio.NewReaderSize(guest, HandshakeBufferSize)
		first, _, err := ReadHello(br) // lost: the guest's port dropped it
		if err != nil {
			return
		}
		hellos <- first.NonceString()
		second, _, err := ReadHello(br)
		if err != nil {
			return
		}
		hellos <- second.NonceString()
		// The first one reaches the guest late after all: both are
		// answered, in order.
		for _, h := range []Hello{first, second} {
			b, _ := MarshalInfo(GuestInfo{Nonce: h.NonceString(), Protocol: 1, MinProtocol: 1, MaxProtocol: 1, BootID: "b"})
			if _, err := guest.Write(b); err != nil {
				return
			}
		}
		io.Copy(io.Discard, guest) // let the client's yamux run
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := DialWith(ctx, host, DialOptions{Resend: 50 * time.Millisecond, ResendMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first, second := <-hellos, <-hellos
	if first == second || c.Info().Nonce != second {
		t.Fatalf("took the answer to hello %s; sent %s, then %s: want the last", c.Info().Nonce, first, second)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("the second hello went after %v, want the Resend interval", took)
	}
}
