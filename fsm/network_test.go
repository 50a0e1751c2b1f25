package fsm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// Network policy: create

func withNetwork(p api.NetworkPolicy) WorkspaceCreateArgs {
	a := smallWS
	a.Network = &p
	return a
}

func policyOf(t *testing.T, r Result) api.NetworkPolicy {
	t.Helper()
	w := decode[api.Workspace](t, r)
	if w.Network == nil {
		t.Fatalf("workspace %s stored without a policy", w.WorkspaceID)
	}
	return *w.Network
}

// wantPolicy checks the stored policy (and that the result is what is stored).
func wantPolicy(want api.NetworkPolicy) func(t *testing.T, h *harness, r Result) {
	return func(t *testing.T, h *harness, r Result) {
		got := policyOf(t, r)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("policy %+v, want %+v", got, want)
		}
		w := decode[api.Workspace](t, r)
		if stored := h.ws(w.WorkspaceID); !reflect.DeepEqual(stored.Network, w.Network) {
			t.Errorf("stored %+v, result %+v", stored.Network, w.Network)
		}
	}
}

// says checks the error message (exactly, or containing each part).
func says(parts ...string) func(t *testing.T, h *harness, r Result) {
	return func(t *testing.T, h *harness, r Result) {
		for _, p := range parts {
			if !strings.Contains(r.Error.Message, p) {
				t.Errorf("error %q does not say %q", r.Error.Message, p)
			}
		}
	}
}

func TestWorkspaceCreateNetwork(t *testing.T) {
	id := WorkspaceIDFor("c1")
	create := func(a WorkspaceCreateArgs) func(h *harness) Entry {
		return ent(OpWorkspaceCreate, a, withCommand("c1"))
	}
	public := func(allow, deny []string) WorkspaceCreateArgs {
		return withNetwork(api.NetworkPolicy{Egress: api.EgressPublic, Allow: allow, Deny: deny})
	}
	many := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
		}
		return out
	}
	cases := []opCase{
		{name: "no policy: egress none", setup: oneNode, entry: create(smallWS), check: wantPolicy(api.NetworkPolicy{Egress: api.EgressNone})},
		{name: "empty egress: none", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{})), check: wantPolicy(api.NetworkPolicy{Egress: api.EgressNone})},
		{name: "none", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Egress: "none"})), check: wantPolicy(api.NetworkPolicy{Egress: api.EgressNone})},
		{name: "public without lists", setup: oneNode, entry: create(public(nil, nil)), check: wantPolicy(api.NetworkPolicy{Egress: api.EgressPublic})},
		{name: "domain rules, stored canonical", setup: oneNode,
			entry: create(public([]string{"*.Example.COM", "pypi.org.", "*.example.com", "10.0.0.0/8"}, []string{"Evil.example.com"})),
			check: wantPolicy(api.NetworkPolicy{Egress: api.EgressPublic, Allow: []string{"*.example.com", "pypi.org", "10.0.0.0/8"}, Deny: []string{"evil.example.com"}})},
		{name: "public with lists, stored canonical", setup: oneNode,
			entry: create(public(
				[]string{"10.1.2.3", "10.0.0.0/8", "10.1.2.3/32", "192.168.7.9/16", "2001:db8::1/32", "2001:DB8::7", "::ffff:192.0.2.1", "::ffff:198.51.100.0/120"},
				[]string{"0.0.0.0/0", "::/0"})),
			check: wantPolicy(api.NetworkPolicy{Egress: api.EgressPublic,
				Allow: []string{"10.1.2.3/32", "10.0.0.0/8", "192.168.0.0/16", "2001:db8::/32", "2001:db8::7/128", "192.0.2.1/32", "198.51.100.0/24"},
				Deny:  []string{"0.0.0.0/0", "::/0"}})},
		{name: "256 rules each", setup: oneNode, entry: create(public(many(256), many(256))), check: func(t *testing.T, h *harness, r Result) {
			if p := policyOf(t, r); len(p.Allow) != 256 || len(p.Deny) != 256 {
				t.Errorf("%d allow, %d deny rules stored", len(p.Allow), len(p.Deny))
			}
		}},
		{name: "257 allow rules", setup: oneNode, entry: create(public(many(257), nil)), code: api.CodeInvalidArgument,
			check: says("workspace " + id + ": 257 allow rules given: at most 256")},
		{name: "257 deny rules", setup: oneNode, entry: create(public(nil, many(257))), code: api.CodeInvalidArgument,
			check: says("257 deny rules")},
		{name: "unknown egress", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Egress: "corp"})), code: api.CodeNotFound,
			check: func(t *testing.T, h *harness, r Result) {
				if want := "egress corp does not exist: create it with kibo egress create corp --socks5 HOST:PORT"; r.Error.Message != want {
					t.Errorf("error %q, want %q", r.Error.Message, want)
				}
			}},
		{name: "unknown resolver", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Resolver: "corp-dns"})), code: api.CodeNotFound,
			check: func(t *testing.T, h *harness, r Result) {
				if want := "resolver corp-dns does not exist: create it with kibo resolver create corp-dns --upstream ADDR"; r.Error.Message != want {
					t.Errorf("error %q, want %q", r.Error.Message, want)
				}
			}},
		{name: "domain rules with a resolver object", setup: func(h *harness) {
			oneNode(h)
			h.ok(OpResolverCreate, ResolverCreateArgs{Name: "corp-dns", Upstreams: []string{"10.0.0.53"}})
		}, entry: create(withNetwork(api.NetworkPolicy{Egress: "public", Resolver: "corp-dns", Allow: []string{"*.example.com"}})), code: api.CodeInvalidArgument,
			check: says("workspace "+id, "domain rules are enforced by the deployment resolver, not by resolver corp-dns")},
		{name: "allow without public egress", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Allow: []string{"10.0.0.0/8"}})), code: api.CodeInvalidArgument,
			check: says("workspace "+id, "allow/deny lists apply to public egress only", "egress none", "--egress public, or leave out --allow and --deny")},
		{name: "deny with an egress object", setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Egress: "corp", Deny: []string{"10.0.0.0/8"}})), code: api.CodeInvalidArgument,
			check: says("apply to public egress only")},
	}
	for _, bad := range []string{"10.0.0.300", "10.0.0.0/33", "10.0.0.0/", "fe80::1%eth0", "", " 10.0.0.0/8", "10.0.0.0/8,10.1.0.0/16", "1.2.3", "*.com", "http://example.com", "*example.com", "a.*.example.com", "localhost", "-x.example.com", "example.com/24"} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad rule %q", bad), setup: oneNode, entry: create(public([]string{bad}, nil)),
			code: api.CodeInvalidArgument, check: says("workspace "+id, fmt.Sprintf("allow rule %q is not a CIDR, an IP address or a domain", bad))})
	}
	for _, bad := range []string{"Public", "NONE", "corp egress", "-x", strings.Repeat("e", 64)} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad egress %q", bad), setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Egress: bad})),
			code: api.CodeInvalidArgument, check: says("workspace "+id, "use none, public or the name of an Egress object")})
	}
	for _, bad := range []string{"Default", "a b", "-x"} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad resolver %q", bad), setup: oneNode, entry: create(withNetwork(api.NetworkPolicy{Resolver: bad})),
			code: api.CodeInvalidArgument, check: says("resolver")})
	}
	runCases(t, cases)
}

