package fsm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// applyInBatches applies log in random batch sizes (1..64) drawn from r.
func applyInBatches(r *rand.Rand, f *FSM, log []Entry) []Result {
	return applyBatches(r, f, log, false)
}

// applyBatches applies log in random batches; uncached drops the
// placement cache's candidate list before each, as if every batch ran on
// a freshly started replica.
func applyBatches(r *rand.Rand, f *FSM, log []Entry, uncached bool) []Result {
	var out []Result
	for len(log) > 0 {
		n := 1 + r.Intn(64)
		if n > len(log) {
			n = len(log)
		}
		if uncached {
			f.cache.invalidate()
		}
		out = append(out, f.Apply(log[:n])...)
		log = log[n:]
	}
	return out
}

func mustDump(t testing.TB, f *FSM) string {
	t.Helper()
	b, err := f.Dump()
	if err != nil {
		t.Fatalf("dump: %v", err)
	}
	return string(b)
}

func resultJSON(r Result) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func compareResults(t *testing.T, what string, log []Entry, got, want []Result) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d results, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range want {
		if g, w := resultJSON(got[i]), resultJSON(want[i]); g != w {
			t.Errorf("%s: entry %d (%s %s): result\n %s\nwant\n %s", what, i, log[i].Op, log[i].Args, g, w)
			if bad++; bad > 5 {
				t.FailNow()
			}
		}
	}
}

const propertyEntries = 2000

func TestPropertyReplicasAgree(t *testing.T) {
	// Seeds of 1000 and above draw Volume-heavy logs.
	seeds := []int64{1, 4, 3, 42, 1234, 99991, 1001, 1003}
	if testing.Short() {
		seeds = []int64{1, 4, 1003}
	}
	var mu sync.Mutex
	okByOp := map[string]int{}
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("seed-%d", seed), func(t *testing.T) {
				t.Parallel()
				a := openFSM(t)
				g := newLogGen(seed, a)
				if seed >= 1000 && seed < 1100 {
					g.volWeight = 35
				}
				mid := propertyEntries / 2
				snapAt := 0 // the log's length at the snapshot (answers add entries)
				var (
					log      []Entry
					resA     []Result
					snapshot bytes.Buffer
					chk      = newInvariantChecker(t)
				)
				for i := 0; i < propertyEntries; i++ {
					if i == mid {
						snapAt = len(log)
						if err := a.Snapshot(&snapshot); err != nil {
							t.Fatalf("snapshot: %v", err)
						}
					}
					for _, e := range g.nextWithAnswers() {
						before := withoutClock(mustDump(t, a))
						r := a.Apply([]Entry{e})[0]
						chk.check(i, e, r, before, a)
						log = append(log, e)
						resA = append(resA, r)
						if r.Error == nil && !r.Replayed && handlers[e.Op] != nil {
							mu.Lock()
							okByOp[e.Op]++
							mu.Unlock()
						}
					}
				}
				finalA := mustDump(t, a)
				chk.summary()
				checkSummarize(t, a)

				// B: the same log in random batches.
				b := openFSM(t)
				resB := applyInBatches(rand.New(rand.NewSource(seed*7+1)), b, log)
				compareResults(t, "batched replica", log, resB, resA)
				if d := mustDump(t, b); d != finalA {
					t.Fatalf("batched replica state differs:\n%s", diffLines(finalA, d))
				}

				// D: the same, its candidate list rebuilt for every batch:
				// what the cache keeps changes no decision.
				d := openFSM(t)
				resD := applyBatches(rand.New(rand.NewSource(seed*7+3)), d, log, true)
				compareResults(t, "replica without a kept candidate list", log, resD, resA)
				if dump := mustDump(t, d); dump != finalA {
					t.Fatalf("replica without a kept candidate list differs:\n%s", diffLines(finalA, dump))
				}

				// C: restored from A's snapshot at mid, then the rest of the log.
				c := openFSM(t)
				c.Apply([]Entry{makeEntry(t0, OpBootstrap, BootstrapArgs{ClusterID: "other", NodeID: "junk", Roles: []string{"node"}})})
				if err := c.Restore(bytes.NewReader(snapshot.Bytes())); err != nil {
					t.Fatalf("restore: %v", err)
				}
				resC := applyInBatches(rand.New(rand.NewSource(seed*7+2)), c, log[snapAt:])
				compareResults(t, "restored replica", log[snapAt:], resC, resA[snapAt:])
				if d := mustDump(t, c); d != finalA {
					t.Fatalf("restored replica state differs:\n%s", diffLines(finalA, d))
				}
			})
		}
	})
	t.Logf("successful applies by op over all seeds: %v", okByOp)
	if t.Failed() {
		return
	}
	for _, op := range allOps {
		if okByOp[op] == 0 {
			t.Errorf("the random logs never applied %s successfully: the generator no longer covers it", op)
		}
	}
}

