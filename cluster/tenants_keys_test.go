package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/internal/testenv"
)

// keyClient is an application's client of member m's API listener with
// the API key secret.
func keyClient(t *testing.T, m *clustertest.Member, secret string) *api.Client {
	t.Helper()
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := api.NewTokenClient("https://"+m.Server.APIAddr(), secret, pool)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// namespaceKey makes namespace ns (unless it is default) and a key of
// role in it, and returns the key's secret.
func namespaceKey(t *testing.T, c *clustertest.Cluster, ns, name, role string) string {
	t.Helper()
	ctx := context.Background()
	op := c.Client(c.WaitLeader())
	if _, err := op.Do(ctx, "POST", "/v1/namespaces", api.NamespaceCreateRequest{Name: ns}, nil); err != nil && api.CodeOf(err) != api.CodeAlreadyExists {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	var out api.APIKeyCreated
	if _, err := op.Do(ctx, "POST", "/v1/api-keys", api.APIKeyCreateRequest{Name: name, Namespace: ns, Role: role}, &out); err != nil {
		t.Fatalf("api-key %s of %s: %v", name, ns, err)
	}
	return out.Secret
}

// Two namespaces on a two-host cluster, each with a Volume named data and
// a Workspace: a key of one lists only its own, and every call it makes
// on the other's Workspace or Volume (get, stop, pause, start, delete,
// set-timeout, exec credentials, logs, attach, resize, delete by id) is
// refused as not found, or forbidden where it names the other namespace,
// and leaves both namespaces' objects as they were.
func TestKeysIsolateNamespaces(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, API: &cluster.APIConfig{}, AdjustReport: withCodingTemplate})
	ctrl := c.WaitLeader()
	c.WaitAllReady()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keyA, keyB := namespaceKey(t, c, "acme", "app", api.KeyRoleSandbox), namespaceKey(t, c, "beta", "app", api.KeyRoleSandbox)
	a, b := keyClient(t, ctrl, keyA), keyClient(t, ctrl, keyB)

	objects := map[string]struct{ ws, vol string }{}
	for ns, cl := range map[string]*api.Client{"acme": a, "beta": b} {
		var v api.Volume
		if _, err := cl.Do(ctx, "POST", "/v1/volumes", api.VolumeCreateRequest{Name: "data", SizeBytes: 64 << 20}, &v); err != nil || v.Namespace != ns {
			t.Fatalf("key of %s creates Volume data: %+v %v", ns, v, err)
		}
		var w api.Workspace
		if _, err := cl.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, Timeout: "1h"}, &w); err != nil || w.Namespace != ns {
			t.Fatalf("key of %s creates a Workspace: %+v %v", ns, w, err)
		}
		objects[ns] = struct{ ws, vol string }{w.WorkspaceID, v.VolumeID}
	}
	snapshot := func() string {
		op := c.Client(ctrl)
		op.AllNamespaces = true
		var ws api.WorkspaceList
		var vs api.VolumeList
		if _, err := op.Do(ctx, "GET", "/v1/workspaces?all=true&consistent=true", nil, &ws); err != nil {
			t.Fatal(err)
		}
		if _, err := op.Do(ctx, "GET", "/v1/volumes?consistent=true", nil, &vs); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal([]any{ws, vs})
		return string(raw)
	}
	// The start fails on the in-process nodes (no VMs): wait until the
	// Workspaces settle, so that nothing moves while the refusals run.
	testenv.WaitFor(t, 20*time.Second, "the Workspaces and Volumes settle", func() (bool, string) {
		for ns, o := range objects {
			var w api.Workspace
			if _, err := c.Client(ctrl).Do(ctx, "GET", "/v1/workspaces/"+o.ws, nil, &w); err != nil || w.Pending != nil {
				return false, fmt.Sprint(w.State, err)
			}
			in := c.Client(ctrl)
			in.Namespace = ns
			var v api.Volume
			if _, err := in.Do(ctx, "GET", "/v1/volumes/"+o.vol, nil, &v); err != nil || v.Pending != nil {
				return false, fmt.Sprint(v.State, err)
			}
		}
		return true, ""
	})
	before := snapshot()

	theirs := objects["beta"]
	refused := []struct {
		method, path string
		body         any
		code         api.Code
	}{
		{"GET", "/v1/workspaces/" + theirs.ws, nil, api.CodeNotFound},
		{"GET", "/v1/workspaces/" + theirs.ws + "/logs", nil, api.CodeNotFound},
		{"GET", "/v1/workspaces/" + theirs.ws + "/cleanup-status", nil, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/stop", api.WorkspaceWriteRequest{}, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/start", api.WorkspaceWriteRequest{}, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/pause", api.WorkspaceWriteRequest{}, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/delete", api.WorkspaceWriteRequest{}, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/timeout", map[string]string{"timeout": "2h"}, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/credentials", nil, api.CodeNotFound},
		{"POST", "/v1/workspaces/" + theirs.ws + "/network", map[string]any{"egress": "public"}, api.CodeNotFound},
		{"POST", "/v1/workspaces", api.WorkspaceCreateRequest{From: theirs.ws}, api.CodeNotFound},
		{"POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20, Volumes: []api.VolumeAttach{{Volume: theirs.vol, Path: "/data"}}}, api.CodeNotFound},
		{"GET", "/v1/volumes/" + theirs.vol, nil, api.CodeNotFound},
		{"POST", "/v1/volumes/" + theirs.vol + "/resize", api.VolumeResizeRequest{SizeBytes: 128 << 20}, api.CodeNotFound},
		{"POST", "/v1/volumes/" + theirs.vol + "/delete", api.WriteMeta{}, api.CodeNotFound},
		{"GET", "/v1/volumes?namespace=beta", nil, api.CodePermissionDenied},
		{"GET", "/v1/workspaces?all_namespaces=true", nil, api.CodePermissionDenied},
		{"GET", "/v1/namespaces/beta", nil, api.CodeNotFound},
		{"GET", "/v1/api-keys", nil, api.CodePermissionDenied},
		{"GET", "/v1/nodes", nil, api.CodePermissionDenied},
	}
	for _, r := range refused {
		if _, err := a.Do(ctx, r.method, r.path, r.body, nil); api.CodeOf(err) != r.code {
			t.Errorf("key of acme: %s %s: %v, want %s", r.method, r.path, err, r.code)
		}
	}
	// Its own lists and names are its own.
	var ws api.WorkspaceList
	if _, err := a.Do(ctx, "GET", "/v1/workspaces?all=true", nil, &ws); err != nil || len(ws.Workspaces) != 1 || ws.Workspaces[0].WorkspaceID != objects["acme"].ws {
		t.Errorf("acme's list: %+v %v, want only %s", ws, err, objects["acme"].ws)
	}
	var vs api.VolumeList
	if _, err := a.Do(ctx, "GET", "/v1/volumes", nil, &vs); err != nil || len(vs.Volumes) != 1 || vs.Volumes[0].VolumeID != objects["acme"].vol {
		t.Errorf("acme's Volumes: %+v %v", vs, err)
	}
	var v api.Volume
	if _, err := b.Do(ctx, "GET", "/v1/volumes/data", nil, &v); err != nil || v.VolumeID != theirs.vol {
		t.Errorf("beta's data: %+v %v, want %s", v, err, theirs.vol)
	}
	if after := snapshot(); after != before {
		t.Errorf("the refused calls changed the Workspaces or Volumes:\nbefore %s\nafter  %s", before, after)
	}
}