// A refused policy refuses the whole create: no Workspace, no command
// record, so the same command id works once the policy is right.
func TestWorkspaceCreateNetworkRefusedIsNotRecorded(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.advance(time.Second)
	h.fail(api.CodeNotFound, OpWorkspaceCreate, withNetwork(api.NetworkPolicy{Egress: "corp"}), withCommand("c1"))
	if err := h.wsErr(WorkspaceIDFor("c1")); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("refused create stored: %v", err)
	}
	if hd := h.holds("node-a"); hd != (Holds{}) {
		t.Fatalf("refused create holds %+v", hd)
	}
	w := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, withNetwork(api.NetworkPolicy{Egress: "public"}), withCommand("c1")))
	if w.Network.Egress != api.EgressPublic {
		t.Fatalf("created %+v", w.Network)
	}
	// The policy is an input of the command: other policy, same id: refused.
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, withNetwork(api.NetworkPolicy{Egress: "none"}), withCommand("c1"))
}

// ---------------------------------------------------------------------------
// Network policy: workspace.set_network

func str(s string) *string { return &s }

// rules is a list for a change: an empty one clears (JSON [], not null).
func rules(r ...string) *[]string {
	if r == nil {
		r = []string{}
	}
	return &r
}

// rewriteWorkspace edits a stored record behind the FSM's back, as an
// older release would have written it.
func (h *harness) rewriteWorkspace(id string, edit func(w *api.Workspace)) {
	h.t.Helper()
	if err := h.f.db.Update(func(tx *bolt.Tx) error {
		w, err := mustWorkspace(tx, id)
		if err != nil {
			return err
		}
		edit(w)
		return putJSON(tx, bucketWorkspaces, wsKey(id), w)
	}); err != nil {
		h.t.Fatal(err)
	}
}