// invariantChecker checks properties that hold after every entry.
type invariantChecker struct {
	t        *testing.T
	versions map[string]uint64 // last registration_version seen per node
	results  map[string]Result // first successful result per command id
	counts   map[string]int
	// last version seen per Workspace id
	wsVersions map[string]uint64
}

func newInvariantChecker(t *testing.T) *invariantChecker {
	return &invariantChecker{t: t, versions: map[string]uint64{}, results: map[string]Result{}, counts: map[string]int{}, wsVersions: map[string]uint64{}}
}

func (c *invariantChecker) check(i int, e Entry, r Result, before string, f *FSM) {
	t := c.t
	t.Helper()
	after := withoutClock(mustDump(t, f))
	changed := after != before
	switch {
	case r.Error != nil:
		c.counts["failed"]++
		if changed && (!e.CountPlacements || withoutPlacementCounts(after) != withoutPlacementCounts(before)) {
			t.Fatalf("entry %d %s %s failed with %v but changed the state (besides counting placements)", i, e.Op, e.Args, r.Error)
		}
		if r.Value != nil || r.Replayed {
			t.Fatalf("entry %d: failed result %+v", i, r)
		}
		if r.Error.Code == "" || r.Error.Message == "" {
			t.Fatalf("entry %d: error without code or message: %+v", i, r.Error)
		}
	case r.Replayed:
		c.counts["replayed"]++
		if changed {
			t.Fatalf("entry %d: replay of %s changed the state", i, e.CommandID)
		}
		if first, ok := c.results[e.CommandID]; !ok || !bytes.Equal(first.Value, r.Value) {
			t.Fatalf("entry %d: replay of %s gave %s, first result %s", i, e.CommandID, r.Value, first.Value)
		}
	default:
		c.counts["ok"]++
		if e.CommandID != "" && handlers[e.Op] != nil {
			c.results[e.CommandID] = r
		}
		if handlers[e.Op] == nil && (changed || !reflect.DeepEqual(r, Result{})) {
			t.Fatalf("entry %d: ignored unknown op gave %+v (changed %v)", i, r, changed)
		}
	}

	var nodes []api.Node
	f.View(func(tx *bolt.Tx) error {
		l, err := ListNodes(tx, 0, "")
		if err != nil {
			t.Fatalf("list nodes: %v", err)
		}
		nodes = l.Nodes
		return nil
	})
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.NodeID] = true
		if err := ValidNodeID(n.NodeID); err != nil {
			t.Fatalf("entry %d: stored node with invalid id %q", i, n.NodeID)
		}
		if prev, ok := c.versions[n.NodeID]; ok && n.RegistrationVersion < prev {
			t.Fatalf("entry %d (%s): node %s registration_version went back from %d to %d", i, e.Op, n.NodeID, prev, n.RegistrationVersion)
		}
		c.versions[n.NodeID] = n.RegistrationVersion
		live := n.Session != nil && n.Session.Alive
		if (n.Retired || n.Isolated || n.Admission != api.Admitted) && live {
			t.Fatalf("entry %d: node %s is %s with a live session", i, n.NodeID, n.Status)
		}
		if n.Isolated && n.IsolatedIncarnation > n.LastIncarnation {
			t.Fatalf("entry %d: node %s isolated incarnation %d > last %d", i, n.NodeID, n.IsolatedIncarnation, n.LastIncarnation)
		}
		if n.Overcommit == nil || n.Overcommit.CPU < 0 || n.Overcommit.CPU > api.MaxMultiplier || n.Overcommit.Memory < 0 || n.Overcommit.Memory > api.MaxMultiplier {
			t.Fatalf("entry %d: node %s overcommit %+v", i, n.NodeID, n.Overcommit)
		}
		if (n.Report == nil) != (n.Schedulable == nil) {
			t.Fatalf("entry %d: node %s schedulable without report", i, n.NodeID)
		}
		// A session's check at every ping says what GetNode says.
		want := SessionCheck{Admitted: n.Admission == api.Admitted && !n.Retired, Overcommit: *n.Overcommit}
		if n.Session != nil {
			want.SessionID = n.Session.SessionID
		}
		var got SessionCheck
		f.View(func(tx *bolt.Tx) (err error) { got, err = GetSessionCheck(tx, n.NodeID); return })
		if got != want {
			t.Fatalf("entry %d: node %s session check %+v, GetNode says %+v", i, n.NodeID, got, want)
		}
	}
	for id := range c.versions {
		if !seen[id] {
			t.Fatalf("entry %d: node %s disappeared", i, id)
		}
	}
	c.checkWorkspaces(i, e, f, nodes)
	c.checkVolumes(i, e, f, nodes)
}

