package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
)

// Volumes over the API: an operator's alone (a member certificate calls
// none of the endpoints); names, sizes and pools are checked before the
// entry enters the log; an unknown Volume is not_found.
func TestVolumeEndpoints(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	ctrl, worker := c.Members[0], c.Members[1]
	cl := c.Client(ctrl)
	ctx := context.Background()
	for _, call := range []struct{ method, path string }{
		{"GET", "/v1/volumes"}, {"GET", "/v1/volumes/data"}, {"POST", "/v1/volumes"},
		{"POST", "/v1/volumes/data/resize"}, {"POST", "/v1/volumes/data/delete"},
	} {
		if status, e := rawCall(t, ctrl, memberCert(t, worker), ctrl.Addr, call.method, call.path, struct{}{}, nil); status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not an operator") {
			t.Errorf("member certificate on %s %s: %d %v, want 403", call.method, call.path, status, e)
		}
	}
	for _, bad := range []struct {
		path string
		body any
		want string
	}{
		{"/v1/volumes", api.VolumeCreateRequest{Name: "Bad Name", SizeBytes: 1 << 30}, `volume name "Bad Name" is not valid`},
		{"/v1/volumes", api.VolumeCreateRequest{Name: "data", SizeBytes: 1 << 30, PoolID: "Bad Pool"}, `storage pool id "Bad Pool" is not valid`},
		{"/v1/volumes", api.VolumeCreateRequest{Name: "data", SizeBytes: 1000}, "give whole MiB"},
		{"/v1/volumes/data/resize", api.VolumeResizeRequest{SizeBytes: 1}, "give whole MiB"},
		{"/v1/volumes/Bad%20Name/delete", api.WriteMeta{}, `volume name "Bad Name" is not valid`},
	} {
		if _, err := cl.Do(ctx, "POST", bad.path, bad.body, nil); api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("POST %s %+v: %v, want invalid_argument %q", bad.path, bad.body, err, bad.want)
		}
	}
	if _, err := cl.Do(ctx, "GET", "/v1/volumes/nope", nil, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Errorf("get of an unknown Volume: %v", err)
	}
	var l api.VolumeList
	if _, err := cl.Do(ctx, "GET", "/v1/volumes", nil, &l); err != nil || len(l.Volumes) != 0 {
		t.Errorf("list %+v %v", l, err)
	}
}

// In a rolling upgrade a voter of an older build cannot apply a newer op:
// the leader refuses it before the log, naming the voter, while older ops
// go on; once that voter runs the new build the op is accepted. A new
// rule of an old op waits the same way: placements count only once every
// voter counts them, and then equally on every member.
func TestNewOpWaitsForEveryVoter(t *testing.T) {
	t.Parallel()
	o := clustertest.Options{Ctrl: 3, FeatureLevels: map[string]int{"node-3": 1}}
	c := clustertest.New(t, o)
	leader := c.WaitLeader()
	cl := c.Client(leader)
	ctx := context.Background()
	create := api.VolumeCreateRequest{Name: "data", SizeBytes: 64 << 20, WriteMeta: api.WriteMeta{CommandID: "v1"}}
	_, err := cl.Do(ctx, "POST", "/v1/volumes", create, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "voter node-3 runs unreleased at level 1") {
		t.Fatalf("volume create with a level-1 voter: %v", err)
	}
	if _, err := cl.Do(ctx, "GET", "/v1/volumes/data", nil, nil); api.CodeOf(err) != api.CodeNotFound {
		t.Fatalf("the refused create left a Volume: %v", err)
	}
	// A level-1 write goes on.
	if _, err := cl.Do(ctx, "POST", "/v1/storage-pools/node-1:default/capacity", api.PoolCapacityRequest{CapacityBytes: 2 << 40}, nil); err != nil {
		t.Fatalf("a level-1 write in the mixed cluster: %v", err)
	}
	// A placement no node can take (none has the template) is refused,
	// and not counted.
	huge := api.WorkspaceCreateRequest{Template: "kibotos-coding", CPU: 64000, MemoryBytes: 256 << 20}
	if _, err := cl.Do(ctx, "POST", "/v1/workspaces", huge, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a create no node can take: %v", err)
	}
	if p := placements(t, leader); p.Placed+p.Refused != 0 || len(p.Refusals) != 0 {
		t.Fatalf("placements counted with a voter at level 1: %+v", p)
	}
	// node-3 now runs the new build.
	var m3 *clustertest.Member
	for _, m := range c.Members {
		if m.ID == "node-3" {
			m3 = m
		}
	}
	o.FeatureLevels = nil
	m3.Stop()
	// Below fsm.LevelEntryFormat on one voter, the leader writes JSON.
	// (Entries from before node-3 was a voter may be binary: a voter
	// joins with a build at the cluster's level.)
	if last, withID := lastEntryFormat(t, m3); last != '{' || withID.CommandLog {
		t.Fatalf("with a voter at level 1, the last entry of node-3's log starts with %q, not JSON, or its last command %s asks for the command log", last, withID.CommandID)
	}
	m3.Restart(o)
	clustertest.WaitFor(t, 20*time.Second, func() (bool, string) {
		_, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/volumes", create, nil)
		return err == nil, fmt.Sprint(err)
	})
	// node-3's refusal must be the one under test, not that its session
	// is still coming back.
	c.WaitAllReady()
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/workspaces", huge, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a create no node can take: %v", err)
	}
	want := fsm.PlacementCounts{Refused: 1, Refusals: map[string]uint64{"not enough CPU": 1}}
	for _, m := range c.Members {
		clustertest.WaitFor(t, 20*time.Second, func() (bool, string) {
			p := placements(t, m)
			return reflect.DeepEqual(p, want), fmt.Sprintf("member %s counts %+v, want %+v", m.ID, p, want)
		})
	}
	// Every voter now reads the binary format: the last entry uses it,
	// and the last create's command goes to the command log.
	m3.Stop()
	last, withID := lastEntryFormat(t, m3)
	if last == '{' {
		t.Fatal("with every voter at this build's level, the last entry of node-3's log is JSON")
	}
	if !withID.CommandDigest || !withID.CommandLog {
		t.Fatalf("with every voter at this build's level, the last command in node-3's log (%s %s) does not go to the command log", withID.Op, withID.CommandID)
	}
}

