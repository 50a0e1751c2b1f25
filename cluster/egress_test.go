package cluster_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

const egressPassword = "pa55-w0rd-never-shown"

// rawGet is a GET presenting cert that returns the status and the body.
func rawGet(t testing.TB, m *clustertest.Member, cert tls.Certificate, addr, path string) (int, []byte) {
	t.Helper()
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	tc := trust.Client{Pool: pool, Cert: trust.Static(cert)}
	hc := &http.Client{Transport: tc.HTTPTransport(trust.Want{Kind: trust.KindMember}, 5*time.Second), Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// Egress and Resolver objects over the operator API: the password goes in
// and never comes out; refusals carry the code that names what is wrong
// and change nothing; members cannot call the operator endpoints.
func TestEgressOverHTTP(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	ctrl, worker := c.Members[0], c.Members[1]
	cl := c.Client(ctrl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	noPassword := func(what string, raw []byte) {
		t.Helper()
		if strings.Contains(string(raw), egressPassword) || strings.Contains(string(raw), `"password"`) {
			t.Fatalf("%s answers the password: %s", what, raw)
		}
	}
	var e api.Egress
	raw, err := cl.Do(ctx, "POST", "/v1/egress", api.EgressCreateRequest{WriteMeta: api.WriteMeta{CommandID: "eg-1"}, Name: "corp", SOCKS5: "Proxy.Corp.Example:1080", Username: "kibo", Password: egressPassword}, &e)
	if err != nil {
		t.Fatal(err)
	}
	noPassword("create", raw)
	if e.Name != "corp" || e.Revision != 1 || e.SOCKS5 != "proxy.corp.example:1080" || !e.PasswordSet || e.Username != "kibo" || e.Version != 1 {
		t.Fatalf("created %+v", e)
	}
	// A retry of the create replays its result; the same name again is refused.
	if raw, err := cl.Do(ctx, "POST", "/v1/egress", api.EgressCreateRequest{WriteMeta: api.WriteMeta{CommandID: "eg-1"}, Name: "corp", SOCKS5: "Proxy.Corp.Example:1080", Username: "kibo", Password: egressPassword}, nil); err != nil || !strings.Contains(string(raw), `"replayed":true`) {
		t.Fatalf("retry: %v %s", err, raw)
	}
	refused := func(code api.Code, msg, method, path string, body any) {
		t.Helper()
		_, err := cl.Do(ctx, method, path, body, nil)
		if api.CodeOf(err) != code || !strings.Contains(err.Error(), msg) {
			t.Fatalf("%s %s: %v, want %s saying %q", method, path, err, code, msg)
		}
		if strings.Contains(err.Error(), egressPassword) {
			t.Fatalf("error names the password: %v", err)
		}
	}
	v := uint64(1)
	refused(api.CodeFailedPrecondition, "egress corp already exists", "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp", SOCKS5: "p:1"})
	refused(api.CodeInvalidArgument, `egress corp2: socks5 address "p" has no port`, "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp2", SOCKS5: "p"})
	refused(api.CodeInvalidArgument, "needs both a username and a password", "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp2", SOCKS5: "p:1", Password: egressPassword})
	refused(api.CodeInvalidArgument, "the password is 300 bytes", "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp2", SOCKS5: "p:1", Username: "u", Password: strings.Repeat("x", 300)})
	refused(api.CodeInvalidArgument, `egress name "none" is reserved`, "POST", "/v1/egress", api.EgressCreateRequest{Name: "none", SOCKS5: "p:1"})
	refused(api.CodeInvalidArgument, "--expected-version applies to update and delete", "POST", "/v1/egress", api.EgressCreateRequest{WriteMeta: api.WriteMeta{ExpectedVersion: &v}, Name: "corp2", SOCKS5: "p:1"})
	refused(api.CodeInvalidArgument, "request body is not valid", "POST", "/v1/egress", map[string]string{"name": "corp2", "socks5": "p:1", "secret": "x"})
	refused(api.CodeInvalidArgument, "give what to change", "POST", "/v1/egress/corp/update", api.EgressUpdateRequest{})
	refused(api.CodeNotFound, "egress nope does not exist", "POST", "/v1/egress/nope/update", api.EgressUpdateRequest{SOCKS5: ptr("p:1")})
	refused(api.CodeNotFound, "egress nope does not exist", "GET", "/v1/egress/nope", nil)
	refused(api.CodeNotFound, "egress nope does not exist", "POST", "/v1/egress/nope/delete", api.WriteMeta{})
	refused(api.CodeInvalidArgument, `egress name "Bad" is not valid`, "GET", "/v1/egress/Bad", nil)

	var u api.Egress
	raw, err = cl.Do(ctx, "POST", "/v1/egress/corp/update", api.EgressUpdateRequest{WriteMeta: api.WriteMeta{ExpectedVersion: &v}, SOCKS5: ptr("[2001:db8::1]:1080")}, &u)
	if err != nil {
		t.Fatal(err)
	}
	noPassword("update", raw)
	if u.Revision != 2 || u.SOCKS5 != "[2001:db8::1]:1080" || !u.PasswordSet || u.Version != 2 {
		t.Fatalf("updated %+v", u)
	}
	refused(api.CodeVersionMismatch, "egress corp is at version 2, not the expected 1", "POST", "/v1/egress/corp/update", api.EgressUpdateRequest{WriteMeta: api.WriteMeta{ExpectedVersion: &v}, SOCKS5: ptr("p:1")})
	for _, path := range []string{"/v1/egress/corp", "/v1/egress", "/v1/egress?page_size=1"} {
		raw, err := cl.Do(ctx, "GET", path, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		noPassword(path, raw)
		if !strings.Contains(string(raw), `"password_set":true`) {
			t.Errorf("%s does not say the password is set: %s", path, raw)
		}
	}

	// Resolvers.
	var r api.Resolver
	if _, err := cl.Do(ctx, "POST", "/v1/resolvers", api.ResolverCreateRequest{Name: "corp-dns", Upstreams: []string{"192.0.2.53", "dns.corp.example:5353"}}, &r); err != nil {
		t.Fatal(err)
	}
	if strings.Join(r.Upstreams, " ") != "192.0.2.53:53 dns.corp.example:5353" || r.Version != 1 {
		t.Fatalf("resolver %+v", r)
	}
	refused(api.CodeInvalidArgument, "resolver corp-dns2: 9 upstreams given: give 1-8", "POST", "/v1/resolvers", api.ResolverCreateRequest{Name: "corp-dns2", Upstreams: make([]string, 9)})
	refused(api.CodeFailedPrecondition, "resolver corp-dns already exists", "POST", "/v1/resolvers", api.ResolverCreateRequest{Name: "corp-dns", Upstreams: []string{"192.0.2.1"}})
	var rl api.ResolverList
	if _, err := cl.Do(ctx, "GET", "/v1/resolvers", nil, &rl); err != nil || len(rl.Resolvers) != 1 || rl.Resolvers[0].Name != "corp-dns" {
		t.Fatalf("resolver list %+v %v", rl, err)
	}

	// Members call no operator endpoint.
	for _, call := range []struct{ method, path string }{{"GET", "/v1/egress"}, {"GET", "/v1/egress/corp"}, {"POST", "/v1/egress"}, {"POST", "/v1/egress/corp/delete"}, {"GET", "/v1/resolvers"}, {"POST", "/v1/resolvers/corp-dns/delete"}} {
		if status, e := rawCall(t, ctrl, memberCert(t, worker), ctrl.Addr, call.method, call.path, struct{}{}, nil); status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not an operator") {
			t.Errorf("member certificate on %s %s: %d %v, want 403", call.method, call.path, status, e)
		}
	}

	// Deletes; a delete of a used object is refused (see the credentials test).
	if _, err := cl.Do(ctx, "POST", "/v1/egress/corp/delete", api.WriteMeta{ExpectedVersion: ptr(uint64(2))}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/resolvers/corp-dns/delete", api.WriteMeta{}, nil); err != nil {
		t.Fatal(err)
	}
	refused(api.CodeNotFound, "egress corp does not exist", "GET", "/v1/egress/corp", nil)
	refused(api.CodeNotFound, "resolver corp-dns does not exist", "GET", "/v1/resolvers/corp-dns", nil)
}

