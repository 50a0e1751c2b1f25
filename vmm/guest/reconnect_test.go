package guest

import (
	"bufio"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A node that dies mid-frame leaves the agent's channel at EOF; the next
// connection starts with bytes left over from the old one in both
// directions (QEMU chardev behaviour) and must still get a session.
func TestReconnectAfterBrokenSession(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	host1 := h.plug()
	c1 := h.dialOn(host1)
	if _, err := c1.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// A yamux data header promising 100 bytes, then 10 of them: the guest
	// is inside a frame when the node disappears.
	host1.Write([]byte{0, 0, 0, 1, 0, 0, 0, 99, 0, 0, 0, 100})
	host1.Write([]byte("0123456789"))
	host1.Close()

	stale, _ := guestproto.MarshalInfo(guestproto.GuestInfo{Nonce: "an-old-nonce", Protocol: 1})
	host2 := h.plug([]byte("\x00\x00\x00\x00yamux go-away KIBOINFO"), stale)
	host2.Write([]byte("stale bytes for the guest KIBOHELO\x00\x01"))
	c2 := h.dialOn(host2)
	out, _, exit := run(t, c2, nil, "echo", "again")
	if out != "again\n" || exit.ExitCode != 0 {
		t.Fatalf("after reconnect: %q %+v", out, exit)
	}
	select {
	case <-c1.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the first client did not notice its session ended")
	}
}

// A node that reconnects over a channel that never reported EOF sends its
// hello into the middle of the old session; the agent must answer it.
func TestNewHelloDuringSession(t *testing.T) {
	h := startAgent(t, Options{ReapOrphans: true})
	host := h.plug()
	// First session: handshake by hand, then abandon it without a word.
	hello, _ := guestproto.NewHello(1, 1)
	host.Write(hello.Marshal())
	br := bufio.NewReaderSize(host, guestproto.HandshakeBufferSize)
	if _, _, err := guestproto.ReadInfo(br, hello.NonceString()); err != nil {
		t.Fatal(err)
	}
	// Second node on the same byte stream.
	c := h.dialOn(host)
	if _, err := c.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	out, _, _ := run(t, c, nil, "echo", "ok")
	if out != "ok\n" {
		t.Fatalf("exec over the new session: %q", out)
	}
	if n := strings.Count(h.logs.String(), "guest agent session started"); n != 2 {
		t.Fatalf("%d sessions on one channel, want 2", n)
	}
}

func TestVersionMismatchRefused(t *testing.T) {
	h := startAgent(t, Options{MinProtocol: 3, MaxProtocol: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := guestproto.DialWith(ctx, h.plug(), guestproto.DialOptions{MinProtocol: 1, MaxProtocol: 2})
	var verr *guestproto.VersionError
	if !errors.As(err, &verr) || err.Error() != "guest agent speaks protocol 3..3, this node speaks 1..2: upgrade this node" {
		t.Fatalf("node side: %v", err)
	}
	testenv.WaitFor(t, 20*time.Second, "the agent's refusal in its log", func() (bool, string) {
		return strings.Contains(h.logs.String(), "node speaks protocol 1..2, this guest agent speaks 3..3: upgrade the node"), ""
	})
	// The agent keeps waiting: a node that speaks 3 gets in.
	c, err := guestproto.DialWith(ctx, h.plug(), guestproto.DialOptions{MinProtocol: 1, MaxProtocol: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Info().Protocol != 3 {
		t.Fatalf("negotiated %d, want 3", c.Info().Protocol)
	}
}
