package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
)

// syncBuffer collects the members' logs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the log lines containing every one of subs.
func (b *syncBuffer) lines(subs ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

func halted(m *clustertest.Member) bool {
	select {
	case <-m.Server.Halted():
		return true
	default:
		return false
	}
}

func appendEntry(t *testing.T, m *clustertest.Member, e fsm.Entry) (errc chan error, resp func() interface{}) {
	t.Helper()
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	f := m.Server.Raft().Apply(data, 10*time.Second)
	errc = make(chan error, 1)
	go func() { errc <- f.Error() }()
	return errc, f.Response
}

// An entry with an operation this release does not know, without
// IgnoreUnknown, stops every member at that entry instead of recording an
// error result; restarted without an upgrade, they stop at it again.
func TestUnknownOpHaltsEveryMember(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	o := clustertest.Options{Ctrl: 3, Logs: &logs}
	c := clustertest.New(t, o)
	leader := c.WaitLeader()
	applied := make(chan error, 1)
	go func() {
		res, err := leader.Server.Apply(context.Background(), fsm.Entry{Op: "future.op", Args: json.RawMessage(`{}`), Actor: "test"})
		if err == nil {
			t.Errorf("the unknown entry was answered with %+v", res)
		}
		applied <- err
	}()

	want := `has operation \"future.op\", which this kibotos (release ` + buildinfo.ReleaseName() + `) does not know; upgrade this member to the release of the leader`
	// A member halts once it learns the entry is committed. The members
	// that learn it stop, so a last one may never hear of the commit (no
	// quorum is left to tell it): that one has not drifted either, as long
	// as it has not applied the entry and does not lead. So: a majority
	// halts, and every other member is behind the entry and not leading.
	entryIndex := func() uint64 {
		for _, m := range c.Members {
			if err := m.Server.HaltErr(); err != nil {
				var n uint64
				if _, serr := fmt.Sscanf(err.Error(), "log entry %d ", &n); serr == nil {
					return n
				}
			}
		}
		return 0
	}
	waitHalted := func(phase string) []*clustertest.Member {
		t.Helper()
		var stopped []*clustertest.Member
		clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
			stopped = nil
			for _, m := range c.Members {
				if halted(m) {
					stopped = append(stopped, m)
				}
			}
			if len(stopped) < len(c.Members)/2+1 {
				return false, fmt.Sprintf("%d of %d members halted %s", len(stopped), len(c.Members), phase)
			}
			idx := entryIndex()
			for _, m := range c.Members {
				if halted(m) {
					continue
				}
				if m.Server.IsLeader() || m.Server.Raft().AppliedIndex() >= idx {
					return false, fmt.Sprintf("%s has not halted %s but leads or applied past entry %d (raft %s)", m.ID, phase, idx, m.Server.Raft().String())
				}
			}
			return true, ""
		})
		return stopped
	}
	stopped := waitHalted("at the first apply")
	for _, m := range stopped {
		err := m.Server.HaltErr()
		if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), strings.ReplaceAll(want, `\"`, `"`)) {
			t.Errorf("%s halted with %v", m.ID, err)
		}
		if n := len(logs.lines("member="+m.ID+" ", "level=ERROR", want)); n != 1 {
			t.Errorf("%s logged the halt %d times, want once:\n%s", m.ID, n, strings.Join(logs.lines("member="+m.ID+" ", "level=ERROR"), "\n"))
		}
	}
	// The leader's write got no result, only word of the halt.
	select {
	case err := <-applied:
		if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "stopped applying the Raft log") {
			t.Errorf("write of the unknown entry: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the write of the unknown entry did not end with the member")
	}
	// No halted member serves any more.
	for _, m := range stopped {
		clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := c.Client(m).Do(ctx, "GET", "/v1/status", nil, nil)
			return err != nil, m.ID + " still answers the API"
		})
	}

	// Restarted without an upgrade: they replay the log and halt again.
	before := len(logs.lines("level=ERROR", want))
	for _, m := range c.Members {
		m.Stop()
	}
	for _, m := range c.Members {
		m.Restart(o)
	}
	stopped = waitHalted("after the restart")
	if n := len(logs.lines("level=ERROR", want)) - before; n != len(stopped) {
		t.Errorf("after restart %d halt lines, want %d (one per halted member)", n, len(stopped))
	}
}

// With IgnoreUnknown the entry is skipped everywhere and the cluster
// carries on.
func TestIgnoreUnknownOpCarriesOn(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3})
	leader := c.WaitLeader()
	errc, resp := appendEntry(t, leader, fsm.Entry{Op: "future.op", IgnoreUnknown: true, Args: json.RawMessage(`{}`), IssuedAt: time.Now().UTC(), Actor: "test"})
	if err := <-errc; err != nil {
		t.Fatalf("ignorable unknown entry: %v", err)
	}
	if r, ok := resp().(fsm.Result); !ok || r.Error != nil || r.Value != nil {
		t.Fatalf("ignorable unknown entry: result %#v, want empty", resp())
	}
	if _, _, err := drain(t, c, c.WaitLeader(), "node-2", "", nil); err != nil {
		t.Fatalf("write after the ignored entry: %v", err)
	}
	for _, m := range c.Members {
		clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
			var ok bool
			m.Server.FSM().View(func(tx *bolt.Tx) error {
				n, err := fsm.GetNode(tx, "node-2")
				ok = err == nil && n.DrainRequested
				return nil
			})
			return ok, m.ID + " has not applied the drain"
		})
		if halted(m) {
			t.Errorf("%s halted: %v", m.ID, m.Server.HaltErr())
		}
	}
}

// A write whose request is already out of time is refused at once: Raft
// would wait forever on a timeout of 0.
func TestApplyOutOfTimeReturnsAtOnce(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	leader := c.WaitLeader()
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	cases := []struct {
		name string
		ctx  context.Context
		code api.Code
	}{
		{"deadline passed", expired, api.CodeDeadlineExceeded},
		{"cancelled", cancelled, api.CodeUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := leader.Server.Apply(tc.ctx, fsm.Entry{Op: fsm.OpNodeDrain, CommandID: "late-drain", Args: json.RawMessage(`{"node_id":"node-1"}`)})
				done <- err
			}()
			select {
			case err := <-done:
				if api.CodeOf(err) != tc.code || !strings.Contains(err.Error(), "node.drain (command late-drain)") {
					t.Fatalf("got %v, want %s naming the command", err, tc.code)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Apply with an out-of-time context did not return")
			}
		})
	}
	n, err := c.Node(leader, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if n.DrainRequested {
		t.Error("the refused write was applied")
	}
}
