package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/hostusage"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
)

// orderRecorder is a DataPlane seam that notes each update beside the
// session messages the agent sends: the real hand-off is covered by
// dataplane's tests and e2e's first exec right after AVAILABLE.
type orderRecorder struct {
	mu     sync.Mutex
	events []string
	sent   chan struct{}
}

func (o *orderRecorder) note(e string) {
	o.mu.Lock()
	o.events = append(o.events, e)
	o.mu.Unlock()
}

func (o *orderRecorder) Address() string            { return "127.0.0.1:1" }
func (o *orderRecorder) Alive(context.Context) bool { return true }
func (o *orderRecorder) Update(context.Context, []DataTarget, [][]byte) error {
	o.note("data-plane update")
	return nil
}

// A Workspace command's result goes to ctrl only after the data plane has
// the node's new state: a credential ctrl issues once it stored the
// result (AVAILABLE) is for a target the data plane serves already.
func TestDataPlaneUpdatedBeforeTheResult(t *testing.T) {
	rec := &orderRecorder{sent: make(chan struct{}, 1)}
	a := &Agent{cfg: Config{NodeID: "node-x", DataPlane: rec}, log: slog.New(slog.DiscardHandler),
		sampler: hostusage.NewSampler(hostusage.Config{ProcRoot: t.TempDir()})}
	a.initTasks()
	a.send = func(m api.SessionMsg) error {
		rec.note(m.Type)
		select {
		case rec.sent <- struct{}{}:
		default:
		}
		return nil
	}
	a.runTask(t.Context(), "ws-1", "ws-1/1", "workspace", a.log, func(context.Context) taskResult {
		return taskResult{ws: &api.WorkspaceTaskResult{WorkspaceID: "ws-1", CommandID: "ws-1/1", Outcome: fsm.OutcomeOK}}
	})
	select {
	case <-rec.sent:
	case <-time.After(30 * time.Second):
		t.Fatal("no result sent")
	}
	a.bg.end() // the report owed after the task, too
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.events) < 2 || rec.events[0] != "data-plane update" || rec.events[1] != api.MsgTaskResult {
		t.Fatalf("the agent did %q; want the data-plane update, then the result", rec.events)
	}
}
