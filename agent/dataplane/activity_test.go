package dataplane

import (
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testenv"
)

// The hello says, per Instance, how many connections are bound to it now
// and how many ever were, so the node sees a connection that came and
// went between two looks; an Instance that is no longer a target and has
// no connection left is forgotten.
func TestHelloCountsInstanceConnections(t *testing.T) {
	p := newPKI(t, "node-a")
	dir := t.TempDir()
	sockA, sockB := startGuest(t, dir, "inst-a"), startGuest(t, dir, "inst-b")
	s := startServer(t, time.Second)
	ta := Target{WorkspaceID: "ws-a", InstanceID: "inst-a", DataSocket: sockA}
	tb := Target{WorkspaceID: "ws-b", InstanceID: "inst-b", DataSocket: sockB}
	s.push(t, p.state(ta, tb))
	hello := func() Hello {
		t.Helper()
		h, err := AskHello(ctxT(t), s.dir, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !h.Activity {
			t.Fatalf("hello without activity: %+v", h)
		}
		return h
	}
	if h := hello(); len(h.Instances) != 0 {
		t.Fatalf("activity before any connection: %+v", h.Instances)
	}
	first := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-a"))
	second := connect(t, p, p.cred(t, s.Addr(), "ws-a", "inst-a"))
	if got := hello().Instances; got["inst-a"] != (InstanceConns{Open: 2, Bound: 2}) || len(got) != 1 {
		t.Fatalf("two connections to inst-a: %+v", got)
	}
	first.Close()
	second.Close()
	testenv.WaitFor(t, 10*time.Second, "the connections' end", func() (bool, string) {
		got := hello().Instances["inst-a"]
		return got == InstanceConns{Bound: 2}, "not yet"
	})
	s.push(t, p.state(tb))
	if got := hello().Instances; len(got) != 0 {
		t.Fatalf("activity of an Instance no longer a target: %+v", got)
	}
}
