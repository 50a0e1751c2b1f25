package guest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// firstHelloTimeout is how long the node's runtime waits for the answer to
// its first hello before it sends another.
const firstHelloTimeout = 2 * time.Second

// The node is killed while the guest is blocked writing to it (a reply the
// node never read): the write stays blocked until a new node connects. The
// new node's hello reaches the guest's port before that write completes; it
// must be answered, not discarded with the port.
func TestFirstHelloAnsweredAfterKillDuringWrite(t *testing.T) {
	port := newFakePort()
	logs := startAgentOnPort(t, port)
	host1 := port.connect(nil)
	c1, err := dialFake(t, host1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	port.set(func(p *fakePort) { p.holdWrites = true })
	go c1.GuestInfo(ctxT(t)) // its reply blocks in the guest
	testenv.WaitFor(t, 20*time.Second, "a blocked guest write", func() (bool, string) {
		return port.get(func(p *fakePort) bool { return p.writesHeld > 0 }), port.String()
	})

	host1.Close() // kill -9: the pending read sees EOF
	testenv.WaitFor(t, 20*time.Second, "the agent to see the EOF", func() (bool, string) {
		return port.get(func(p *fakePort) bool { return p.readsInFlight == 0 }), port.String()
	})
	// The session ends, its reply's write still blocked: where the agent
	// used to close the port, and the close, once the write returned,
	// discarded the next node's hello.
	testenv.WaitFor(t, 20*time.Second, "the agent to end the session", func() (bool, string) {
		return strings.Contains(logs.String(), `msg="guest agent session ended"`), port.String()
	})

	port.set(func(p *fakePort) { p.releaseOnData = true; p.chunk = 7 })
	host2 := port.connect([]byte("\x00\x00 stale bytes from the old session KIBOHE"))
	start := time.Now()
	c2, err := dialFake(t, host2, firstHelloTimeout)
	if err != nil {
		t.Fatalf("first hello of the reconnecting node: %v (discarded %d bytes)", err,
			port.discarded)
	}
	t.Logf("first hello answered in %v", time.Since(start))
	port.set(func(p *fakePort) { p.chunk = 0 })
	if _, err := c2.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// The node disappears in a way the pending read does not notice (it stays
// blocked) while a write fails: the session ends with a read in flight. The
// new node's hello, split across reads and glued to stale bytes, is what
// that read returns; it must be answered.
func TestFirstHelloAnsweredAfterSessionEndedWithReadInFlight(t *testing.T) {
	port := newFakePort()
	port.quietDisc, port.writeErrDisc = true, true
	logs := startAgentOnPort(t, port)
	host1 := port.connect(nil)
	c1, err := dialFake(t, host1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	port.set(func(p *fakePort) { p.holdWrites = true })
	go c1.GuestInfo(ctxT(t))
	testenv.WaitFor(t, 20*time.Second, "a blocked guest write with a read pending", func() (bool, string) {
		return port.get(func(p *fakePort) bool { return p.writesHeld > 0 && p.readsInFlight > 0 }), port.String()
	})
	host1.Close() // the blocked write fails; the read stays pending
	testenv.WaitFor(t, 20*time.Second, "the failed write", func() (bool, string) {
		return port.get(func(p *fakePort) bool { return p.writesInFlight == 0 }), port.String()
	})
	// The failed write ends the session, with the read still pending.
	testenv.WaitFor(t, 20*time.Second, "the agent to end the session", func() (bool, string) {
		return strings.Contains(logs.String(), `msg="guest agent session ended"`), port.String()
	})

	port.set(func(p *fakePort) { p.holdWrites = false; p.chunk = 16 })
	host2 := port.connect([]byte("stale yamux bytes"))
	c2, err := dialFake(t, host2, firstHelloTimeout)
	if err != nil {
		t.Fatalf("first hello of the reconnecting node: %v (discarded %d bytes)", err, port.discarded)
	}
	port.set(func(p *fakePort) { p.chunk = 0 })
	if _, err := c2.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// Plain reconnects: the disconnect shows as EOF or as a read error, or not
// at all (quiet: the node is back before the agent noticed, so its hello
// arrives in the middle of the old session); the agent may be between
// opens; the hello is split across reads and glued to stale bytes.
func TestFirstHelloAnsweredAfterDisconnect(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		for _, discErr := range []error{nil, errors.New("fake port: EIO")} {
			for _, chunk := range []int{0, 1, 5} {
				t.Run(fmt.Sprintf("quiet=%v/err=%v/chunk=%d", quiet, discErr, chunk), func(t *testing.T) {
					port := newFakePort()
					port.discErr, port.quietDisc = discErr, quiet
					logs := startAgentOnPort(t, port)
					for round := range 3 {
						host := port.connect([]byte("KIBOHELO\x00\x01 stale"))
						port.set(func(p *fakePort) { p.chunk = chunk })
						c, err := dialFake(t, host, firstHelloTimeout)
						if err != nil {
							t.Fatalf("round %d: %v (discarded %d bytes, %d opens)", round, err, port.discarded, port.opens)
						}
						port.set(func(p *fakePort) { p.chunk = 0 })
						if _, err := c.GuestInfo(ctxT(t)); err != nil {
							t.Fatalf("round %d: %v", round, err)
						}
						host.Close()
						if round == 1 && quiet {
							// Nothing to wait for: the agent does not see a
							// quiet disconnect. The node comes back a while
							// later instead of at once.
							time.Sleep(100 * time.Millisecond)
						} else if round == 1 {
							// The node comes back once the agent has seen
							// the disconnect and ended the session (rounds
							// 0 and 2 may come back before).
							testenv.WaitFor(t, 20*time.Second, "the agent to end the session", func() (bool, string) {
								return strings.Count(logs.String(), `msg="guest agent session ended"`) >= 2, port.String()
							})
						}
					}
				})
			}
		}
	}
}

// A node that dies in the middle of its hello leaves a cut hello behind;
// the agent neither spins on it nor misses the next node's hello.
func TestFirstHelloAnsweredAfterCutHello(t *testing.T) {
	port := newFakePort()
	logs := startAgentOnPort(t, port)
	h1, _ := guestproto.NewHello(1, 1)
	host1 := port.connect(nil)
	host1.Write(h1.Marshal()[:20])
	testenv.WaitFor(t, 20*time.Second, "the agent to read the cut hello", func() (bool, string) {
		// Not only no unread bytes: before the agent's first open the
		// bytes wait in QEMU (waiting), not in the port.
		return port.get(func(p *fakePort) bool { return p.opens > 0 && len(p.waiting) == 0 && len(p.inbuf) == 0 }), port.String()
	})
	host1.Close()
	testenv.WaitFor(t, 20*time.Second, "the agent to reopen the port after the disconnect", func() (bool, string) {
		return port.get(func(p *fakePort) bool { return p.opens >= 2 }), port.String()
	})
	// Not a wait for something: the time in which an agent spinning on the
	// cut hello would reopen the port far more often than its backoff
	// (from 20 ms) lets it, checked below.
	time.Sleep(50 * time.Millisecond)
	c, err := dialFake(t, port.connect(h1.Marshal()[:13]), firstHelloTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GuestInfo(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), "handshake failed"); n > 0 {
		t.Fatalf("%d failed handshakes logged", n)
	}
	if opens := port.get(func(p *fakePort) bool { return p.opens > 20 }); opens {
		t.Fatalf("the agent reopened the port %d times in 50ms", port.opens)
	}
}