func setNet(id string, c api.NetworkChange) WorkspaceNetworkArgs {
	return WorkspaceNetworkArgs{WorkspaceID: id, NetworkChange: c}
}

var toPublic = api.NetworkChange{Egress: str("public"), Allow: rules("10.0.0.0/8"), Deny: rules("10.9.0.0/16")}
var publicPolicy = api.NetworkPolicy{Egress: api.EgressPublic, Allow: []string{"10.0.0.0/8"}, Deny: []string{"10.9.0.0/16"}}

func TestWorkspaceSetNetwork(t *testing.T) {
	var w api.Workspace
	stopped := func(h *harness) { oneNode(h); w = h.stopped("c1", smallWS) }
	available := func(h *harness) { oneNode(h); w = h.running("c1", smallWS) }
	set := func(c api.NetworkChange, opts ...entryOpt) func(h *harness) Entry {
		return func(h *harness) Entry { return h.entry(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, c), opts...) }
	}
	refusedIn := func(state string) func(t *testing.T, h *harness, r Result) {
		return says("workspace "+w.WorkspaceID, state, "set-network needs STOPPED")
	}
	cases := []opCase{
		{name: "stopped: stored at once", setup: stopped, entry: set(toPublic), check: func(t *testing.T, h *harness, r Result) {
			got := decode[api.Workspace](t, r)
			if !reflect.DeepEqual(*got.Network, publicPolicy) || got.Pending != nil || got.Version != w.Version+1 || got.State != api.WorkspaceStopped {
				t.Errorf("after set-network: %+v network %+v pending %+v", got, got.Network, got.Pending)
			}
			if !reflect.DeepEqual(*h.ws(w.WorkspaceID), got) {
				t.Errorf("stored %+v, result %+v", h.ws(w.WorkspaceID), got)
			}
			if p := h.pendingOn("node-a"); len(p) != 0 {
				t.Errorf("a command for the node: %v", p)
			}
			checkIndex(t, h.f)
		}},
		{name: "stopped: the policy it has", setup: stopped, entry: set(api.NetworkChange{Egress: str("none")}), unchanged: true},
		{name: "stopped: with the expected version", setup: stopped, entry: func(h *harness) Entry {
			return h.entry(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic), withVersion(w.Version))
		}, check: wantPolicy(publicPolicy)},
		{name: "stopped: another version expected", setup: stopped, entry: func(h *harness) Entry {
			return h.entry(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic), withVersion(w.Version-1))
		}, code: api.CodeVersionMismatch},
		{name: "available: a command for its node", setup: available, entry: set(toPublic), check: func(t *testing.T, h *harness, r Result) {
			got := decode[api.Workspace](t, r)
			if got.State != api.WorkspaceAvailable || got.Version != w.Version+1 || got.Network.Egress != api.EgressNone {
				t.Errorf("the policy changed before the node answered: %+v network %+v", got, got.Network)
			}
			want := &api.WorkspaceCommand{Kind: api.WSCmdNetwork, CommandID: fmt.Sprintf("%s/%d", w.WorkspaceID, got.Version), NodeID: "node-a",
				InstanceID: w.InstanceID, IssuedAt: h.now, Network: &publicPolicy}
			if !reflect.DeepEqual(got.Pending, want) {
				t.Errorf("pending %+v\nwant %+v", got.Pending, want)
			}
			if p := h.pendingOn("node-a"); !reflect.DeepEqual(p, []string{w.WorkspaceID}) {
				t.Errorf("pending on node-a: %v", p)
			}
			if hd := h.holds("node-a"); hd.Instances != 1 || hd.Layers != 1 {
				t.Errorf("holds %+v", hd)
			}
			checkIndex(t, h.f)
		}},
		{name: "available: the policy it has", setup: available, entry: set(api.NetworkChange{Egress: str("none"), Allow: rules()}), unchanged: true},
		{name: "available: a change already pending", setup: func(h *harness) {
			available(h)
			h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic))
		}, entry: set(api.NetworkChange{Egress: str("public")}), code: api.CodeFailedPrecondition,
			check: func(t *testing.T, h *harness, r Result) {
				says("workspace "+w.WorkspaceID+" is AVAILABLE with a network change pending on node node-a", "wait for its answer")(t, h, r)
			}},
		{name: "creating", setup: func(h *harness) { oneNode(h); w = h.create("c1", smallWS) }, entry: set(toPublic),
			code: api.CodeFailedPrecondition, check: func(t *testing.T, h *harness, r Result) { refusedIn("CREATING")(t, h, r) }},
		{name: "starting", setup: func(h *harness) {
			stopped(h)
			h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		}, entry: set(toPublic), code: api.CodeFailedPrecondition, check: func(t *testing.T, h *harness, r Result) { refusedIn("STARTING")(t, h, r) }},
		{name: "stopping", setup: func(h *harness) {
			available(h)
			h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		}, entry: set(toPublic), code: api.CodeFailedPrecondition, check: func(t *testing.T, h *harness, r Result) { refusedIn("STOPPING")(t, h, r) }},
		{name: "failed", setup: func(h *harness) {
			oneNode(h)
			w = h.create("c1", smallWS)
			h.answer(w.WorkspaceID, OutcomeFailed, "kernel panic")
		}, entry: set(toPublic), code: api.CodeFailedPrecondition, check: func(t *testing.T, h *harness, r Result) { refusedIn("FAILED")(t, h, r) }},
		{name: "deleting", setup: func(h *harness) {
			stopped(h)
			h.ok(OpWorkspaceDelete, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
		}, entry: set(toPublic), code: api.CodeFailedPrecondition, check: func(t *testing.T, h *harness, r Result) { refusedIn("DELETING")(t, h, r) }},
		{name: "unknown workspace", setup: oneNode, entry: ent(OpWorkspaceSetNetwork, setNet("ws-nope", toPublic)), code: api.CodeNotFound},
		{name: "bad rule", setup: stopped, entry: set(api.NetworkChange{Egress: str("public"), Deny: rules("10.0.0.0/33")}), code: api.CodeInvalidArgument,
			check: func(t *testing.T, h *harness, r Result) {
				says("workspace "+w.WorkspaceID, `deny rule "10.0.0.0/33"`)(t, h, r)
			}},
		{name: "unknown egress", setup: stopped, entry: set(api.NetworkChange{Egress: str("corp")}), code: api.CodeNotFound,
			check: says("egress corp does not exist: create it with kibo egress create corp --socks5 HOST:PORT")},
		{name: "unknown resolver", setup: available, entry: set(api.NetworkChange{Resolver: str("corp-dns")}), code: api.CodeNotFound,
			check: says("resolver corp-dns does not exist")},
		// Lists on a Workspace whose egress stays none.
		{name: "lists without public egress", setup: stopped, entry: set(api.NetworkChange{Allow: rules("10.0.0.0/8")}), code: api.CodeInvalidArgument,
			check: says("allow/deny lists apply to public egress only")},
		// Leaving public egress: the stored lists must be emptied in the
		// same change, and the refusal says how.
		{name: "leaving public, the lists kept", setup: func(h *harness) { stopped(h); h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic)) },
			entry: set(api.NetworkChange{Egress: str("none")}), code: api.CodeInvalidArgument,
			check: func(t *testing.T, h *harness, r Result) {
				says("not to egress none", "kibo workspace set-network "+w.WorkspaceID+" --egress none --clear-allow --clear-deny")(t, h, r)
			}},
		{name: "leaving public, the lists emptied", setup: func(h *harness) { stopped(h); h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic)) },
			entry: set(api.NetworkChange{Egress: str("none"), Allow: rules(), Deny: rules()}),
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[api.Workspace](t, r).Network; got.Egress != api.EgressNone || len(got.Allow)+len(got.Deny) != 0 {
					t.Errorf("after leaving public with the lists emptied: %+v", got)
				}
			}},
		{name: "validation before the state", setup: func(h *harness) { oneNode(h); w = h.create("c1", smallWS) },
			entry: set(api.NetworkChange{Egress: str("corp")}), code: api.CodeNotFound},
		{name: "malformed arguments", setup: stopped, entry: func(h *harness) Entry {
			return h.entry(OpWorkspaceSetNetwork, nil, withRawArgs(`{"workspace_id":"`+w.WorkspaceID+`","allow":"10.0.0.0/8"}`))
		}, code: api.CodeInvalidArgument},
	}
	runCases(t, cases)
}

