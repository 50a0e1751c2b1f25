package cluster_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
)

func follower(c *clustertest.Cluster, not ...*clustertest.Member) *clustertest.Member {
	skip := map[*clustertest.Member]bool{}
	for _, m := range not {
		skip[m] = true
	}
	for _, m := range c.Members {
		if m.Running() && !m.Server.IsLeader() && !skip[m] && m.Server.Raft() != nil {
			return m
		}
	}
	return nil
}

func drain(t *testing.T, c *clustertest.Cluster, via *clustertest.Member, node, commandID string, expected *uint64) (*api.Node, bool, error) {
	t.Helper()
	var n api.Node
	raw, err := c.Client(via).Do(context.Background(), "POST", "/v1/nodes/"+node+"/drain", api.NodeWriteRequest{WriteMeta: api.WriteMeta{CommandID: commandID, ExpectedVersion: expected}}, &n)
	if err != nil {
		return nil, false, err
	}
	var rb api.ResultBody
	json.Unmarshal(raw, &rb)
	return &n, rb.Replayed, nil
}

// A client that wrote through a follower reads its write there at once:
// the follower answers the forwarded write only once it has applied it
// too (before, a read right after a create could say not_found).
func TestFollowerReadsItsForwardedWrites(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3})
	c.WaitLeader()
	f := follower(c)
	cl := c.Client(f)
	ctx := context.Background()
	for i := range 100 {
		cpu := fmt.Sprintf("%d.5", 1+i%2)
		var set api.Node
		if _, err := cl.Do(ctx, "POST", "/v1/nodes/node-2/overcommit", api.OvercommitSetRequest{CPU: &cpu}, &set); err != nil {
			t.Fatal(err)
		}
		var got api.Node
		if _, err := cl.Do(ctx, "GET", "/v1/nodes/node-2", nil, &got); err != nil {
			t.Fatal(err)
		}
		if got.RegistrationVersion < set.RegistrationVersion {
			t.Fatalf("write %d through follower %s answered version %d; a read there right after sees %d", i, f.ID, set.RegistrationVersion, got.RegistrationVersion)
		}
	}
}

// A write sent to a follower commits through the leader, also after the
// leader died and a new one was elected.
func TestLeaderLossWritesFromFollowerCommit(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3})
	old := c.WaitLeader()
	f := follower(c)
	if _, _, err := drain(t, c, f, "node-2", "", nil); err != nil {
		t.Fatalf("drain through follower %s: %v", f.ID, err)
	}
	old.Kill()
	var next *clustertest.Member
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		next = c.Leader()
		return next != nil && next != old, "no new leader"
	})
	f = follower(c, old)
	if f == nil {
		t.Fatal("no follower left")
	}
	var n api.Node
	_, err := c.Client(f).Do(context.Background(), "POST", "/v1/nodes/node-3/drain", api.NodeWriteRequest{}, &n)
	if err != nil {
		t.Fatalf("drain through follower %s after leader loss: %v", f.ID, err)
	}
	if !n.DrainRequested {
		t.Fatalf("node-3 not drain_requested after write: %+v", n)
	}
	// Both writes are visible on the leader (consistent reads retry while
	// a loaded machine re-elects).
	for _, id := range []string{"node-2", "node-3"} {
		got, err := c.Node(c.WaitLeader(), id)
		if err != nil || !got.DrainRequested {
			t.Fatalf("%s on the leader: drain_requested=%v err=%v", id, got.DrainRequested, err)
		}
	}
}

// Replaying a command id after a leader change returns the first result
// and has no second effect.
func TestIdempotentReplayAcrossLeaderChange(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3})
	leader := c.WaitLeader()
	f := follower(c)
	before, err := c.Node(leader, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	v := before.RegistrationVersion
	first, replayed, err := drain(t, c, f, "node-2", "drain-node-2", &v)
	if err != nil || replayed {
		t.Fatalf("first drain: replayed=%v err=%v", replayed, err)
	}
	leader.Kill()
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		l := c.Leader()
		return l != nil && l != leader, "no new leader"
	})
	other := follower(c, leader)
	if other == nil {
		other = c.Leader()
	}
	again, replayed, err := drain(t, c, other, "node-2", "drain-node-2", &v)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if !replayed || again.RegistrationVersion != first.RegistrationVersion {
		t.Fatalf("replay: replayed=%v version %d, first version %d", replayed, again.RegistrationVersion, first.RegistrationVersion)
	}
	// Same id, different inputs: failed_precondition, nothing changes.
	w := v + 100
	_, _, err = drain(t, c, other, "node-2", "drain-node-2", &w)
	if api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("same id, other inputs: got %v, want failed_precondition", err)
	}
}

// A command id answers retries with its first result for the retention
// time, and after it is a new request: the leader expires the records in
// bounded entries (3 records each here, 2,000 in production) until none
// past the retention is left.
func TestCommandsExpireAfterRetention(t *testing.T) {
	t.Parallel()
	tm := cluster.TestTimings()
	tm.CommandExpiry = 200 * time.Millisecond
	tm.CommandRetention = 4 * time.Second
	tm.CommandExpiryBatch = 3
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, Timings: &tm})
	c.WaitLeader()
	f := follower(c)
	ids := map[string]bool{}
	for i := range 10 {
		id := fmt.Sprintf("drain-%d", i)
		if _, replayed, err := drain(t, c, f, "node-2", id, nil); err != nil || replayed {
			t.Fatalf("drain %s: replayed=%v err=%v", id, replayed, err)
		}
		// Within the retention the same request is answered, not applied.
		if _, replayed, err := drain(t, c, f, "node-2", id, nil); err != nil || !replayed {
			t.Fatalf("retry of %s at once: replayed=%v err=%v", id, replayed, err)
		}
		ids[id] = true
	}
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		for id := range ids {
			_, replayed, err := drain(t, c, f, "node-2", id, nil)
			if err != nil {
				return false, err.Error()
			}
			if !replayed {
				delete(ids, id) // applied anew: its record had expired
			}
		}
		return len(ids) == 0, fmt.Sprintf("still answered from their records: %v", ids)
	})
}

