package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
)

// wsJSON reads a Workspace through the CLI's JSON.
func (e *cliEnv) wsJSON(id string) api.Workspace {
	e.t.Helper()
	var body struct {
		Result api.Workspace `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("workspace", "get", id, "--json", "--consistent")), &body); err != nil {
		e.t.Fatal(err)
	}
	return body.Result
}

// lineOf returns the "Label: value" line of get's table output.
func lineOf(t *testing.T, out, label string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, label+":") {
			return strings.Join(strings.Fields(l), " ")
		}
	}
	t.Fatalf("no %s line in:\n%s", label, out)
	return ""
}

// The network policy through the CLI: create takes it (normalized by
// ctrl), get shows it, set-network changes only what it is given and is
// refused with the right exit code while the Workspace cannot take it;
// bad policies are refused (11 malformed, 12 unknown object, 13 domain
// rules) and change nothing.
func TestWorkspaceNetworkPolicy(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding") // placed here; the start fails: no VMs
	}})
	create := func(args ...string) []string {
		return append([]string{"workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q"}, args...)
	}
	id := strings.TrimSpace(e.mustRun(create("--egress", "public", "--allow", "10.1.2.3, 10.0.0.0/8", "--allow", "2001:db8::1/32", "--deny", "10.9.9.9/16")...))
	ws := e.wsJSON(id)
	want := api.NetworkPolicy{Egress: "public", Allow: []string{"10.1.2.3/32", "10.0.0.0/8", "2001:db8::/32"}, Deny: []string{"10.9.0.0/16"}}
	if ws.Network == nil || strings.Join(ws.Network.Allow, " ") != strings.Join(want.Allow, " ") || strings.Join(ws.Network.Deny, " ") != strings.Join(want.Deny, " ") || ws.Network.Egress != "public" {
		t.Fatalf("created with %+v, want %+v", ws.Network, want)
	}
	out := e.mustRun("workspace", "get", id)
	for label, want := range map[string]string{
		"Egress": "Egress: public", "Resolver": "Resolver: default",
		"Allow": "Allow: 10.1.2.3/32,10.0.0.0/8,2001:db8::/32", "Deny": "Deny: 10.9.0.0/16",
	} {
		if got := lineOf(t, out, label); got != want {
			t.Errorf("get: %q, want %q", got, want)
		}
	}
	if raw := e.mustRun("workspace", "get", id, "--json"); !strings.Contains(raw, `"network": {`) || !strings.Contains(raw, `"egress": "public"`) {
		t.Errorf("get --json has no network object:\n%s", raw)
	}
	// No flags: egress none, and get says so.
	plain := strings.TrimSpace(e.mustRun(create()...))
	if out := e.mustRun("workspace", "get", plain); lineOf(t, out, "Egress") != "Egress: none" || lineOf(t, out, "Allow") != "Allow: -" {
		t.Errorf("get of a Workspace without a policy:\n%s", out)
	}

	// Refused creates: nothing is created.
	before := strings.Count(e.mustRun("workspace", "list", "--all", "-q"), "\n")
	e.expectExit(api.ExitNotFound, "egress corp does not exist: create it with kibo egress create corp --socks5 HOST:PORT", create("--egress", "corp")...)
	e.expectExit(api.ExitNotFound, "resolver corp-dns does not exist: create it with kibo resolver create corp-dns --upstream ADDR", create("--resolver", "corp-dns")...)
	e.expectExit(api.ExitInvalidArgument, `allow rule "*.com" is not a CIDR, an IP address or a domain`, create("--egress", "public", "--allow", "*.com")...)
	e.expectExit(api.ExitInvalidArgument, `allow rule "10.0.0.300" is not a CIDR`, create("--egress", "public", "--allow", "10.0.0.300")...)
	e.expectExit(api.ExitInvalidArgument, "allow/deny lists apply to public egress only", create("--deny", "10.0.0.0/8")...)
	e.expectExit(api.ExitInvalidArgument, "use none, public or the name of an Egress object", create("--egress", "Public")...)
	if after := strings.Count(e.mustRun("workspace", "list", "--all", "-q"), "\n"); after != before {
		t.Fatalf("refused creates made Workspaces: %d → %d", before, after)
	}

	// FAILED (the node runs no VMs): set-network is refused, naming the state.
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		ws = e.wsJSON(id)
		return ws.State == api.WorkspaceFailed, "state " + ws.State
	})
	e.expectExit(api.ExitFailedPrecondition, "workspace "+id+" is FAILED: set-network needs STOPPED", "workspace", "set-network", id, "--egress", "none", "--clear-allow", "--clear-deny")

	// STOPPED: stored at once, only what is given.
	e.mustRun("workspace", "stop", id)
	v := e.wsJSON(id).Version
	vs := strconv.FormatUint(v, 10)
	out = e.mustRun("workspace", "set-network", id, "--deny", "192.0.2.7", "--command-id", "net-1", "--expected-version", vs)
	if !strings.Contains(out, "workspace "+id+" network policy: egress public, allow 10.1.2.3/32,10.0.0.0/8,2001:db8::/32, deny 192.0.2.7/32 (stored;") {
		t.Fatalf("set-network: %q", out)
	}
	if got := e.wsJSON(id); got.Version != v+1 || got.Pending != nil || strings.Join(got.Network.Deny, ",") != "192.0.2.7/32" || len(got.Network.Allow) != 3 {
		t.Fatalf("after set-network: version %d (was %d) pending %+v network %+v", got.Version, v, got.Pending, got.Network)
	}
	// The same command again: its result, nothing changes; other inputs: 13.
	e.mustRun("workspace", "set-network", id, "--deny", "192.0.2.7", "--command-id", "net-1", "--expected-version", vs)
	if got := e.wsJSON(id).Version; got != v+1 {
		t.Fatalf("replay moved the version to %d", got)
	}
	e.expectExit(api.ExitFailedPrecondition, "already used", "workspace", "set-network", id, "--deny", "192.0.2.8", "--command-id", "net-1", "--expected-version", vs)
	e.expectExit(api.ExitVersionMismatch, "not the expected", "workspace", "set-network", id, "--clear-allow", "--expected-version", vs)
	e.expectExit(api.ExitNotFound, "egress corp does not exist", "workspace", "set-network", id, "--egress", "corp", "--clear-allow", "--clear-deny")
	e.expectExit(api.ExitInvalidArgument, "apply to public egress only", "workspace", "set-network", id, "--egress", "none")
	e.expectExit(api.ExitUsage, "--allow and --clear-allow are exclusive", "workspace", "set-network", id, "--allow", "10.0.0.0/8", "--clear-allow")
	e.expectExit(api.ExitUsage, "give what to change", "workspace", "set-network", id)
	e.expectExit(api.ExitNotFound, "workspace ws-nope does not exist", "workspace", "set-network", "ws-nope", "--egress", "none")
	if got := e.wsJSON(id).Version; got != v+1 {
		t.Fatalf("refused set-networks moved the version to %d", got)
	}
	raw := e.mustRun("workspace", "set-network", id, "--egress", "none", "--clear-allow", "--clear-deny", "--json")
	var body struct {
		Result api.Workspace `json:"result"`
	}
	if err := json.Unmarshal([]byte(raw), &body); err != nil || body.Result.Network == nil || body.Result.Network.Egress != "none" ||
		len(body.Result.Network.Allow)+len(body.Result.Network.Deny) != 0 {
		t.Fatalf("set-network --json: %v %s", err, raw)
	}
	if out := e.mustRun("workspace", "get", id); lineOf(t, out, "Egress") != "Egress: none" || lineOf(t, out, "Deny") != "Deny: -" {
		t.Fatalf("get after back to none:\n%s", out)
	}
}

// set-network of a running Workspace waits for its node: the node's
// failure (here: it runs no VMs, so UpdateNetwork is never reached) is
// printed with exit 13, the Workspace stays AVAILABLE with its old policy
// and get shows the failed change. The Workspace is made AVAILABLE by
// answering its start in the node's place, between pings: with a long
// ping nothing dispatches the start to the real node in between.
func TestWorkspaceSetNetworkNodeFailure(t *testing.T) {
	tm := cluster.TestTimings()
	tm.SessionPing, tm.SessionTimeout, tm.SyncInterval = time.Minute, 3*time.Minute, 10*time.Minute
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, Timings: &tm, AdjustReport: func(_ string, r *api.Report) {
		r.Templates = append(r.Templates, "kibotos-coding")
	}})
	id := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "kibotos-coding", "--memory", "256MiB", "--no-wait", "-q"))
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		st := e.wsJSON(id).State
		return st == api.WorkspaceFailed, "state " + st
	})
	e.mustRun("workspace", "stop", id)
	srv := e.c.Members[0].Server
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := srv.ApplyOp(ctx, fsm.OpWorkspaceStart, fsm.WorkspaceArgs{WorkspaceID: id}); err != nil || res.Error != nil {
		t.Fatalf("start: %v %v", err, res.Error)
	}
	ws := e.wsJSON(id)
	n, err := e.c.Node(e.c.Members[0], ws.Pending.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := srv.ApplyOp(ctx, fsm.OpWorkspaceResult, fsm.WorkspaceResultArgs{NodeID: n.NodeID, SessionID: n.Session.SessionID,
		WorkspaceID: id, CommandID: ws.Pending.CommandID, Outcome: fsm.OutcomeOK}); err != nil || res.Error != nil {
		t.Fatalf("answer the start: %v %v", err, res.Error)
	}
	if ws = e.wsJSON(id); ws.State != api.WorkspaceAvailable {
		t.Fatalf("the real node answered the start first (%s): the test's premise failed", ws.State)
	}

	e.expectExit(api.ExitFailedPrecondition, "workspace "+id+": node node-1 did not apply the network policy: node node-1 runs no VMs", "workspace", "set-network", id, "--egress", "public")
	after := e.wsJSON(id)
	if after.State != api.WorkspaceAvailable || after.Pending != nil || after.Network.Egress != api.EgressNone || after.Version != ws.Version+2 {
		t.Fatalf("after the failed change: %s pending %+v network %+v version %d (was %d)", after.State, after.Pending, after.Network, after.Version, ws.Version)
	}
	out := e.mustRun("workspace", "get", id)
	if lineOf(t, out, "Egress") != "Egress: none" || !strings.Contains(lineOf(t, out, "Network change"), "failed on node node-1") {
		t.Fatalf("get after the failed change:\n%s", out)
	}
	// --no-wait returns once ctrl accepted it; the answer comes later.
	out = e.mustRun("workspace", "set-network", id, "--egress", "public", "--allow", "10.0.0.0/8", "--no-wait")
	if !strings.Contains(out, "network policy: egress public, allow 10.0.0.0/8 requested (sent to node node-1;") {
		t.Fatalf("--no-wait: %q", out)
	}
}

// How a wait for the node's answer to a network change ends, from the
// Workspace the wait reads: ok, a failure on the node (the error is the
// node's, the policy the old one), or a command that replaced it.
func TestNetworkSettled(t *testing.T) {
	old := &api.NetworkPolicy{Egress: "none"}
	pending := &api.WorkspaceCommand{Kind: api.WSCmdNetwork, CommandID: "ws-1/5", NodeID: "node-a"}
	for _, c := range []struct {
		name string
		ws   *api.Workspace
		done bool
		exit int
		msg  string
	}{
		{name: "still pending", ws: &api.Workspace{State: api.WorkspaceAvailable, Network: old, Pending: pending}},
		{name: "ok", ws: &api.Workspace{State: api.WorkspaceAvailable, Network: &api.NetworkPolicy{Egress: "public"},
			NetworkChange: &api.NetworkChangeResult{CommandID: "ws-1/5", NodeID: "node-a", Outcome: "ok"}}, done: true},
		{name: "failed on the node", ws: &api.Workspace{State: api.WorkspaceAvailable, Network: old,
			NetworkChange: &api.NetworkChangeResult{CommandID: "ws-1/5", NodeID: "node-a", Outcome: "failed", Error: "node node-a: not built yet"}},
			exit: api.ExitFailedPrecondition, msg: "workspace ws-1: node node-a did not apply the network policy: node node-a: not built yet; the Workspace keeps egress none"},
		{name: "an older change's answer", ws: &api.Workspace{State: api.WorkspaceStopping, Network: old,
			Pending:       &api.WorkspaceCommand{Kind: api.WSCmdStop, CommandID: "ws-1/6", NodeID: "node-a"},
			NetworkChange: &api.NetworkChangeResult{CommandID: "ws-1/2", Outcome: "ok"}},
			exit: api.ExitFailedPrecondition, msg: "workspace ws-1 is STOPPING: its network change was not applied"},
		{name: "the Instance ended", ws: &api.Workspace{WorkspaceID: "ws-1", State: api.WorkspaceFailed, Network: old,
			Failure: &api.WorkspaceFailure{Reason: api.FailureNoLongerRunning, Message: "killed"}},
			exit: api.ExitFailedPrecondition, msg: "workspace ws-1 is FAILED (NO_LONGER_RUNNING): killed"},
		{name: "deleted", ws: nil, exit: api.ExitNotFound, msg: "deleted before its node answered"},
	} {
		t.Run(c.name, func(t *testing.T) {
			done, err := networkSettled("ws-1", "ws-1/5")(c.ws)
			if done != c.done {
				t.Errorf("done %v, want %v", done, c.done)
			}
			if c.exit == 0 {
				if err != nil {
					t.Errorf("error %v", err)
				}
				return
			}
			ee, ok := err.(exitError)
			if !ok || ee.code != c.exit || !strings.Contains(ee.msg, c.msg) {
				t.Errorf("error %#v, want exit %d saying %q", err, c.exit, c.msg)
			}
		})
	}
}