// set-network changes only the items given; an empty list clears one, an
// empty resolver goes back to the deployment's.
func TestWorkspaceSetNetworkChangesOnlyWhatIsGiven(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	id := h.stopped("c1", smallWS).WorkspaceID
	step := func(c api.NetworkChange, want api.NetworkPolicy) {
		t.Helper()
		h.advance(time.Second)
		if got := policyOf(t, h.ok(OpWorkspaceSetNetwork, setNet(id, c))); !reflect.DeepEqual(got, want) {
			t.Fatalf("after %+v: %+v, want %+v", c, got, want)
		}
	}
	step(toPublic, publicPolicy)
	step(api.NetworkChange{Deny: rules("192.0.2.7")}, api.NetworkPolicy{Egress: "public", Allow: []string{"10.0.0.0/8"}, Deny: []string{"192.0.2.7/32"}})
	step(api.NetworkChange{Allow: rules()}, api.NetworkPolicy{Egress: "public", Deny: []string{"192.0.2.7/32"}})
	// Back to none needs the lists gone too.
	h.advance(time.Second)
	h.fail(api.CodeInvalidArgument, OpWorkspaceSetNetwork, setNet(id, api.NetworkChange{Egress: str("none")}))
	step(api.NetworkChange{Egress: str("none"), Deny: rules()}, api.NetworkPolicy{Egress: "none"})
}

