package dataplane

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kibotos/kibotos/vmm/guestproto"
)

// TestLentSessionEndedWithLender: a stream opened on a lent session whose
// lender already closed it, before anything noticed the close, fails with
// errLentEnded and ends the session's Done, so the connection moves on to
// the link's next session instead of answering "session shutdown". (CI
// once saw that answer in TestThirdSwitchEndsTheDrainingOne: the exec
// after the lender's end came before the watcher of CloseChan ran.)
func TestLentSessionEndedWithLender(t *testing.T) {
	a, b := net.Pipe()
	client, err := yamux.Client(a, sessionConfig())
	if err != nil {
		t.Fatal(err)
	}
	server, err := yamux.Server(b, sessionConfig())
	if err != nil {
		t.Fatal(err)
	}
	ls := &lentSession{sess: client, done: make(chan struct{})}
	server.Close()
	waitClosed(t, client.CloseChan(), 5*time.Second, "the borrower's side to see the lender's close")

	_, _, err = ls.open(ctxT(t), guestproto.Request{Call: guestproto.CallExec})
	if !errors.Is(err, errLentEnded) || !movedOn(err) {
		t.Fatalf("open on a session its lender closed = %v; want errLentEnded", err)
	}
	select {
	case <-ls.Done():
	default:
		t.Fatal("the session's Done is still open after its lender closed it")
	}
}
