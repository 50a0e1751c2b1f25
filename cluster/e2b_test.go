package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// e2bCompat is the snapshot of a sandbox's size on the node that plays.
var e2bCompat = api.SnapshotCompat{InstallationID: "sha256-a", QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", MemoryMiB: 512, VCPUs: 1}

// e2bCall is one answer of the E2B API listener.
type e2bCall struct {
	status int
	header http.Header
	body   []byte
}

func (c e2bCall) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(c.body, v); err != nil {
		t.Fatalf("answer %d %q: %v", c.status, c.body, err)
	}
}

// e2bError is the E2B error body of an answer, checked to be one.
func (c e2bCall) e2bError(t *testing.T) string {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	c.decode(t, &e)
	if e.Code != c.status || e.Message == "" {
		t.Fatalf("error answer %d: want E2B's {code, message} with code %d, got %s", c.status, c.status, c.body)
	}
	return e.Message
}

// The E2B control API as the SDKs call it, on a member with [e2b]: a
// sandbox is a Workspace of the key's namespace, created running with
// E2B's default timeout, listed with its metadata, paged, given a new
// timeout, paused (409 when it is already) and connected again (201
// resumed, 200 running), killed; a key of another namespace finds none
// of it; without a key, 401; what is not served says so as E2B's JSON.
func TestE2BControlAPI(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, E2B: &cluster.E2BConfig{BaseTemplate: "kibotos-coding", Domain: "e2b.test"},
		AdjustReport: func(_ string, r *api.Report) {
			r.Templates = append(r.Templates, "kibotos-coding")
			r.DataPlaneAddress = "127.0.0.1:9" // nothing answers: a guest is never reached here
			r.Capacity.CPU = 8000              // the sandboxes, their snapshots and sandboxes from them
			r.Resume = &api.ResumeInfo{QEMUVersion: "7.2.9", Accel: "tcg", CPUModel: "max", Installations: []string{"sha256-a"}}
		},
		HoldTask: func(string, api.WorkspaceTask) bool { return true }})
	m := c.Members[0]
	addr := m.Server.E2BAddr()
	if addr == "" {
		t.Fatal("the member serves no E2B API though [e2b] listen is set")
	}
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	hc := apiClient(t, pool, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The node: starts and pauses done as soon as asked.
	defer playNode(t, ctx, c, m).answerEvery(&api.SnapshotReport{SizeBytes: 100 << 20, Compat: e2bCompat})()
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/namespaces", api.NamespaceCreateRequest{Name: "acme"}, nil); err != nil {
		t.Fatal(err)
	}
	key := createKey(t, c, "app", api.KeyRoleSandbox)
	var other api.APIKeyCreated
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/api-keys", api.APIKeyCreateRequest{Name: "other", Namespace: "acme", Role: api.KeyRoleSandbox}, &other); err != nil {
		t.Fatal(err)
	}
	send := func(method, path string, body any, header map[string]string) e2bCall {
		t.Helper()
		var rd io.Reader
		switch b := body.(type) {
		case nil:
		case []byte: // sent as it is
			rd = bytes.NewReader(b)
		default:
			raw, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			rd = bytes.NewReader(raw)
		}
		req, err := http.NewRequestWithContext(ctx, method, "https://"+addr+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return e2bCall{status: resp.StatusCode, header: resp.Header, body: raw}
	}
	do := func(key, method, path string, body any) e2bCall {
		t.Helper()
		if key == "" {
			return send(method, path, body, nil)
		}
		return send(method, path, body, map[string]string{"X-API-KEY": key}) // the SDKs' spelling
	}
	// envd is a request to a sandbox's envd through E2B_SANDBOX_URL.
	envd := func(sandbox, port, token, method, path string) e2bCall {
		t.Helper()
		h := map[string]string{"E2b-Sandbox-Id": sandbox, "E2b-Sandbox-Port": port}
		if token != "" {
			h["X-Access-Token"] = token
		}
		return send(method, path, nil, h)
	}
	type sandbox struct {
		SandboxID, TemplateID, EnvdVersion, ClientID, State string
		EnvdAccessToken, TrafficAccessToken                 string
		Metadata                                            map[string]string
		StartedAt, EndAt                                    time.Time
		CPUCount, MemoryMB                                  int
		Lifecycle                                           *struct {
			OnTimeout  string
			AutoResume bool
		}
	}

	if r := do("", "GET", "/v2/sandboxes", nil); r.status != http.StatusUnauthorized || !strings.Contains(r.e2bError(t), "X-API-Key") {
		t.Fatalf("without a key: %d %s, want 401 saying how to send one", r.status, r.body)
	}
	if r := do(key, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "envVars": map[string]string{"1A": "s3cret"}}); r.status != http.StatusBadRequest ||
		!strings.Contains(r.e2bError(t), `environment variable name "1A" is not valid`) || strings.Contains(string(r.body), "s3cret") {
		t.Fatalf("create with a bad envVars name: %d %s, want 400 naming it and not its value", r.status, r.body)
	}
	// Bad input is refused as E2B's 400, and creates nothing.
	for name, body := range map[string]any{"a body that is no JSON": []byte(`{"templateID":`), "a body over 1 MiB": map[string]string{"templateID": strings.Repeat("x", 1<<20)}} {
		if r := do(key, "POST", "/v2/sandboxes", body); r.status != http.StatusBadRequest || !strings.Contains(r.e2bError(t), "request body") {
			t.Errorf("create with %s: %d %s, want 400 about the request body", name, r.status, r.body)
		}
	}

	created := time.Now()
	r := do(key, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "metadata": map[string]string{"user": "a"}, "envVars": map[string]string{"TOKEN": "s3cret"}})
	var a sandbox
	if r.decode(t, &a); r.status != http.StatusCreated || !strings.HasPrefix(a.SandboxID, "ws-") || a.TemplateID != "kibotos-coding" || a.EnvdVersion == "" || a.ClientID == "" || a.EnvdAccessToken == "" {
		t.Fatalf("create from base: %d %s, want 201 with a sandbox of kibotos-coding", r.status, r.body)
	}
	// envVars are its Workspace's environment: names shown, the value not.
	var withEnv api.Workspace
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+a.SandboxID+"?namespace=acme", nil, &withEnv); err != nil || strings.Join(withEnv.EnvNames, ",") != "TOKEN" {
		t.Errorf("the sandbox's Workspace: names %q, %v; want TOKEN", withEnv.EnvNames, err)
	}
	if strings.Contains(string(r.body), "s3cret") {
		t.Errorf("the create's answer shows an envVars value: %s", r.body)
	}
	r = do(key, "GET", "/sandboxes/"+a.SandboxID, nil)
	var info sandbox
	r.decode(t, &info)
	if r.status != http.StatusOK || info.State != "running" || info.Metadata["user"] != "a" || len(info.Metadata) != 1 || info.CPUCount != 1 || info.MemoryMB != 512 ||
		info.Lifecycle == nil || info.Lifecycle.OnTimeout != "kill" || info.EndAt.Before(created.Add(299*time.Second)) || info.EndAt.After(time.Now().Add(301*time.Second)) {
		t.Fatalf("get: %d %s, want running, metadata user=a only, 1 CPU, 512 MB, killed 300 s after its start", r.status, r.body)
	}
	r = do(key, "POST", "/sandboxes", map[string]any{"templateID": "kibotos-coding", "metadata": map[string]string{"user": "b"}, "timeout": 60,
		"autoPause": true, "autoResume": map[string]bool{"enabled": true}, "allow_internet_access": false, "network": map[string]bool{"allowPublicTraffic": false}})
	var b sandbox
	if r.decode(t, &b); r.status != http.StatusCreated || b.TrafficAccessToken == "" || a.TrafficAccessToken != "" {
		t.Fatalf("create on the v1 path, without public traffic: %d %s, want 201 with a trafficAccessToken (and none for a public one)", r.status, r.body)
	}
	var ws api.Workspace
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+b.SandboxID, nil, &ws); err != nil || ws.OnTimeout != api.TimeoutPause || !ws.AutoResume ||
		ws.TimeoutSeconds != 60 || ws.Network == nil || ws.Network.Egress != api.EgressNone {
		t.Fatalf("the Workspace of an autoPause, autoResume sandbox without internet: %+v %v", ws, err)
	}

	// Lists: the metadata filter, then pages of one.
	var list []sandbox
	r = do(key, "GET", "/v2/sandboxes?metadata=user%3Da", nil)
	r.decode(t, &list)
	if r.status != http.StatusOK || len(list) != 1 || list[0].SandboxID != a.SandboxID {
		t.Fatalf("list with metadata user=a: %d %s", r.status, r.body)
	}
	seen := map[string]bool{}
	for token, pages := "", 0; pages == 0 || token != ""; pages++ {
		path := "/v2/sandboxes?limit=1"
		if token != "" {
			path += "&nextToken=" + token
		}
		r = do(key, "GET", path, nil)
		r.decode(t, &list)
		if r.status != http.StatusOK || len(list) > 1 || pages > 3 {
			t.Fatalf("page %d of one: %d %s", pages, r.status, r.body)
		}
		for _, s := range list {
			seen[s.SandboxID] = true
		}
		token = r.header.Get("X-Next-Token")
	}
	if !seen[a.SandboxID] || !seen[b.SandboxID] || len(seen) != 2 {
		t.Fatalf("pages of one: saw %v, want both sandboxes", seen)
	}

	// A new timeout from now.
	if r = do(key, "POST", "/sandboxes/"+a.SandboxID+"/timeout", map[string]int{"timeout": 3600}); r.status != http.StatusNoContent {
		t.Fatalf("timeout: %d %s, want 204", r.status, r.body)
	}
	r = do(key, "GET", "/sandboxes/"+a.SandboxID, nil)
	r.decode(t, &info)
	if info.EndAt.Before(time.Now().Add(3590 * time.Second)) {
		t.Fatalf("after a timeout of 3600 s: ends %s", info.EndAt)
	}

	// Pause, again (409), then connect.
	if r = do(key, "POST", "/sandboxes/"+b.SandboxID+"/pause", nil); r.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s, want 204", r.status, r.body)
	}
	if r = do(key, "POST", "/sandboxes/"+b.SandboxID+"/pause", nil); r.status != http.StatusConflict {
		t.Fatalf("pause of a paused sandbox: %d %s, want 409", r.status, r.body)
	}
	r = do(key, "GET", "/v2/sandboxes?state=paused", nil)
	r.decode(t, &list)
	if len(list) != 1 || list[0].SandboxID != b.SandboxID || list[0].State != "paused" {
		t.Fatalf("list of the paused: %s", r.body)
	}
	for _, q := range []string{"state=running&state=paused", "state=paused,running"} {
		r = do(key, "GET", "/v2/sandboxes?"+q, nil)
		if r.decode(t, &list); len(list) != 2 {
			t.Errorf("list with %s: %s, want both sandboxes", q, r.body)
		}
	}
	if r = do(key, "POST", "/v2/sandboxes/"+b.SandboxID+"/connect", map[string]int{"timeout": 120}); r.status != http.StatusCreated {
		t.Fatalf("connect to a paused sandbox: %d %s, want 201 (resumed)", r.status, r.body)
	}
	if r = do(key, "POST", "/sandboxes/"+b.SandboxID+"/connect", map[string]int{}); r.status != http.StatusOK {
		t.Fatalf("connect to a running sandbox: %d %s, want 200", r.status, r.body)
	}

	// The sandbox API: a sandbox's own token reaches for its guest (which
	// nobody serves here), another's, none or another port does not;
	// what is not served says so.
	if r = envd(a.SandboxID, "49983", a.EnvdAccessToken, "GET", "/health"); r.status != http.StatusBadGateway || !strings.Contains(r.e2bError(t), "reach its guest") {
		t.Errorf("health with the sandbox's token: %d %s, want 502 after trying its guest", r.status, r.body)
	}
	for _, c := range []struct{ token, port, want string }{{b.EnvdAccessToken, "49983", "not this sandbox's"}, {"", "49983", "no access token"},
		{a.EnvdAccessToken + "x", "49983", "not this sandbox's"}} {
		if r = envd(a.SandboxID, c.port, c.token, "GET", "/health"); r.status != http.StatusBadGateway || !strings.Contains(r.e2bError(t), c.want) {
			t.Errorf("health with token %q on port %s: %d %s, want 502 saying %q", c.token, c.port, r.status, r.body, c.want)
		}
	}
	// Its other ports (getHost): a public sandbox's for anyone, through
	// E2B_SANDBOX_URL or by host name, as its creator (which reaches for
	// its guest); one without public traffic only with its traffic token
	// (not an envd token); never another namespace's.
	port := func(sandbox, token string, byHost bool) e2bCall {
		req, err := http.NewRequestWithContext(ctx, "GET", "https://"+addr+"/index.html", nil)
		if err != nil {
			t.Fatal(err)
		}
		if byHost {
			req.Host = "8080-" + sandbox + ".e2b.test:443"
		} else {
			req.Header.Set("E2b-Sandbox-Id", sandbox)
			req.Header.Set("E2b-Sandbox-Port", "8080")
		}
		if token != "" {
			req.Header.Set("E2b-Traffic-Access-Token", token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if byHost && !slices.Contains(resp.TLS.PeerCertificates[0].DNSNames, "*.e2b.test") {
			t.Errorf("the E2B listener's certificate names %v, not the sandboxes' hosts *.e2b.test", resp.TLS.PeerCertificates[0].DNSNames)
		}
		return e2bCall{status: resp.StatusCode, header: resp.Header, body: raw}
	}
	for _, c := range []struct {
		name, sandbox, token string
		byHost               bool
		status               int
		want                 string
	}{
		{"public, by header", a.SandboxID, "", false, http.StatusBadGateway, "reach its guest"},
		{"public, by host", a.SandboxID, "", true, http.StatusBadGateway, "reach its guest"},
		{"no public traffic, no token", b.SandboxID, "", true, http.StatusForbidden, "takes no public traffic"},
		{"no public traffic, its envd token", b.SandboxID, b.EnvdAccessToken, true, http.StatusForbidden, "takes no public traffic"},
		{"no public traffic, its traffic token", b.SandboxID, b.TrafficAccessToken, false, http.StatusBadGateway, "reach its guest"},
		{"not found", "ws-nosuchsandbox", "", true, http.StatusBadGateway, "not found"},
	} {
		if r = port(c.sandbox, c.token, c.byHost); r.status != c.status || !strings.Contains(r.e2bError(t), c.want) {
			t.Errorf("port 8080 of a sandbox %s: %d %s, want %d saying %q", c.name, r.status, r.body, c.status, c.want)
		}
	}
	if r = envd(a.SandboxID, "49983", "", "POST", "/process.Process/StreamInput"); r.status != http.StatusNotImplemented || !strings.Contains(string(r.body), `"unimplemented"`) {
		t.Errorf("process.Process/StreamInput: %d %s, want 501 unimplemented", r.status, r.body)
	}
	for _, c := range []struct {
		token, path string
		status      int
		want        string
	}{{a.EnvdAccessToken, "/process.Process/List", http.StatusServiceUnavailable, "reach its guest"}, {"", "/process.Process/List", http.StatusUnauthorized, "no access token"},
		{b.EnvdAccessToken, "/process.Process/List", http.StatusUnauthorized, "not this sandbox's"}, {a.EnvdAccessToken, "/process.Process/SendSignal", http.StatusServiceUnavailable, "reach its guest"}} {
		h := map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": c.token}
		if r = send("POST", c.path, map[string]any{"process": map[string]int{"pid": 1}, "signal": "SIGNAL_SIGKILL"}, h); r.status != c.status || !strings.Contains(string(r.body), c.want) {
			t.Errorf("%s with token %.12q: %d %s, want %d with %q", c.path, c.token, r.status, r.body, c.status, c.want)
		}
	}

	// Lists sorted by start, newest first unless asc, across pages;
	// startedAfter and template narrow them.
	order := func(query string) []string {
		t.Helper()
		var ids []string
		for token, pages := "", 0; pages == 0 || token != ""; pages++ {
			r := do(key, "GET", "/v2/sandboxes?limit=1&"+query+"&nextToken="+token, nil)
			var page []sandbox
			if r.decode(t, &page); r.status != http.StatusOK || pages > 3 {
				t.Fatalf("list %s, page %d: %d %s", query, pages, r.status, r.body)
			}
			for _, s := range page {
				ids = append(ids, s.SandboxID)
			}
			token = r.header.Get("X-Next-Token")
		}
		return ids
	}
	if got := order("order=asc"); !slices.Equal(got, []string{a.SandboxID, b.SandboxID}) {
		t.Errorf("list in ascending start: %v, want %s then %s", got, a.SandboxID, b.SandboxID)
	}
	if got := order(""); !slices.Equal(got, []string{b.SandboxID, a.SandboxID}) {
		t.Errorf("list, newest first: %v, want %s then %s", got, b.SandboxID, a.SandboxID)
	}
	var bWS api.Workspace
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+b.SandboxID, nil, &bWS); err != nil {
		t.Fatal(err)
	}
	if got := order("startedAfter=" + bWS.CreatedAt.Format(time.RFC3339Nano)); !slices.Equal(got, []string{b.SandboxID}) {
		t.Errorf("list started at or after %s: %v, want %s", bWS.CreatedAt, got, b.SandboxID)
	}
	if got := order("template=base"); len(got) != 2 {
		t.Errorf("list of template base: %v, want both", got)
	}
	if got := order("template=other"); len(got) != 0 {
		t.Errorf("list of template other: %v, want none", got)
	}
	for _, q := range []string{"order=up", "startedAfter=yesterday", "nextToken=bm90LWEtdG9rZW4"} {
		if r = do(key, "GET", "/v2/sandboxes?"+q, nil); r.status != http.StatusBadRequest {
			t.Errorf("list with %s: %d %s, want 400", q, r.status, r.body)
		}
	}

	// The network replaced: the internet off, answered once its node
	// applied it; an exception to a denied range is refused.
	if r = do(key, "PUT", "/sandboxes/"+a.SandboxID+"/network", map[string]any{"allow_internet_access": false, "allowOut": []string{"1.1.1.1"}}); r.status != http.StatusNoContent {
		t.Fatalf("network update: %d %s, want 204", r.status, r.body)
	}
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+a.SandboxID, nil, &ws); err != nil || ws.Network == nil || ws.Network.Egress != api.EgressPublic ||
		!slices.Equal(ws.Network.Allow, []string{"1.1.1.1/32"}) || len(ws.Network.Deny) != 0 {
		t.Fatalf("the Workspace after the internet went off but 1.1.1.1: %+v %v", ws.Network, err)
	}
	var detail struct {
		AllowInternetAccess bool
		Network             struct{ AllowOut []string }
	}
	r = do(key, "GET", "/sandboxes/"+a.SandboxID, nil)
	if r.decode(t, &detail); detail.AllowInternetAccess || !slices.Equal(detail.Network.AllowOut, []string{"1.1.1.1/32"}) {
		t.Errorf("get after the network update: %s, want no internet but 1.1.1.1/32", r.body)
	}
	if r = do(key, "PUT", "/sandboxes/"+a.SandboxID+"/network", map[string]any{"allowOut": []string{"10.1.2.3"}, "denyOut": []string{"10.0.0.0/8"}}); r.status != http.StatusBadRequest ||
		!strings.Contains(r.e2bError(t), "lies in denyOut") {
		t.Errorf("network update with an exception to a denied range: %d %s, want 400", r.status, r.body)
	}

	// A snapshot: a paused fork of the sandbox, no sandbox itself, that
	// new sandboxes start from by its ID or name; a second of the same
	// name replaces it; deleted through the templates path.
	type snapshotInfo struct {
		SnapshotID string
		Names      []string
	}
	var snap, snap2 snapshotInfo
	if r = do(key, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", map[string]string{"name": "Bad Name"}); r.status != http.StatusBadRequest {
		t.Errorf("snapshot with the name 'Bad Name': %d %s, want 400", r.status, r.body)
	}
	r = do(key, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", map[string]string{"name": "snap"})
	if r.decode(t, &snap); r.status != http.StatusCreated ||
		!strings.HasPrefix(snap.SnapshotID, "ws-") || !slices.Equal(snap.Names, []string{"default/snap:default"}) {
		t.Fatalf("snapshot: %d %s, want 201 with its ID and name", r.status, r.body)
	}
	var snapWS api.Workspace
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+snap.SnapshotID, nil, &snapWS); err != nil || snapWS.State != api.WorkspacePaused || snapWS.ForkedFrom != a.SandboxID {
		t.Fatalf("the snapshot's Workspace: %s forked from %q, %v; want PAUSED, forked from %s", snapWS.State, snapWS.ForkedFrom, err, a.SandboxID)
	}
	r = do(key, "GET", "/sandboxes/"+a.SandboxID, nil)
	if r.decode(t, &info); info.State != "running" {
		t.Errorf("the sandbox after its snapshot: %s, want running again", r.body)
	}
	if r = do(key, "GET", "/sandboxes/"+snap.SnapshotID, nil); r.status != http.StatusNotFound {
		t.Errorf("get of a snapshot as a sandbox: %d %s, want 404", r.status, r.body)
	}
	if got := order("order=asc"); !slices.Equal(got, []string{a.SandboxID, b.SandboxID}) {
		t.Errorf("list with a snapshot: %v, want the sandboxes only", got)
	}
	for _, ref := range []string{snap.SnapshotID, "snap", "default/snap:default"} {
		r = do(key, "POST", "/v2/sandboxes", map[string]any{"templateID": ref, "metadata": map[string]string{"from": "snapshot"}})
		var fromSnap sandbox
		if r.decode(t, &fromSnap); r.status != http.StatusCreated {
			t.Fatalf("create from snapshot %s: %d %s, want 201", ref, r.status, r.body)
		}
		var fws api.Workspace
		if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+fromSnap.SandboxID, nil, &fws); err != nil || fws.ForkedFrom != snap.SnapshotID || fws.Labels["from"] != "snapshot" {
			t.Errorf("the sandbox created from %s: forked from %q, labels %v, %v; want a fork of %s", ref, fws.ForkedFrom, fws.Labels, err, snap.SnapshotID)
		}
		if r = do(key, "DELETE", "/sandboxes/"+fromSnap.SandboxID, nil); r.status != http.StatusNoContent {
			t.Fatalf("kill of the sandbox from a snapshot: %d %s", r.status, r.body)
		}
	}
	if r = do(key, "POST", "/v2/sandboxes", map[string]any{"templateID": "snap:v2"}); r.status != http.StatusNotFound && r.status != http.StatusBadRequest {
		t.Errorf("create from a tag that is not: %d %s, want the unknown template's refusal", r.status, r.body)
	}
	r = do(key, "POST", "/sandboxes/"+b.SandboxID+"/snapshots", map[string]string{"name": "snap"})
	if r.decode(t, &snap2); r.status != http.StatusCreated {
		t.Fatalf("second snapshot named snap: %d %s", r.status, r.body)
	}
	var snaps []snapshotInfo
	for _, q := range []string{"", "?name=snap", "?sandboxID=" + b.SandboxID, "?name=" + snap2.SnapshotID} {
		r = do(key, "GET", "/snapshots"+q, nil)
		if r.decode(t, &snaps); len(snaps) != 1 || snaps[0].SnapshotID != snap2.SnapshotID {
			t.Errorf("snapshots%s: %s, want only the newest, %s", q, r.body, snap2.SnapshotID)
		}
	}
	r = do(key, "GET", "/snapshots?sandboxID="+a.SandboxID, nil)
	if r.decode(t, &snaps); len(snaps) != 0 {
		t.Errorf("snapshots of %s after its name moved on: %s, want none", a.SandboxID, r.body)
	}
	if r = do(other.Secret, "DELETE", "/templates/"+snap2.SnapshotID, nil); r.status != http.StatusNotFound {
		t.Errorf("delete of the snapshot with acme's key: %d %s, want 404", r.status, r.body)
	}
	if r = do(key, "DELETE", "/templates/"+snap2.SnapshotID, nil); r.status != http.StatusNoContent {
		t.Errorf("delete of the snapshot: %d %s, want 204", r.status, r.body)
	}
	if r = do(key, "DELETE", "/templates/snap", nil); r.status != http.StatusNotFound {
		t.Errorf("delete of a deleted snapshot: %d %s, want 404 (the SDK's false)", r.status, r.body)
	}

	// Forks: 1 to 16 at once, refused before the sandbox is touched.
	for _, n := range []int{0, 17} {
		if r = do(key, "POST", "/sandboxes/"+a.SandboxID+"/fork", map[string]int{"count": n}); r.status != http.StatusBadRequest || !strings.Contains(r.e2bError(t), "fork 1 to 16 sandboxes at once") {
			t.Errorf("fork of %d: %d %s, want 400", n, r.status, r.body)
		}
	}
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+a.SandboxID, nil, &ws); err != nil || ws.State != api.WorkspaceAvailable {
		t.Errorf("the sandbox after refused forks: %s %v, want AVAILABLE", ws.State, err)
	}

	// A pause without memory stops it: a connect boots it again.
	if r = do(key, "POST", "/sandboxes/"+b.SandboxID+"/pause", map[string]bool{"memory": false}); r.status != http.StatusNoContent {
		t.Fatalf("pause without memory: %d %s, want 204", r.status, r.body)
	}
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/workspaces/"+b.SandboxID, nil, &ws); err != nil || ws.State != api.WorkspaceStopped {
		t.Fatalf("after a pause without memory: %s %v, want STOPPED", ws.State, err)
	}
	if r = do(key, "POST", "/v2/sandboxes/"+b.SandboxID+"/connect", map[string]int{}); r.status != http.StatusCreated {
		t.Fatalf("connect to a sandbox paused without memory: %d %s, want 201", r.status, r.body)
	}

	// Another namespace's key finds nothing of it.
	for _, call := range [][2]string{{"GET", "/sandboxes/" + a.SandboxID}, {"DELETE", "/sandboxes/" + a.SandboxID}, {"POST", "/sandboxes/" + a.SandboxID + "/timeout"},
		{"POST", "/sandboxes/" + b.SandboxID + "/pause"}, {"POST", "/v2/sandboxes/" + b.SandboxID + "/connect"},
		{"PUT", "/sandboxes/" + a.SandboxID + "/network"}, {"POST", "/sandboxes/" + a.SandboxID + "/snapshots"}, {"POST", "/sandboxes/" + a.SandboxID + "/fork"}} {
		if r = do(other.Secret, call[0], call[1], map[string]int{"timeout": 10}); r.status != http.StatusNotFound {
			t.Errorf("%s %s with acme's key: %d %s, want 404", call[0], call[1], r.status, r.body)
		}
	}
	r = do(other.Secret, "GET", "/v2/sandboxes", nil)
	r.decode(t, &list)
	if len(list) != 0 {
		t.Errorf("acme's list: %s, want none", r.body)
	}

	// Kill: gone for the SDK at once.
	if r = do(key, "DELETE", "/sandboxes/"+a.SandboxID, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s, want 204", r.status, r.body)
	}
	if r = do(key, "GET", "/sandboxes/"+a.SandboxID, nil); r.status != http.StatusNotFound {
		t.Fatalf("get after kill: %d %s, want 404", r.status, r.body)
	}
	if r = do(key, "DELETE", "/sandboxes/"+a.SandboxID, nil); r.status != http.StatusNotFound {
		t.Fatalf("kill again: %d %s, want 404 (the SDK's false)", r.status, r.body)
	}
	// A revoked key's tokens open nothing.
	if _, err := c.Client(m).Do(ctx, "POST", "/v1/api-keys/app/revoke", api.WriteMeta{}, nil); err != nil {
		t.Fatal(err)
	}
	if r = envd(b.SandboxID, "49983", b.EnvdAccessToken, "GET", "/health"); !strings.Contains(r.e2bError(t), "no longer active") {
		t.Errorf("health with the token of a revoked key: %d %s", r.status, r.body)
	}
	if r = do(other.Secret, "GET", "/sandboxes/"+b.SandboxID+"/metrics", nil); r.status != http.StatusNotFound || !strings.Contains(r.e2bError(t), "not found") {
		t.Fatalf("metrics of another namespace's sandbox: %d %s, want 404", r.status, r.body)
	}
	if r = do(other.Secret, "GET", "/volumes", nil); r.status != http.StatusNotFound || !strings.Contains(r.e2bError(t), "not part of the E2B API that Kibotos serves") {
		t.Fatalf("volumes: %d %s, want 404 saying it is not served", r.status, r.body)
	}
}