// A revoked key is refused on every ctrl member within 2 s of the revoke's
// answer.
func TestKeyRevokeRefusedOnEveryMember(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, API: &cluster.APIConfig{}})
	c.WaitLeader()
	c.WaitAllReady()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret := namespaceKey(t, c, "acme", "app", api.KeyRoleSandbox)
	clients := map[string]*api.Client{}
	for _, m := range c.Members {
		clients[m.ID] = keyClient(t, m, secret)
		testenv.WaitFor(t, 10*time.Second, "key accepted on "+m.ID, func() (bool, string) {
			_, err := clients[m.ID].Do(ctx, "GET", "/v1/workspaces", nil, nil)
			return err == nil, fmt.Sprint(err)
		})
	}
	op := c.Client(follower(c))
	op.Namespace = "acme"
	if _, err := op.Do(ctx, "POST", "/v1/api-keys/app/revoke", api.WriteMeta{}, nil); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	var slowest time.Duration
	ids := make([]string, 0, len(clients))
	for id := range clients {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		cl := clients[id]
		cl.Retries = 1
		testenv.WaitFor(t, 5*time.Second, "key refused on "+id, func() (bool, string) {
			_, err := cl.Do(ctx, "GET", "/v1/workspaces", nil, nil)
			return api.CodeOf(err) == api.CodeUnauthenticated, fmt.Sprint(err)
		})
		slowest = max(slowest, time.Since(revoked))
	}
	if slowest > 2*time.Second {
		t.Fatalf("the revoked key was refused on every member only %s after the revoke, want within 2 s", slowest)
	}
	t.Logf("refused on all %d ctrl members within %s of the revoke", len(ids), slowest.Round(time.Millisecond))
}