// A Workspace written before policies existed has none: it reads as
// egress none, and set-network of a STOPPED one stores one.
func TestWorkspaceSetNetworkOldRecord(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.stopped("c1", smallWS)
	h.rewriteWorkspace(w.WorkspaceID, func(w *api.Workspace) { w.Network = nil })
	h.advance(time.Second)
	got := decode[api.Workspace](t, h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, api.NetworkChange{Egress: str("none")})))
	if got.Network == nil || got.Network.Egress != api.EgressNone || got.Version != w.Version+1 {
		t.Fatalf("old record after set-network: %+v network %+v", got, got.Network)
	}
}

// The node's answer to a network command: ok commits the requested
// policy; failed keeps the old one and the Workspace AVAILABLE. Either
// way the answer stays on the Workspace for the caller that waits.
func TestWorkspaceNetworkResult(t *testing.T) {
	setup := func(t *testing.T) (*harness, api.Workspace) {
		h := newHarness(t)
		oneNode(h)
		w := h.running("c1", smallWS)
		h.advance(time.Second)
		h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic))
		return h, *h.ws(w.WorkspaceID)
	}
	t.Run("ok", func(t *testing.T) {
		h, w := setup(t)
		got := h.answer(w.WorkspaceID, OutcomeOK, "")
		if got.State != api.WorkspaceAvailable || got.Pending != nil || !reflect.DeepEqual(*got.Network, publicPolicy) ||
			got.InstanceID != w.InstanceID || got.Failure != nil || got.Version != w.Version+1 {
			t.Errorf("after ok: %+v network %+v", got, got.Network)
		}
		want := &api.NetworkChangeResult{CommandID: w.Pending.CommandID, NodeID: "node-a", Outcome: OutcomeOK, At: h.now}
		if !reflect.DeepEqual(got.NetworkChange, want) {
			t.Errorf("network change %+v, want %+v", got.NetworkChange, want)
		}
		if hd := h.holds("node-a"); hd.Instances != 1 || hd.Layers != 1 {
			t.Errorf("holds %+v", hd)
		}
		// A repeated answer changes nothing.
		h.advance(time.Second)
		late := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeFailed, Error: "x"}
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, late)); decode[map[string]bool](t, r)["applied"] {
			t.Error("second answer applied")
		}
		checkIndex(t, h.f)
	})
	t.Run("failed", func(t *testing.T) {
		h, w := setup(t)
		got := h.answer(w.WorkspaceID, OutcomeFailed, "node node-a: rule table not replaced")
		if got.State != api.WorkspaceAvailable || got.Pending != nil || got.Network.Egress != api.EgressNone || got.Failure != nil ||
			got.InstanceID != w.InstanceID || !got.Layer.Held {
			t.Errorf("a failed change changed the Workspace: %+v network %+v", got, got.Network)
		}
		want := &api.NetworkChangeResult{CommandID: w.Pending.CommandID, NodeID: "node-a", Outcome: OutcomeFailed,
			Error: "node node-a: rule table not replaced", At: h.now, Requested: &publicPolicy}
		if !reflect.DeepEqual(got.NetworkChange, want) {
			t.Errorf("network change %+v, want %+v", got.NetworkChange, want)
		}
		// It can be asked again, and stop works as for any AVAILABLE Workspace.
		h.advance(time.Second)
		again := decode[api.Workspace](t, h.ok(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic)))
		if again.Pending == nil || again.Pending.Kind != api.WSCmdNetwork {
			t.Errorf("second try: %+v", again.Pending)
		}
		checkIndex(t, h.f)
	})
	t.Run("refused counts as failed", func(t *testing.T) {
		h, w := setup(t)
		got := h.answer(w.WorkspaceID, OutcomeRefused, "")
		if got.State != api.WorkspaceAvailable || got.NodeID != "node-a" || got.Network.Egress != api.EgressNone ||
			got.NetworkChange == nil || got.NetworkChange.Outcome != OutcomeFailed || got.NetworkChange.Error == "" {
			t.Errorf("after refused: %+v change %+v", got, got.NetworkChange)
		}
	})
	t.Run("a stop replaces the pending change", func(t *testing.T) {
		h, w := setup(t)
		h.advance(time.Second)
		stopping := decode[api.Workspace](t, h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID}))
		if stopping.Pending.Kind != api.WSCmdStop {
			t.Fatalf("pending %+v", stopping.Pending)
		}
		// The node's late answer to the network command is not taken.
		h.advance(time.Second)
		late := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: w.Pending.CommandID, Outcome: OutcomeOK}
		if r := h.expectUnchanged(h.entry(OpWorkspaceResult, late)); decode[map[string]bool](t, r)["applied"] {
			t.Error("late answer applied")
		}
		got := h.answer(w.WorkspaceID, OutcomeOK, "")
		if got.State != api.WorkspaceStopped || got.Network.Egress != api.EgressNone {
			t.Errorf("after stop: %+v network %+v", got, got.Network)
		}
	})
	t.Run("the Instance ends before the answer", func(t *testing.T) {
		h, w := setup(t)
		h.advance(time.Second)
		h.report("node-a", sessOf("node-a"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable, Templates: testTemplates,
			InstanceStates: []api.InstanceState{{InstanceID: w.InstanceID, State: "FAILED", Error: "killed"}}})
		got := h.ws(w.WorkspaceID)
		if got.State != api.WorkspaceFailed || got.Pending != nil || got.Network.Egress != api.EgressNone ||
			got.NetworkChange == nil || got.NetworkChange.Outcome != OutcomeFailed || got.NetworkChange.CommandID != w.Pending.CommandID ||
			!strings.Contains(got.NetworkChange.Error, "ended before node node-a applied") {
			t.Errorf("after the Instance ended: %+v pending %+v change %+v", got, got.Pending, got.NetworkChange)
		}
		checkIndex(t, h.f)
	})
	t.Run("its node is isolated", func(t *testing.T) {
		h, w := setup(t)
		h.closeSession("node-a", sessOf("node-a"))
		h.advance(time.Second)
		res := decode[api.IsolateResult](t, h.ok(OpNodeIsolate, NodeArgs{NodeID: "node-a"}))
		if res.CommandsFailed != 1 {
			t.Errorf("isolate %+v", res)
		}
		got := h.ws(w.WorkspaceID)
		if got.State != api.WorkspaceFailed || got.Pending != nil || got.NetworkChange == nil || got.NetworkChange.Outcome != OutcomeFailed ||
			got.Network.Egress != api.EgressNone {
			t.Errorf("after isolate: %+v change %+v", got, got.NetworkChange)
		}
		checkIndex(t, h.f)
	})
}

// set-network with a command id: a retry replays the first result, other
// inputs under the same id are refused.
func TestWorkspaceSetNetworkIdempotent(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", smallWS)
	h.advance(time.Second)
	e := h.entry(OpWorkspaceSetNetwork, setNet(w.WorkspaceID, toPublic), withCommand("net-1"), withVersion(w.Version))
	first := h.expect("", e)
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.advance(time.Second)
	retry := e
	retry.IssuedAt = h.now
	if r := h.expectUnchanged(retry); !r.Replayed || string(r.Value) != string(first.Value) {
		t.Errorf("retry %+v, want the first result", r)
	}
	h.fail(api.CodeFailedPrecondition, OpWorkspaceSetNetwork, setNet(w.WorkspaceID, api.NetworkChange{Egress: str("none")}), withCommand("net-1"), withVersion(w.Version))
}
