package fsm

import (
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// Policies that name the objects

// A policy names existing objects; the Workspace records the Egress
// revision it uses, and the objects count their Workspaces.
func TestWorkspacePolicyNamesObjects(t *testing.T) {
	h := newHarness(t)
	withCorp(h)
	h.ok(OpResolverCreate, ResolverCreateArgs{Name: "corp-dns", Upstreams: []string{"192.0.2.53"}})
	w := h.create("c1", withNetwork(api.NetworkPolicy{Egress: "corp", Resolver: "corp-dns", EgressRevision: 77}))
	if want := (api.NetworkPolicy{Egress: "corp", EgressRevision: 1, Resolver: "corp-dns"}); !reflect.DeepEqual(*w.Network, want) {
		t.Fatalf("policy %+v, want %+v (the revision is ctrl's)", w.Network, want)
	}
	if e, r := h.egress("corp"), h.resolver("corp-dns"); e.Workspaces != 1 || r.Workspaces != 1 {
		t.Fatalf("workspaces counted: egress %d, resolver %d", e.Workspaces, r.Workspaces)
	}
	checkIndex(t, h.f)
	h.advance(time.Second)
	// The task of its start carries the address, not the credentials.
	var te *api.TaskEgress
	var tr *api.TaskResolver
	h.f.View(func(tx *bolt.Tx) (err error) { te, tr, err = TaskNetwork(tx, h.ws(w.WorkspaceID).Network); return })
	if want := (&api.TaskEgress{Name: "corp", Revision: 1, SOCKS5: "proxy.corp.example:1080", Credentials: true}); !reflect.DeepEqual(te, want) {
		t.Errorf("task egress %+v, want %+v", te, want)
	}
	if want := (&api.TaskResolver{Name: "corp-dns", Upstreams: []string{"192.0.2.53:53"}}); !reflect.DeepEqual(tr, want) {
		t.Errorf("task resolver %+v, want %+v", tr, want)
	}
	h.f.View(func(tx *bolt.Tx) (err error) {
		te, tr, err = TaskNetwork(tx, &api.NetworkPolicy{Egress: api.EgressPublic})
		if te != nil || tr != nil || err != nil {
			t.Errorf("task network of public egress: %+v %+v %v", te, tr, err)
		}
		return nil
	})
}

// An update moves no Workspace; set-network naming the Egress and a start
// take the latest revision; old revisions stay while used and go with
// their last use.
func TestEgressRevisionsFollowWorkspaces(t *testing.T) {
	h := newHarness(t)
	withCorp(h)
	run := h.running("c1", viaCorp)
	stop := h.stopped("c2", viaCorp)
	h.advance(time.Second)
	h.ok(OpEgressUpdate, EgressUpdateArgs{Name: "corp", Password: str("rotated")})
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{1, 2}) {
		t.Fatalf("revisions %v, want [1 2]: the Workspaces use 1", got)
	}
	for _, id := range []string{run.WorkspaceID, stop.WorkspaceID} {
		if got := h.ws(id).Network.EgressRevision; got != 1 {
			t.Fatalf("update moved %s to revision %d", id, got)
		}
	}
	checkIndex(t, h.f)

	// The stopped one starts with the latest revision.
	h.advance(time.Second)
	started := decode[api.Workspace](t, h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: stop.WorkspaceID}))
	if started.Network.EgressRevision != 2 {
		t.Fatalf("start uses revision %d, want 2", started.Network.EgressRevision)
	}
	checkIndex(t, h.f)

	// The running one moves with a set-network naming the Egress: both
	// revisions are kept until its node answers.
	h.advance(time.Second)
	w := decode[api.Workspace](t, h.ok(OpWorkspaceSetNetwork, setNet(run.WorkspaceID, api.NetworkChange{Egress: str("corp")})))
	if w.Pending == nil || w.Pending.Network.EgressRevision != 2 || w.Network.EgressRevision != 1 {
		t.Fatalf("set-network: policy %+v pending %+v", w.Network, w.Pending)
	}
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{1, 2}) {
		t.Fatalf("revisions %v while the change is pending", got)
	}
	// Its node gets both revisions' credentials meanwhile.
	for _, rev := range []uint64{1, 2} {
		if c, err := h.credentials("node-a", "corp", rev); err != nil || c.Revision != rev {
			t.Fatalf("credentials of revision %d for node-a: %+v %v", rev, c, err)
		}
	}
	h.answer(run.WorkspaceID, OutcomeOK, "")
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{2}) {
		t.Fatalf("revisions %v once no Workspace uses 1, want [2]", got)
	}
	if _, err := h.credentials("node-a", "corp", 1); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("credentials of a dropped revision: %v", err)
	}
	checkIndex(t, h.f)

	// A failed change drops the revision it asked for (when unused).
	h.advance(time.Second)
	h.ok(OpEgressUpdate, EgressUpdateArgs{Name: "corp", SOCKS5: str("proxy3:1080")})
	h.advance(time.Second)
	h.ok(OpEgressUpdate, EgressUpdateArgs{Name: "corp", SOCKS5: str("proxy4:1080")})
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{2, 4}) {
		t.Fatalf("revisions %v, want [2 4]: 3 was used by nothing", got)
	}
	h.advance(time.Second)
	h.ok(OpWorkspaceSetNetwork, setNet(run.WorkspaceID, api.NetworkChange{Egress: str("corp")}))
	h.advance(time.Second)
	h.ok(OpEgressUpdate, EgressUpdateArgs{Name: "corp", SOCKS5: str("proxy5:1080")})
	h.answer(run.WorkspaceID, OutcomeFailed, "no route")
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{2, 5}) {
		t.Fatalf("revisions %v after a failed change to 4, want [2 5]", got)
	}
	checkIndex(t, h.f)

	// Stopping and deleting releases the rest.
	for _, id := range []string{run.WorkspaceID, stop.WorkspaceID} {
		h.advance(time.Second)
		h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: id, Force: true})
		h.answer(id, OutcomeOK, "")
		h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: id})
		h.answer(id, OutcomeOK, "")
	}
	if got := h.revisions("corp"); !reflect.DeepEqual(got, []uint64{5}) {
		t.Fatalf("revisions %v once no Workspace is left, want [5]", got)
	}
	if e := h.egress("corp"); e.Workspaces != 0 || e.Revision != 5 || e.Version != 5 {
		t.Fatalf("egress %+v", e)
	}
	checkIndex(t, h.f)
	h.advance(time.Second)
	h.ok(OpEgressDelete, ObjectArgs{Name: "corp"})
}

