package fsm

import (
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func (h *harness) env(id string) []string {
	h.t.Helper()
	var env []string
	if err := h.f.View(func(tx *bolt.Tx) (err error) { env, err = TaskEnv(tx, id); return }); err != nil {
		h.t.Fatal(err)
	}
	return env
}

// A create's environment is kept sorted by name beside the record, which
// shows the names only; it stays through stop and start and goes with
// the Workspace. The values appear in no result and no record but its own.
func TestWorkspaceEnv(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	a := smallWS
	a.Env = []string{"TOKEN=s3cret", "A_URL=http://x/?a=b", "EMPTY="}
	r := h.ok(OpWorkspaceCreate, a, withCommand("c1"))
	w := decode[api.Workspace](t, r)
	want := []string{"A_URL=http://x/?a=b", "EMPTY=", "TOKEN=s3cret"}
	if got := h.env(w.WorkspaceID); !slices.Equal(got, want) {
		t.Errorf("env %q, want %q", got, want)
	}
	if !slices.Equal(w.EnvNames, []string{"A_URL", "EMPTY", "TOKEN"}) {
		t.Errorf("names %q", w.EnvNames)
	}
	if strings.Contains(string(r.Value), "s3cret") {
		t.Errorf("the create's result shows a value: %s", r.Value)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if got := h.env(w.WorkspaceID); !slices.Equal(got, want) {
		t.Errorf("env after stop and start %q, want %q", got, want)
	}
	if n := strings.Count(h.dump(), "s3cret"); n != 1 {
		t.Errorf("the value is %d times in the state, want once (its own record):\n%s", n, h.dump())
	}
	plain := h.create("c2", smallWS)
	if plain.EnvNames != nil || h.env(plain.WorkspaceID) != nil {
		t.Errorf("a Workspace without env: names %q, env %q", plain.EnvNames, h.env(plain.WorkspaceID))
	}

	h.advance(time.Second)
	h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if got := h.env(w.WorkspaceID); !slices.Equal(got, want) {
		t.Errorf("env while DELETING %q, want it kept until the node answered", got)
	}
	if h.answer(w.WorkspaceID, OutcomeOK, "") != nil {
		t.Fatal("deleted Workspace still there")
	}
	if got := h.env(w.WorkspaceID); got != nil || strings.Contains(h.dump(), "s3cret") {
		t.Errorf("env after the deletion %q", got)
	}
}

// A bad environment is refused, changing nothing, with the same first
// fault on every replica whatever the order it is given in.
func TestWorkspaceEnvRefused(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"B=1", "1A=x", "-Z=y"}, `environment variable name "-Z" is not valid`},
		{[]string{"A=1", "A=2"}, "environment variable A is given twice"},
		{[]string{"BIG=" + strings.Repeat("x", api.MaxWorkspaceEnvValue+1)}, "environment variable BIG has a value of 32769 bytes"},
	} {
		a := smallWS
		a.Env = c.env
		err := h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, a, withCommand("c1"))
		if !strings.Contains(err.Message, "workspace "+WorkspaceIDFor("c1")+": "+c.want) {
			t.Errorf("%q: %s, want %q", c.env, err.Message, c.want)
		}
		slices.Reverse(a.Env)
		if again := h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, a, withCommand("c1")); again.Message != err.Message {
			t.Errorf("the same environment reversed: %s, before %s", again.Message, err.Message)
		}
	}
}

// A fork has its source's environment, which its restored guest holds;
// one of its own is refused.
func TestForkEnv(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.resumer("node-a", canResume)
	h.poolCapacity("nfs", 100*gib)
	a := smallWS
	a.Env = []string{"TOKEN=s3cret"}
	src := h.pausedWS("c1", a)
	f := h.create("f1", fork(src.WorkspaceID))
	if got := h.env(f.WorkspaceID); !slices.Equal(got, a.Env) || !slices.Equal(f.EnvNames, []string{"TOKEN"}) {
		t.Errorf("fork env %q, names %q; want the source's", got, f.EnvNames)
	}
	own := fork(src.WorkspaceID)
	own.Env = []string{"OTHER=1"}
	if err := h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, own, withCommand("f2")); !strings.Contains(err.Message, "a fork has the environment of workspace "+src.WorkspaceID) {
		t.Errorf("a fork with its own env: %s", err.Message)
	}
}

// An export records the Workspace's environment for the exporting node's
// manifest and an import here, never in the Transfer a read shows.
func TestTransferExportEnv(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	a := smallWS
	a.Env = []string{"TOKEN=s3cret"}
	w := h.stopped("c1", a)
	r := h.ok(OpTransferExport, TransferExportArgs{WorkspaceID: w.WorkspaceID, Namespace: "default"}, withCommand("x1"))
	tr := decode[api.Transfer](t, r)
	if strings.Contains(string(r.Value), "s3cret") {
		t.Errorf("the export's result shows a value: %s", r.Value)
	}
	var work *TransferWork
	var env []string
	if err := h.f.View(func(tx *bolt.Tx) (err error) {
		if work, err = PendingTransferWork(tx, h.now); err == nil {
			env, err = TransferEnv(tx, tr.TransferID)
		}
		return
	}); err != nil {
		t.Fatal(err)
	}
	if len(work.Exports) != 1 || !slices.Equal(work.Exports[0].Env, a.Env) || !slices.Equal(env, a.Env) {
		t.Errorf("export task %+v, recorded env %q; want the Workspace's", work.Exports, env)
	}
}