// A ctrl member's feature level is recorded as it is added as a voter,
// not at the leader's refresh a minute later: until it is, the leader
// writes for level 1 (JSON entries, command records keyed by their ids),
// which halved a fresh cluster's first minute of writes.
func TestNewVoterLevelRecordedAtOnce(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// Without pool capacities: a write refused for its level would ask
	// the voters too, and hide what is under test.
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, NoPoolCapacity: true})
	leader := c.WaitLeader()
	ids := []string{"node-1", "node-2", "node-3"}
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		var levels []fsm.MemberLevel
		if err := leader.Server.FSM().View(func(tx *bolt.Tx) (err error) { levels, err = fsm.MemberLevels(tx, ids); return }); err != nil {
			return false, err.Error()
		}
		for _, l := range levels {
			if l.RecordedAt.IsZero() || l.Level != fsm.FeatureLevel {
				return false, fmt.Sprintf("member %s: level %d recorded at %v", l.NodeID, l.Level, l.RecordedAt)
			}
		}
		return true, ""
	})
	if d := time.Since(start); d > 50*time.Second {
		t.Fatalf("the cluster took %v to form: the leader's minute refresh may have recorded the levels", d)
	}
	// A write with a command id now goes out in this build's format.
	ctx := context.Background()
	cl := c.Client(leader)
	n, err := c.Node(leader, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	v := "2"
	req := api.OvercommitSetRequest{CPU: &v, Memory: &v, WriteMeta: api.WriteMeta{CommandID: "oc-1", ExpectedVersion: &n.RegistrationVersion}}
	if _, err := cl.Do(ctx, "POST", "/v1/nodes/node-2/overcommit", req, nil); err != nil {
		t.Fatalf("overcommit write: %v", err)
	}
	m3 := c.Members[2]
	m3.Stop()
	if last, withID := lastEntryFormat(t, m3); last == '{' || withID.CommandID != "oc-1" || !withID.CommandLog {
		t.Fatalf("the write right after the cluster formed: entry format %q, command %q with the command log %v", last, withID.CommandID, withID.CommandLog)
	}
}

