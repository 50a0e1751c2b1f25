package runtime_test

import (
	"bufio"
	"bytes"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A guest agent of an earlier Platform, without CapStopPrepare, syncs on
// a stop but freezes nothing: the node stops it all the same and says in
// its log that the stop did not confirm the host flush (the upgrade
// seed's line). The guest here is a current one whose handshake reply
// loses the capability on its way to the node.
func TestStopWithoutPrepareCapabilityWarns(t *testing.T) {
	h := newHarness(t)
	inst := platformFixture(t)
	ctx := testCtx(t, 3*time.Minute)
	cfg := runtime.GuestConn(h.config(), func(c net.Conn) net.Conn { return &dropCapConn{Conn: c, drop: guestproto.CapStopPrepare} })
	rt, err := runtime.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	const id = "old-agent"
	if _, err := rt.Start(ctx, runtime.Spec{InstanceID: id, Installation: inst, VCPUs: 1, MemoryMiB: 256}); err != nil {
		t.Fatal(err)
	}
	c, err := rt.Guest(id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Info().Has(guestproto.CapStopPrepare) {
		t.Fatal("the node sees the guest's stop_prepare capability: the test would prove nothing")
	}
	if err := rt.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if st, _ := rt.Status(id); st.State != runtime.StateStopped {
		t.Errorf("after the stop: %+v", st)
	}
	if got := h.logs.entries("stop did not confirm the host flush"); len(got) != 1 || got[0]["instance_id"] != id {
		t.Errorf("log entries %v; want one naming %s", got, id)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// dropCapConn is a connection to a guest agent whose handshake reply
// arrives without the capability drop: it reads the nonce from the
// node's hello, and rewrites the reply carrying it.
type dropCapConn struct {
	net.Conn
	drop string

	mu    sync.Mutex
	nonce string
	br    *bufio.Reader
	ready bytes.Buffer // the rewritten reply, read before the rest
	done  bool
}

func (c *dropCapConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.nonce == "" && len(p) == guestproto.HelloSize {
		if h, err := guestproto.ParseHello(p); err == nil {
			c.nonce = h.NonceString()
		}
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *dropCapConn) Read(p []byte) (int, error) {
	// Locked for the handshake only: yamux writes while a read waits.
	c.mu.Lock()
	if c.br == nil {
		c.br = bufio.NewReaderSize(c.Conn, guestproto.HandshakeBufferSize)
	}
	if !c.done && c.nonce != "" {
		c.done = true
		info, _, err := guestproto.ReadInfo(c.br, c.nonce)
		if err != nil {
			c.mu.Unlock()
			return 0, err
		}
		info.Capabilities = slices.DeleteFunc(info.Capabilities, func(x string) bool { return x == c.drop })
		b, err := guestproto.MarshalInfo(info)
		if err != nil {
			c.mu.Unlock()
			return 0, err
		}
		c.ready.Write(b)
	}
	if c.ready.Len() > 0 {
		defer c.mu.Unlock()
		return c.ready.Read(p)
	}
	br := c.br
	c.mu.Unlock()
	return br.Read(p)
}