// A key's LAST USED is recorded by the leader from what every ctrl member
// reports, the same on every member.
func TestKeyLastUsedReported(t *testing.T) {
	t.Parallel()
	tm := cluster.TestTimings()
	tm.KeyUseFlush = 200 * time.Millisecond
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, Timings: &tm, API: &cluster.APIConfig{}})
	c.WaitLeader()
	c.WaitAllReady()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret := namespaceKey(t, c, "acme", "app", api.KeyRoleSandbox)
	used := follower(c)
	start := time.Now()
	// The first call that the follower's replica accepts (it follows the
	// create within a heartbeat).
	kc := keyClient(t, used, secret)
	testenv.WaitFor(t, 10*time.Second, "key accepted on "+used.ID, func() (bool, string) {
		_, err := kc.Do(ctx, "GET", "/v1/workspaces", nil, nil)
		return err == nil, fmt.Sprint(err)
	})
	for _, m := range c.Members {
		op := c.Client(m)
		op.Namespace = "acme"
		testenv.WaitFor(t, 10*time.Second, "LAST USED on "+m.ID, func() (bool, string) {
			var keys []api.APIKey
			if _, err := op.Do(ctx, "GET", "/v1/api-keys", nil, &keys); err != nil || len(keys) != 1 {
				return false, fmt.Sprint(keys, err)
			}
			k := keys[0]
			return k.LastUsedAt != nil && !k.LastUsedAt.Before(start.Add(-time.Second)), fmt.Sprint(k.LastUsedAt)
		})
	}
}

// A key's set-network waits for every voter to reach LevelKeyNetwork:
// an older voter would refuse the entry the others apply. An operator's
// goes to the log as before (where the Workspace, which never runs here, refuses it).
func TestKeyNetworkChangeNeedsEveryVoter(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 2, AdjustReport: withCodingTemplate, API: &cluster.APIConfig{Rate: 1000, Burst: 1000},
		FeatureLevels: map[string]int{"node-2": fsm.LevelKeyNetwork - 1}})
	leader := c.WaitLeader()
	ctx := context.Background()
	key := keyClient(t, leader, namespaceKey(t, c, "acme", "app", api.KeyRoleSandbox))
	var ws api.Workspace
	if _, err := key.Do(ctx, "POST", "/v1/workspaces", api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 1000, MemoryBytes: 256 << 20}, &ws); err != nil {
		t.Fatal(err)
	}
	public := api.EgressPublic
	change := api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Egress: &public}}
	_, err := key.Do(ctx, "POST", "/v1/workspaces/"+ws.WorkspaceID+"/network", change, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), fmt.Sprintf("feature level %d", fsm.LevelKeyNetwork)) {
		t.Fatalf("a key's set-network below the level: %v, want failed_precondition naming level %d", err, fsm.LevelKeyNetwork)
	}
	if _, err := c.Client(leader).Do(ctx, "POST", "/v1/workspaces/"+ws.WorkspaceID+"/network?namespace=acme", change, nil); err == nil || strings.Contains(err.Error(), "feature level") ||
		!strings.Contains(err.Error(), "set-network needs STOPPED") {
		t.Fatalf("an operator's set-network below the level: %v, want the state machine's refusal of a Workspace that does not run", err)
	}
}