// A member whose build is below the level every ctrl voter runs is not
// made a voter: the leader writes for that level, so the member could
// not apply the log it would be sent. Once it runs the cluster's build,
// it is.
func TestOlderBuildNotMadeVoter(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NoPoolCapacity: true})
	leader := c.WaitLeader()
	older := fsm.LevelCommandLog - 1
	m2 := c.AddMember("node-2", []string{api.RoleCtrl, api.RoleNode}, clustertest.Options{FeatureLevels: map[string]int{"node-2": older}})
	voters := func() int {
		f := leader.Server.Raft().GetConfiguration()
		if err := f.Error(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range f.Configuration().Servers {
			if s.Suffrage == raft.Voter {
				n++
			}
		}
		return n
	}
	// The member asks to be a voter as it starts, and asks again until it
	// is; the same request answers why not.
	want := fmt.Sprintf("member node-2 runs unreleased at feature level %d, below level %d that every ctrl voter runs: install the cluster's release on node-2", older, fsm.FeatureLevel)
	status, e := rawCall(t, leader, memberCert(t, m2), leader.Addr, "POST", "/v1/internal/raft/voter", api.AddVoterRequest{NodeID: "node-2", Address: m2.Addr}, nil)
	if status != http.StatusPreconditionFailed || e == nil || !strings.Contains(e.Message, want) {
		t.Fatalf("adding a voter of an older build: %d %v, want 412 %q", status, e, want)
	}
	if n := voters(); n != 1 {
		t.Fatalf("the older build became a voter: %d voters", n)
	}
	m2.Stop()
	m2.Restart(clustertest.Options{})
	clustertest.WaitFor(t, 20*time.Second, func() (bool, string) {
		n := voters()
		return n == 2, fmt.Sprintf("%d voters", n)
	})
}

// A member whose build is below the level every voter ran when its
// replicated state was saved does not start: the state may hold what the
// build does not know. The release it ran starts again.
func TestOlderBuildRefusedOverNewerState(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NoPoolCapacity: true})
	m := c.WaitLeader()
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		var l []fsm.MemberLevel
		if err := m.Server.FSM().View(func(tx *bolt.Tx) (err error) { l, err = fsm.MemberLevels(tx, []string{m.ID}); return }); err != nil {
			return false, err.Error()
		}
		return !l[0].RecordedAt.IsZero(), "node-1's level is not recorded"
	})
	if err := m.Server.Raft().Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	m.Stop()
	older := fsm.FeatureLevel - 1
	srv, err := cluster.Open(context.Background(), cluster.Config{DataDir: m.Dir, Logger: slog.New(slog.DiscardHandler), FeatureLevel: older})
	if srv != nil {
		srv.Shutdown()
	}
	want := fmt.Sprintf("member node-1: its replicated state was saved while every ctrl voter ran feature level %d, and this build (unreleased) applies level %d: run that release again (there is no rollback)", fsm.FeatureLevel, older)
	if api.CodeOf(err) != api.CodeFailedPrecondition || err.Error() != want {
		t.Fatalf("an older build over a newer state: %v, want %q", err, want)
	}
	m.Restart(clustertest.Options{})
	c.WaitLeader()
	c.WaitAllReady()
}

// lastEntryFormat is the first byte of the last command entry of a stopped
// member's Raft log: '{' for JSON (level 5 and before), else the binary
// format's version (fsm.LevelEntryFormat); and the last entry with a
// command id. Every entry must decode.
func lastEntryFormat(t *testing.T, m *clustertest.Member) (byte, fsm.Entry) {
	t.Helper()
	store, err := cluster.OpenLogStore(t.Context(), datadir.Dir(m.Dir).RaftDir(), slog.New(slog.DiscardHandler), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	var (
		format byte
		withID fsm.Entry
	)
	for i := first; i <= last && i > 0; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			t.Fatalf("log entry %d: %v", i, err)
		}
		if l.Type != raft.LogCommand {
			continue
		}
		e, err := fsm.DecodeEntry(l.Data)
		if err != nil {
			t.Fatalf("log entry %d: %v", i, err)
		}
		format = l.Data[0]
		if e.CommandID != "" {
			withID = e
		}
	}
	if format == 0 {
		t.Fatalf("node %s's log holds no command entry", m.ID)
	}
	return format, withID
}

// placements are the placement counts in m's replica.
func placements(t *testing.T, m *clustertest.Member) fsm.PlacementCounts {
	t.Helper()
	var s fsm.Summary
	if err := m.Server.FSM().View(func(tx *bolt.Tx) (err error) { s, err = fsm.Summarize(tx); return }); err != nil {
		t.Fatalf("member %s: %v", m.ID, err)
	}
	return s.Placements
}