// checkVolumes checks the Volume records against their state machine.
func (c *invariantChecker) checkVolumes(i int, e Entry, f *FSM, nodes []api.Node) {
	t := c.t
	t.Helper()
	byID := map[string]api.Node{}
	for _, n := range nodes {
		byID[n.NodeID] = n
	}
	var vs []api.Volume
	f.View(func(tx *bolt.Tx) error {
		l, err := ListVolumes(tx, VolumeFilter{}, 0, "")
		if err != nil {
			t.Fatalf("list volumes: %v", err)
		}
		vs = l.Volumes
		return nil
	})
	for _, v := range vs {
		bad := func(why string) {
			t.Fatalf("entry %d (%s %s): volume %s %s: %s\n%+v\npending %+v expansion %+v", i, e.Op, e.Args, v.Name, v.State, why, v, v.Pending, v.Expansion)
		}
		if api.ValidVolumeName(v.Name) != nil && !strings.HasPrefix(v.Name, "ws-") {
			bad("invalid name")
		}
		if v.PoolID == "" && v.Made {
			bad("made without a pool")
		}
		if p := v.Pending; p != nil {
			if n, ok := byID[p.NodeID]; !ok || n.Retired || n.Isolated {
				bad("command pending on a node that can never answer")
			}
			want := map[string]string{api.VolCmdCreate: api.VolumeCreating, api.VolCmdResize: api.VolumeAvailable, api.VolCmdDelete: api.VolumeDeleting}[p.Kind]
			if v.State != want {
				bad("pending " + p.Kind + " in the wrong state")
			}
			if (p.Kind == api.VolCmdResize) != (v.Expansion != nil && !v.Expansion.FilesystemPending) {
				bad("a resize in progress without its expansion, or the other way round")
			}
		}
		switch v.State {
		case api.VolumeCreating:
			if v.Made || (v.Pending == nil && v.WorkspaceID == "" && v.PoolID == "") {
				bad("creating, yet made or nowhere to be made")
			}
		case api.VolumeDeleting:
			if (v.Pending == nil) == (v.DeleteWaitsForPool == "") || v.WorkspaceID != "" {
				bad("deleting without exactly one of a command and a wait, or attached")
			}
		case api.VolumeAvailable, api.VolumeFailed, api.VolumeLost:
			if v.State == api.VolumeLost && (v.Held || v.Pending != nil) {
				bad("lost yet held or waiting for a node")
			}
		default:
			bad("unknown state")
		}
		if v.SizeBytes < api.MinVolumeSize || v.SizeBytes > api.MaxVolumeSize || v.SizeBytes%api.VolumeSizeUnit != 0 {
			bad("size out of range")
		}
	}
}