// The node a Workspace's start is pending on gets a task naming the
// Egress revision (address, no credentials) and the Resolver's
// upstreams, and the credentials of that revision from the internal
// endpoint; no other node and no operator gets them, nor does it get
// another revision's. The objects cannot be deleted while used.
func TestEgressCredentialsOnlyToItsNode(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var held []api.WorkspaceTask
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1,
		AdjustReport: func(_ string, r *api.Report) { r.Templates = append(r.Templates, "kibotos-coding") },
		HoldTask: func(node string, task api.WorkspaceTask) bool {
			if node != "node-2" {
				return false
			}
			mu.Lock()
			defer mu.Unlock()
			held = append(held, task)
			return true // node-2 never answers: the start stays pending there
		}})
	ctrl, worker := c.Members[0], c.Members[1]
	cl := c.Client(ctrl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.Do(ctx, "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp", SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: egressPassword}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/resolvers", api.ResolverCreateRequest{Name: "corp-dns", Upstreams: []string{"192.0.2.53"}}, nil); err != nil {
		t.Fatal(err)
	}
	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, NodeID: "node-2",
		Network: &api.NetworkPolicy{Egress: "corp", Resolver: "corp-dns"}}, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.Network.EgressRevision != 1 || ws.NodeID != "node-2" {
		t.Fatalf("created %+v network %+v", ws, ws.Network)
	}
	var task api.WorkspaceTask
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range held {
			if h.WorkspaceID == ws.WorkspaceID {
				task = h
				return true, ""
			}
		}
		return false, "no task reached node-2"
	})
	if task.Egress == nil || *task.Egress != (api.TaskEgress{Name: "corp", Revision: 1, SOCKS5: "proxy.corp.example:1080", Credentials: true}) {
		t.Errorf("task egress %+v", task.Egress)
	}
	if task.Resolver == nil || strings.Join(task.Resolver.Upstreams, ",") != "192.0.2.53:53" {
		t.Errorf("task resolver %+v", task.Resolver)
	}
	if raw, _ := json.Marshal(task); strings.Contains(string(raw), egressPassword) {
		t.Errorf("the task carries the password: %s", raw)
	}

	path := api.EgressCredentialsPath("corp", 1)
	status, body := rawGet(t, ctrl, memberCert(t, worker), ctrl.Addr, path)
	var got struct {
		Result api.EgressCredentials `json:"result"`
	}
	if err := json.Unmarshal(body, &got); status != http.StatusOK || err != nil {
		t.Fatalf("node-2's credentials: %d %s", status, body)
	}
	if want := (api.EgressCredentials{Name: "corp", Revision: 1, SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: egressPassword}); got.Result != want {
		t.Fatalf("credentials %+v, want %+v", got.Result, want)
	}
	// Through the node's own member (node-only): sent on to ctrl.
	mc, err := worker.Dir.MemberCertificate()
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := worker.Dir.CAPool()
	nc := api.NewClient(worker.Addr, trust.Client{Pool: pool, Cert: trust.Static(mc)})
	nc.Consistent = true
	var viaNode api.EgressCredentials
	if _, err := nc.Do(ctx, "GET", path, nil, &viaNode); err != nil || viaNode.Password != egressPassword {
		t.Fatalf("credentials through node-2's member: %+v %v", viaNode, err)
	}

	for _, c := range []struct {
		what   string
		cert   tls.Certificate
		path   string
		status int
		says   string
	}{
		{"another node", memberCert(t, ctrl), path, http.StatusForbidden, "node node-1 runs no Workspace whose network policy uses egress corp revision 1"},
		{"an operator", adminCert(t, ctrl), path, http.StatusForbidden, "is not a member"},
		{"another revision", memberCert(t, worker), "/v1/internal/egress/corp/revisions/2", http.StatusNotFound, "egress corp has no revision 2"},
		{"another egress", memberCert(t, worker), "/v1/internal/egress/other/revisions/1", http.StatusNotFound, "egress other has no revision 1"},
		{"a bad revision", memberCert(t, worker), "/v1/internal/egress/corp/revisions/x", http.StatusBadRequest, `revision "x" is not a revision number`},
		{"a bad name", memberCert(t, worker), "/v1/internal/egress/Bad/revisions/1", http.StatusBadRequest, `egress name "Bad" is not valid`},
	} {
		status, body := rawGet(t, ctrl, c.cert, ctrl.Addr, c.path)
		var eb api.ErrorBody
		json.Unmarshal(body, &eb)
		if status != c.status || eb.Error == nil || !strings.Contains(eb.Error.Message, c.says) || strings.Count(eb.Error.Message, "\n") > 0 {
			t.Errorf("%s: %d %s, want %d saying %q", c.what, status, body, c.status, c.says)
		}
		if strings.Contains(string(body), egressPassword) {
			t.Errorf("%s: the answer carries the password: %s", c.what, body)
		}
	}

	// Used objects cannot be deleted; the Workspace's list and count show it.
	for _, p := range []string{"/v1/egress/corp/delete", "/v1/resolvers/corp-dns/delete"} {
		_, err := cl.Do(ctx, "POST", p, api.WriteMeta{}, nil)
		if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "is used by workspaces "+ws.WorkspaceID+": change their network policy first") {
			t.Fatalf("%s of a used object: %v", p, err)
		}
	}
	var e api.Egress
	if _, err := cl.Do(ctx, "GET", "/v1/egress/corp", nil, &e); err != nil || e.Workspaces != 1 {
		t.Fatalf("egress %+v %v", e, err)
	}
}

func ptr[T any](v T) *T { return &v }

// A one-member cluster (kibotos dev) whose leader has not passed its
// barrier yet still gives its own node the credentials: the first
// Workspace with an Egress, created as soon as the node is ready, starts.
func TestEgressCredentialsFromALeaderCatchingUp(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1,
		AdjustReport: func(_ string, r *api.Report) { r.Templates = append(r.Templates, "kibotos-coding") },
		HoldTask:     func(string, api.WorkspaceTask) bool { return true }})
	dev := c.Members[0]
	cl := c.Client(dev)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.Do(ctx, "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp", SOCKS5: "proxy.corp.example:1080", Username: "kibo", Password: egressPassword}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20,
		Network: &api.NetworkPolicy{Egress: "corp"}}, nil); err != nil {
		t.Fatal(err)
	}
	dev.Server.ForgetCaughtUp()
	got, err := dev.Server.EgressCredentials(ctx, "corp", 1)
	if err != nil || got.Password != egressPassword {
		t.Fatalf("credentials from the only member, leading but not caught up: %+v %v", got, err)
	}
}