// A grant admits one host once; refused joins leave no data directory.
func TestJoinRefusals(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	ctx := context.Background()
	dir := t.TempDir()
	tok := c.Grant("node-x", []string{api.RoleNode})
	if _, err := cluster.Join(ctx, cluster.JoinOptions{DataDir: datadir.Dir(dir + "/x"), Advertise: clustertest.FreeAddr(t), Grant: tok, Member: m.Addr}); err != nil {
		t.Fatalf("first join: %v", err)
	}
	cases := []struct {
		name  string
		token func() string
		code  api.Code
	}{
		{"used", func() string { return tok }, api.CodeFailedPrecondition},
		{"revoked", func() string {
			tk := c.Grant("node-r", []string{api.RoleNode})
			if _, err := c.Client(m).Do(ctx, "POST", "/v1/enrollment/grants/node-r/revoke", api.WriteMeta{}, nil); err != nil {
				t.Fatal(err)
			}
			return tk
		}, api.CodeFailedPrecondition},
		{"expired", func() string {
			var out api.GrantResponse
			if _, err := c.Client(m).Do(ctx, "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: "node-e", Roles: []string{"node"}, TTL: "1ms"}, &out); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond) // let the 1 ms grant pass its expiry
			return out.Token
		}, api.CodeFailedPrecondition},
		{"damaged", func() string { return tok[:len(tok)-8] }, api.CodeInvalidArgument},
		{"guessed secret", func() string { return forgeSecret(t, c.Grant("node-g", []string{api.RoleNode})) }, api.CodeUnauthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			target := datadir.Dir(filepath.Join(dir, tc.name))
			grant := tc.token()
			before := m.Server.Raft().LastIndex()
			_, err := cluster.Join(ctx, cluster.JoinOptions{DataDir: target, Advertise: clustertest.FreeAddr(t), Grant: grant, Member: m.Addr})
			if api.CodeOf(err) != tc.code {
				t.Fatalf("join with %s grant: got %v (%s), want %s", tc.name, err, api.CodeOf(err), tc.code)
			}
			// Checked before anything is proposed: the log did not grow.
			if after := m.Server.Raft().LastIndex(); after != before {
				t.Fatalf("refused join appended %d Raft entries", after-before)
			}
			if _, statErr := os.Stat(string(target)); !os.IsNotExist(statErr) {
				t.Fatalf("refused join left %s behind", target)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if len(e.Name()) > 0 && e.Name()[0] == '.' {
					t.Fatalf("refused join left temp dir %s", e.Name())
				}
			}
		})
	}
}

// Nothing answers without credentials, and a second serve on the same
// data directory is refused.
func TestCredentialsAndExclusiveDataDir(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Get("https://" + m.Addr + "/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no client cert: status %d, want 401", resp.StatusCode)
	}
	_, err = cluster.Open(context.Background(), cluster.Config{DataDir: m.Dir, Timings: cluster.TestTimings()})
	if err == nil {
		t.Fatal("second serve on the same data dir was not refused")
	}
}

// A node whose session ends (member killed) can be isolated; the live one
// cannot; its next incarnation clears the isolation.
func TestIsolateNeedsDeadSessionAndNewIncarnationClearsIt(t *testing.T) {
	t.Parallel()
	o := clustertest.Options{Ctrl: 1, NodeOnly: 1}
	c := clustertest.New(t, o)
	leader := c.Members[0]
	node := c.Members[1]
	ctx := context.Background()
	req := api.NodeWriteRequest{ConfirmHostCannotWrite: true}
	if _, err := c.Client(leader).Do(ctx, "POST", "/v1/nodes/node-2/isolate", req, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("isolate with live session: %v, want failed_precondition", err)
	}
	oldInc := node.Agent.Incarnation()
	node.Kill()
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		return err == nil && n.Session != nil && !n.Session.Alive, "session still alive"
	})
	var res api.IsolateResult
	if _, err := c.Client(leader).Do(ctx, "POST", "/v1/nodes/node-2/isolate", req, &res); err != nil {
		t.Fatalf("isolate dead node: %v", err)
	}
	n, _ := c.Node(leader, "node-2")
	if n.Status != api.NodeIsolated || n.IsolatedIncarnation != oldInc {
		t.Fatalf("after isolate: status %s isolated_incarnation %d, want ISOLATED %d", n.Status, n.IsolatedIncarnation, oldInc)
	}
	node.Restart(o)
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		n, err := c.Node(leader, "node-2")
		if err != nil {
			return false, err.Error()
		}
		return n.Status == api.NodeReady && !n.Isolated && n.Session.Incarnation > oldInc, n.Status
	})
}

// forgeSecret keeps a grant's node id and CA but replaces its secret, as
// someone who saw the node id but not the grant would.
func forgeSecret(t *testing.T, token string) string {
	t.Helper()
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(token, "kbg1."))
	if err != nil {
		t.Fatal(err)
	}
	var g map[string]any
	json.Unmarshal(raw, &g)
	g["s"] = base64.StdEncoding.EncodeToString(make([]byte, 32))
	raw, _ = json.Marshal(g)
	return "kbg1." + base64.RawURLEncoding.EncodeToString(raw)
}