// checkWorkspaces checks the Workspace records against their state machine
// and the node index against the records.
func (c *invariantChecker) checkWorkspaces(i int, e Entry, f *FSM, nodes []api.Node) {
	t := c.t
	t.Helper()
	byID := map[string]api.Node{}
	for _, n := range nodes {
		byID[n.NodeID] = n
	}
	var ws []api.Workspace
	f.View(func(tx *bolt.Tx) error {
		if err := indexProblem(tx); err != nil {
			t.Fatalf("entry %d (%s %s): %v", i, e.Op, e.Args, err)
		}
		l, err := ListWorkspaces(tx, WorkspaceFilter{All: true}, 0, "")
		if err != nil {
			t.Fatalf("list workspaces: %v", err)
		}
		ws = l.Workspaces
		return nil
	})
	// A deleted Workspace's id comes back when its create's command id is
	// used again after the record expired: versions restart then.
	present := map[string]bool{}
	for _, w := range ws {
		present[w.WorkspaceID] = true
	}
	for id := range c.wsVersions {
		if !present[id] {
			delete(c.wsVersions, id)
		}
	}
	for _, w := range ws {
		bad := func(why string) {
			t.Fatalf("entry %d (%s %s): workspace %s %s: %s\n%+v\nlayer %+v pending %+v", i, e.Op, e.Args, w.WorkspaceID, w.State, why, w, w.Layer, w.Pending)
		}
		if prev, ok := c.wsVersions[w.WorkspaceID]; ok && w.Version < prev {
			bad("version went back")
		}
		c.wsVersions[w.WorkspaceID] = w.Version
		running := w.InstanceID != ""
		if running != (w.NodeID != "") {
			bad("node and instance not set together")
		}
		if running && w.InstanceID != instanceIDFor(w.WorkspaceID, w.Instances) {
			bad("instance id is not the latest execution's")
		}
		held := w.Layer != nil && w.Layer.Held
		if running && (!held || w.Layer.NodeID != w.NodeID) {
			bad("an execution without its layer held on its node")
		}
		if !running && held {
			bad("layer held without an execution")
		}
		wantKind := map[string][]string{
			api.WorkspaceCreating: {api.WSCmdStart}, api.WorkspaceStarting: {api.WSCmdStart},
			api.WorkspaceStopping: {api.WSCmdStop, api.WSCmdStopForce}, api.WorkspaceDeleting: {api.WSCmdDelete},
			api.WorkspacePausing: {api.WSCmdPause},
		}[w.State]
		if s := w.Snapshot; s != nil {
			if w.Layer == nil || s.PoolID != api.LayerPoolID(w.Layer) || s.Compat.Check() != nil {
				bad("a snapshot away from its layer, or without its compatibility")
			}
			if (w.State == api.WorkspaceAvailable || w.State == api.WorkspacePausing || w.State == api.WorkspaceCreating) || (w.State == api.WorkspacePaused && s.Discarded) {
				bad("a snapshot in a state that has none, or a PAUSED one discarded")
			}
		} else if w.State == api.WorkspacePaused {
			bad("PAUSED without a snapshot")
		}
		switch {
		case w.State == api.WorkspaceAvailable && w.Pending != nil:
			// A running Workspace waits only for a policy change, which
			// leaves its state as it is.
			if w.Pending.Kind != api.WSCmdNetwork || w.Pending.Network == nil {
				bad("AVAILABLE with a pending command other than a network change")
			}
		case wantKind == nil && w.Pending != nil:
			bad("pending command in a settled state")
		case w.State == api.WorkspaceDeleting && w.Pending == nil:
			// No node can remove its files yet: it waits for a pool member.
			if w.DeleteWaitsForPool == "" || w.Layer == nil || api.LayerPoolID(w.Layer) != w.DeleteWaitsForPool {
				bad("DELETING without a command, not waiting for its layer's pool")
			}
		case wantKind != nil && (w.Pending == nil || !containsString(wantKind, w.Pending.Kind)):
			bad("no pending command of the right kind")
		}
		if w.DeleteWaitsForPool != "" && (w.State != api.WorkspaceDeleting || w.Pending != nil) {
			bad("waits for a pool member while not a delete without a command")
		}
		switch w.State {
		case api.WorkspaceCreating, api.WorkspaceStarting, api.WorkspaceAvailable, api.WorkspaceStopping, api.WorkspacePausing:
			if !running {
				bad("no execution")
			}
		case api.WorkspacePaused:
			if running || w.Failure != nil || w.Pending != nil {
				bad("paused with an execution, a failure or a command")
			}
		case api.WorkspaceStopped:
			if running || w.Failure != nil {
				bad("stopped with an execution or a failure")
			}
		case api.WorkspaceFailed:
			if w.Failure == nil {
				bad("failed without a reason")
			}
		case api.WorkspaceDeleting:
		default:
			bad("unknown state")
		}
		// A stored policy is always one create or set-network accepted:
		// normalized, with lists only for public egress.
		if w.Network == nil || w.Network.Egress == "" || (w.Network.Egress != api.EgressPublic && (len(w.Network.Allow) > 0 || len(w.Network.Deny) > 0)) {
			bad(fmt.Sprintf("network policy %+v", w.Network))
		}
		if p := w.Pending; p != nil {
			if want := layerNode(&w); p.NodeID != want || p.InstanceID != w.InstanceID {
				bad("pending command not for the current execution or layer node")
			}
			if n, ok := byID[p.NodeID]; !ok || n.Retired || n.Isolated {
				bad("command pending on a node that can never answer")
			}
		}
	}
}