// Credentials go only to a node that runs (or is to run) a Workspace
// whose policy uses that exact revision.
func TestEgressCredentialsForNodes(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.ok(OpEgressCreate, corpArgs)
	h.ok(OpEgressCreate, EgressCreateArgs{Name: "other", SOCKS5: "other:1080", Username: "o", Password: "p"})
	a := withNetwork(api.NetworkPolicy{Egress: "corp"})
	a.NodeID = "node-a"
	w := h.create("c1", a) // STARTING on node-a: the start is pending there
	c, err := h.credentials("node-a", "corp", 1)
	if err != nil {
		t.Fatalf("credentials for the node the start is pending on: %v", err)
	}
	if want := (api.EgressCredentials{Name: "corp", Revision: 1, SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: testPassword}); *c != want {
		t.Fatalf("credentials %+v, want %+v", c, want)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if _, err := h.credentials("node-a", "corp", 1); err != nil {
		t.Fatalf("credentials for the node it runs on: %v", err)
	}
	for _, c := range []struct {
		node, name string
		rev        uint64
		code       api.Code
		says       string
	}{
		{"node-b", "corp", 1, api.CodePermissionDenied, "node node-b runs no Workspace whose network policy uses egress corp revision 1: credentials go only to the node of such a Workspace"},
		{"node-a", "other", 1, api.CodePermissionDenied, "node node-a runs no Workspace whose network policy uses egress other revision 1"},
		{"node-a", "corp", 2, api.CodeNotFound, "egress corp has no revision 2"},
		{"node-a", "nope", 1, api.CodeNotFound, "egress nope has no revision 1"},
		{"node-a", "Bad", 1, api.CodeInvalidArgument, `egress name "Bad" is not valid`},
	} {
		_, err := h.credentials(c.node, c.name, c.rev)
		if api.CodeOf(err) != c.code || !strings.Contains(err.Error(), c.says) {
			t.Errorf("credentials of %s revision %d for %s: %v, want %s saying %q", c.name, c.rev, c.node, err, c.code, c.says)
		}
		if err != nil && strings.Contains(err.Error(), testPassword) {
			t.Errorf("error names the password: %v", err)
		}
	}
	// Once stopped, not even its node gets them.
	h.advance(time.Second)
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	if _, err := h.credentials("node-a", "corp", 1); err != nil {
		t.Fatalf("credentials while STOPPING (the Instance still runs): %v", err)
	}
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if _, err := h.credentials("node-a", "corp", 1); api.CodeOf(err) != api.CodePermissionDenied {
		t.Fatalf("credentials for the node of a STOPPED Workspace: %v", err)
	}
}
