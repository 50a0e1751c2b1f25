package ctrl

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// fakeCluster is a member whose state is an empty FSM and whose other
// voter, when block is set, holds the lead that asks its level until the
// lead is cancelled and the test releases it. It records what the leader did, in order, and
// notes a lead that began while another was still running.
type fakeCluster struct {
	f       *fsm.FSM
	block   bool
	entered chan struct{} // a blocking ask began
	ended   chan struct{} // a blocking ask saw its lead cancelled
	release chan struct{} // lets a cancelled ask return

	mu      sync.Mutex
	events  []string
	leading int // leads between their barrier and their end
	overlap bool
}

func newFake(t *testing.T, block bool) *fakeCluster {
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &fakeCluster{f: f, block: block, entered: make(chan struct{}), ended: make(chan struct{}), release: make(chan struct{})}
}

func (c *fakeCluster) note(e string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
}

func (c *fakeCluster) log() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

func (c *fakeCluster) Barrier(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leading++
	if c.leading > 1 {
		c.overlap = true
	}
	c.events = append(c.events, "barrier")
	return nil
}

func (c *fakeCluster) CaughtUp(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		c.leading--
	}
	c.events = append(c.events, map[bool]string{true: "caught up", false: "lead ended"}[ok])
}

func (c *fakeCluster) AskLevel(ctx context.Context, addr string) (MemberLevel, error) {
	if !c.block {
		return MemberLevel{}, api.Errorf(api.CodeUnavailable, "member at %s is not reachable in this test", addr)
	}
	c.entered <- struct{}{}
	<-ctx.Done()
	c.ended <- struct{}{}
	<-c.release
	c.note("ask returned")
	return MemberLevel{}, ctx.Err()
}

func (c *fakeCluster) CloseSessions() { c.note("sessions closed") }

func (c *fakeCluster) ApplyOp(ctx context.Context, op string, args any) (fsm.Result, error) {
	return fsm.Result{Value: []byte(`{}`)}, nil
}
func (c *fakeCluster) Apply(ctx context.Context, e fsm.Entry) (fsm.Result, error) {
	return fsm.Result{}, nil
}
func (c *fakeCluster) View(fn func(tx *bolt.Tx) error) error { return c.f.View(fn) }
func (c *fakeCluster) Servers() ([]RaftServer, error) {
	return []RaftServer{{ID: "n1", Address: "n1:7000", Voter: true}, {ID: "n2", Address: "n2:7000", Voter: true}}, nil
}
func (c *fakeCluster) RemoveServer(string)                   {}
func (c *fakeCluster) SessionAttached(node, sid string) bool { return true }
func (c *fakeCluster) ExportTransfer(context.Context, *api.Node, api.TransferExportTask) (api.TransferExportResult, error) {
	return api.TransferExportResult{}, nil
}
func (c *fakeCluster) ExportProgress(context.Context, *api.Node, string) (api.TransferProgress, error) {
	return api.TransferProgress{}, nil
}
func (c *fakeCluster) RemoveArchive(context.Context, *api.Transfer) error { return nil }
func (c *fakeCluster) MemberTrust(context.Context, *api.Node) (api.MemberTrust, error) {
	return api.MemberTrust{}, nil
}
func (c *fakeCluster) ClusterCA() *x509.Certificate { return nil }

// run starts a Leader over c; leadership is unbuffered, so a send returns
// once Run has taken it. done closes when Run has returned.
func run(t *testing.T, c *fakeCluster) (leadership chan bool, stop context.CancelFunc, done chan struct{}) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l := New(Config{NodeID: "n1", Cluster: c, Levels: NewLevels(c, log, MemberLevel{NodeID: "n1", Level: fsm.FeatureLevel}), Log: log,
		Timings: Timings{SessionPing: time.Millisecond, SessionTimeout: time.Hour, CommandExpiry: time.Hour}})
	ctx, cancel := context.WithCancel(t.Context())
	leadership, done = make(chan bool), make(chan struct{})
	go func() { defer close(done); l.Run(ctx, leadership) }()
	t.Cleanup(func() { cancel(); <-done })
	return leadership, cancel, done
}

// wait fails the test if ch says nothing within a minute (a hung leader).
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("no %s within a minute", what)
	}
}

// A member that steps down and is elected again starts its new lead only
// once every service of the previous one has returned, and closes the
// control sessions in between (their nodes reconnect to the new leader).
func TestStepDownWaitsForTheLeadBeforeTheNext(t *testing.T) {
	c := newFake(t, true)
	leadership, _, _ := run(t, c)
	leadership <- true
	wait(t, c.entered, "first lead")
	leadership <- false
	wait(t, c.ended, "cancellation of the first lead")
	elected := make(chan struct{})
	go func() { leadership <- true; close(elected) }()
	c.release <- struct{}{}
	wait(t, elected, "second election taken")
	wait(t, c.entered, "second lead")
	want := []string{"barrier", "caught up", "ask returned", "lead ended", "sessions closed", "barrier", "caught up"}
	if got := c.log(); !slices.Equal(got, want) {
		t.Fatalf("leader did:\n  %s\nwant:\n  %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	leadership <- false
	wait(t, c.ended, "cancellation of the second lead")
	c.release <- struct{}{}
}

// Run returns on shutdown only once the lead's services have returned.
func TestShutdownWaitsForTheLead(t *testing.T) {
	c := newFake(t, true)
	leadership, stop, done := run(t, c)
	leadership <- true
	wait(t, c.entered, "lead")
	stop()
	wait(t, c.ended, "cancellation of the lead")
	select {
	case <-done:
		t.Fatal("Run returned while the lead's ask of a voter's level still ran")
	default:
	}
	c.release <- struct{}{}
	wait(t, done, "return of Run")
	want := []string{"barrier", "caught up", "ask returned", "lead ended"}
	if got := c.log(); !slices.Equal(got, want) {
		t.Fatalf("leader did:\n  %s\nwant:\n  %s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
}

// Leadership that flaps never runs two leads at once, and a repeated
// notification starts no second lead.
func TestFlappingLeadershipRunsOneLeadAtATime(t *testing.T) {
	c := newFake(t, false)
	leadership, stop, done := run(t, c)
	for range 50 {
		leadership <- true
		leadership <- true
		leadership <- false
	}
	leadership <- true
	stop()
	wait(t, done, "return of Run")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.overlap || c.leading != 0 {
		t.Fatalf("leads overlapped: %v; leads still running after Run returned: %d", c.overlap, c.leading)
	}
}