func (c *invariantChecker) summary() {
	c.t.Logf("outcomes: %v, nodes: %v", c.counts, c.versions)
	if c.counts["ok"] < propertyEntries/5 || c.counts["failed"] < propertyEntries/20 || c.counts["replayed"] == 0 {
		c.t.Errorf("generator drew an unbalanced log: %v", c.counts)
	}
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, a, b))
			if len(out) > 5 {
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// checkSummarize: the counts a metrics scrape reads (Summarize, slim
// records) are the ones the full lists give.
func checkSummarize(t *testing.T, f *FSM) {
	t.Helper()
	err := f.View(func(tx *bolt.Tx) error {
		s, err := Summarize(tx)
		if err != nil {
			return err
		}
		ws, err := ListWorkspaces(tx, WorkspaceFilter{All: true}, 0, "")
		if err != nil {
			return err
		}
		ns, err := ListNodes(tx, 0, "")
		if err != nil {
			return err
		}
		wantWS, wantNodes, wantClocks := map[string]int{}, map[string]int{}, map[string]int64{}
		for _, w := range ws.Workspaces {
			wantWS[w.State]++
		}
		for _, n := range ns.Nodes {
			wantNodes[n.Status]++
			if n.Session != nil && n.Session.Clock != nil {
				wantClocks[n.NodeID] = n.Session.Clock.OffsetNS
			}
		}
		if !reflect.DeepEqual(s.WorkspacesByState, wantWS) || !reflect.DeepEqual(s.NodesByStatus, wantNodes) || !reflect.DeepEqual(s.Clocks, wantClocks) {
			t.Errorf("Summarize %+v; the lists give workspaces %v, nodes %v, clocks %v", s, wantWS, wantNodes, wantClocks)
		}
		ps, err := ListStoragePools(tx, 0, "")
		if err != nil {
			return err
		}
		var wantPools []PoolSummary
		for _, p := range ps.Pools {
			wantPools = append(wantPools, PoolSummary{PoolID: p.PoolID, CapacityBytes: p.CapacityBytes, UsedBytes: p.UsedBytes})
		}
		if !reflect.DeepEqual(s.Pools, wantPools) {
			t.Errorf("Summarize pools %+v; the list gives %+v", s.Pools, wantPools)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// withoutPlacementCounts is a dump without the placement counts, the one
// thing a rejected entry that counts placements may change.
func withoutPlacementCounts(dump string) string { return withoutSection(dump, bucketPlacements) }
