package kibotos_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/sdk/kibotos"
)

// stateScript serves a Workspace that goes through states, one version
// each: the create (or write) answers the first, every blocking get
// with wait_version the next one.
type stateScript struct {
	mu     sync.Mutex
	states []string
	at     int
	// gone: past the last state the Workspace no longer exists.
	gone    bool
	failure *api.WorkspaceFailure
}

func (s *stateScript) current() (int, http.Header, any) {
	if s.at >= len(s.states) {
		return 404, nil, api.Errorf(api.CodeNotFound, "workspace ws-1 does not exist")
	}
	w := api.Workspace{WorkspaceID: "ws-1", Namespace: "acme", Template: "alpine", State: s.states[s.at], Version: uint64(s.at + 1), CPU: 500, MemoryBytes: 256 << 20}
	if w.State == api.WorkspaceFailed || w.State == api.WorkspaceAvailable || w.State == api.WorkspacePaused {
		if w.State == api.WorkspaceFailed {
			w.Failure = s.failure
		} else if s.failure != nil {
			w.LastError = s.failure
		}
	}
	return 200, nil, w
}

// existing is a client of a fake serving Workspace ws-1 in state, and
// that Workspace.
func existing(t *testing.T, state string) (*fakeAPI, *kibotos.Client, *kibotos.Workspace) {
	t.Helper()
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	f.handle("GET /v1/workspaces/ws-1", (&stateScript{states: []string{state}}).get)
	ws, err := c.Workspaces.Get(context.Background(), "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	return f, c, ws
}

// routes makes s serve the Workspace's gets too, and returns its write.
func (s *stateScript) routes(f *fakeAPI) func(*http.Request, []byte) (int, http.Header, any) {
	f.handle("GET /v1/workspaces/ws-1", s.get)
	return s.write
}

// write answers the write that starts the script.
func (s *stateScript) write(*http.Request, []byte) (int, http.Header, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = 0
	return s.current()
}

// get answers a plain get with the current state and a blocking one
// with the next (a change came before the wait ended).
func (s *stateScript) get(r *http.Request, _ []byte) (int, http.Header, any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := r.URL.Query().Get("wait_version"); v != "" {
		if n, _ := strconv.Atoi(v); n == s.at+1 && (s.at+1 < len(s.states) || s.gone) {
			s.at++
		}
	}
	return s.current()
}

func TestCreateWaitsThroughTheBlockingGetUntilAvailable(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	s := &stateScript{states: []string{api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable}}
	f.handle("POST /v1/workspaces", s.write)
	f.handle("GET /v1/workspaces/ws-1", s.get)
	ws, err := c.Workspaces.Create(context.Background(), kibotos.WorkspaceSpec{Template: "alpine", CPU: 0.5, Memory: 256 * kibotos.MiB,
		Timeout: 30 * time.Minute, OnTimeout: kibotos.OnTimeoutPause, AutoResume: true, Labels: map[string]string{"team": "a"},
		Env: map[string]string{"TOKEN": "t", "A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if ws.State != kibotos.StateAvailable || ws.ID != "ws-1" || ws.Namespace != "acme" || ws.CPU != 0.5 || ws.Memory != 256<<20 {
		t.Fatalf("Create returned %+v; want ws-1 AVAILABLE with its answer's fields", ws)
	}
	var req api.WorkspaceCreateRequest
	if err := json.Unmarshal(f.seenOf("POST", "/v1/workspaces")[0].body, &req); err != nil {
		t.Fatal(err)
	}
	if req.Template != "alpine" || req.CPU != 500 || req.MemoryBytes != 256<<20 || req.Timeout != "30m0s" || req.OnTimeout != "pause" || !req.AutoResume || req.Labels["team"] != "a" || req.CommandID == "" ||
		strings.Join(req.Env, " ") != "A=1 TOKEN=t" {
		t.Errorf("create sent %+v; want the spec as the API takes it, with a command id", req)
	}
	gets := f.seenOf("GET", "/v1/workspaces/ws-1")
	if len(gets) != 2 {
		t.Fatalf("%d gets; want one blocking get per state after CREATING", len(gets))
	}
	for i, g := range gets {
		if g.query.Get("wait_version") != strconv.Itoa(i+1) || g.query.Get("wait") == "" {
			t.Errorf("get %d: %v; want a blocking get past version %d", i, g.query, i+1)
		}
	}

	// NoWait: the create's answer, no get.
	ws, err = c.Workspaces.Create(context.Background(), kibotos.WorkspaceSpec{Template: "alpine"}, kibotos.NoWait())
	if err != nil || ws.State != kibotos.StateCreating || len(f.seenOf("GET", "/v1/workspaces/ws-1")) != 2 {
		t.Fatalf("Create with NoWait: %+v, %v; want CREATING and no wait", ws, err)
	}
}

func TestCreateOfAWorkspaceNoNodeHasRoomForIsResourceExhausted(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	s := &stateScript{states: []string{api.WorkspaceCreating, api.WorkspaceFailed},
		failure: &api.WorkspaceFailure{Reason: api.FailureResourceExhausted, Message: "nodes refused: memory tight"}}
	f.handle("POST /v1/workspaces", s.write)
	f.handle("GET /v1/workspaces/ws-1", s.get)
	_, err := c.Workspaces.Create(context.Background(), kibotos.WorkspaceSpec{Template: "alpine"})
	if !errors.Is(err, kibotos.ErrResourceExhausted) {
		t.Fatalf("create that FAILED with RESOURCE_EXHAUSTED: %v; want ErrResourceExhausted", err)
	}
	s.failure.Reason = api.FailureStart
	if _, err = c.Workspaces.Create(context.Background(), kibotos.WorkspaceSpec{Template: "alpine"}); !errors.Is(err, kibotos.ErrFailedPrecondition) {
		t.Fatalf("create that FAILED to start: %v; want ErrFailedPrecondition", err)
	}
}

func TestCreateRefusesASpecTheAPICannotTake(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	for _, spec := range []kibotos.WorkspaceSpec{
		{Template: "alpine", CPU: 0.0001},
		{Template: "alpine", CPU: -1},
		{Template: "alpine", Timeout: 1500 * time.Millisecond},
	} {
		if _, err := c.Workspaces.Create(context.Background(), spec); !errors.Is(err, kibotos.ErrInvalidArgument) {
			t.Errorf("spec %+v: %v; want ErrInvalidArgument before anything is sent", spec, err)
		}
	}
	if n := len(f.seenOf("POST", "/v1/workspaces")); n != 0 {
		t.Errorf("%d creates sent for specs refused here", n)
	}
}

func TestDeleteWaitsUntilTheWorkspaceIsGone(t *testing.T) {
	f, c, ws := existing(t, api.WorkspaceAvailable)
	f.handle("POST /v1/workspaces/ws-1/delete", (&stateScript{states: []string{api.WorkspaceDeleting}, gone: true}).routes(f))
	if err := ws.Delete(context.Background()); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := c.Workspaces.Get(context.Background(), "ws-1"); !errors.Is(err, kibotos.ErrNotFound) {
		t.Fatalf("Get after Delete returned: %v; want ErrNotFound", err)
	}
}

func TestPauseThatCouldNotSaveTheGuestSaysWhy(t *testing.T) {
	f, _, ws := existing(t, api.WorkspaceAvailable)
	s := &stateScript{states: []string{api.WorkspacePausing, api.WorkspaceAvailable},
		failure: &api.WorkspaceFailure{Reason: "PAUSE_FAILED", Message: "snapshot: no space left in pool p1"}}
	f.handle("POST /v1/workspaces/ws-1/pause", s.routes(f))
	err := ws.Pause(context.Background())
	if !errors.Is(err, kibotos.ErrFailedPrecondition) || ws.State != kibotos.StateAvailable {
		t.Fatalf("a pause the node could not do: %v, state %s; want ErrFailedPrecondition and AVAILABLE", err, ws.State)
	}
}

func TestForkCreatesFromThePausedWorkspace(t *testing.T) {
	f, _, ws := existing(t, api.WorkspacePaused)
	f.handle("POST /v1/workspaces", func(*http.Request, []byte) (int, http.Header, any) {
		return 200, nil, api.Workspace{WorkspaceID: "ws-2", State: api.WorkspaceAvailable, ForkedFrom: "ws-1", Version: 1}
	})
	fork, err := ws.Fork(context.Background())
	if err != nil || fork.ID != "ws-2" || fork.ForkedFrom != "ws-1" {
		t.Fatalf("Fork: %+v, %v", fork, err)
	}
	var req api.WorkspaceCreateRequest
	json.Unmarshal(f.seenOf("POST", "/v1/workspaces")[0].body, &req)
	if req.From != "ws-1" || req.Template != "" {
		t.Errorf("fork sent %+v; want From ws-1 and nothing of its own", req)
	}
}

func TestListReadsEveryPage(t *testing.T) {
	f := newFakeAPI(t)
	c := f.connect(t, nil)
	f.handle("GET /v1/workspaces", func(r *http.Request, _ []byte) (int, http.Header, any) {
		if r.URL.Query().Get("page_token") == "" {
			return 200, nil, api.WorkspaceList{Workspaces: []api.Workspace{{WorkspaceID: "ws-1"}}, NextPageToken: "t2"}
		}
		return 200, nil, api.WorkspaceList{Workspaces: []api.Workspace{{WorkspaceID: "ws-2"}}}
	})
	list, err := c.Workspaces.List(context.Background(), &kibotos.ListOptions{States: []string{kibotos.StateAvailable}, Labels: map[string]string{"team": "a"}})
	if err != nil || len(list) != 2 || list[1].ID != "ws-2" {
		t.Fatalf("List over two pages: %v, %v", list, err)
	}
	q := f.seenOf("GET", "/v1/workspaces")[1].query
	if q.Get("state") != "AVAILABLE" || q.Get("label") != "team=a" {
		t.Errorf("list sent %v; want the state and label filters", q)
	}
}

func TestExecWithoutTheClusterCAAsksForNoCredential(t *testing.T) {
	f := newFakeAPI(t)
	c, err := kibotos.Connect(context.Background(), f.srv.URL, testKey, &kibotos.Options{HTTPClient: f.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	f.handle("GET /v1/workspaces/ws-1", (&stateScript{states: []string{api.WorkspaceAvailable}}).get)
	ws, err := c.Workspaces.Get(context.Background(), "ws-1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ws.Exec(context.Background(), []string{"true"}, nil)
	if !errors.Is(err, kibotos.ErrInvalidArgument) {
		t.Fatalf("Exec without a CA: %v; want ErrInvalidArgument naming the CA", err)
	}
	if n := len(f.seenOf("POST", "/v1/workspaces/ws-1/credentials")); n != 0 {
		t.Fatalf("%d credentials asked for, with no CA to check the data plane against", n)
	}
}
