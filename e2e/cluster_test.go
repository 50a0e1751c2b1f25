package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/testenv"
)

// TestCluster runs one cluster of real processes, one per network
// namespace: three ctrl voters (ctrl,node) and one node-only member. The
// subtests share it and run in order, each leaving the cluster healthy.
func TestCluster(t *testing.T) {
	l := newLab(t, 4)
	c := formCluster(t, l)

	t.Run("DrainFromNodeOnlyMember", func(t *testing.T) { testDrain(t, c) })
	if t.Failed() {
		return
	}
	t.Run("LinearizableAcrossLeaderKill", func(t *testing.T) { testLinearizable(t, c) })
	if t.Failed() {
		return
	}
	t.Run("IsolateAfterPartition", func(t *testing.T) { testIsolate(t, c) })
}

// cluster is the lab with members on its hosts.
type cluster struct {
	*lab
	ctrls []*host // ctrl,node members; ctrls[0] created the cluster
	node  *host   // the node-only member
}

// nodeView is the part of `kibo node get --json` the test looks at.
type nodeView struct {
	NodeID              string `json:"node_id"`
	Status              string `json:"status"`
	RegistrationVersion uint64 `json:"registration_version"`
	DrainRequested      bool   `json:"drain_requested"`
	Isolated            bool   `json:"isolated"`
	Session             *struct {
		Incarnation uint64 `json:"incarnation"`
		SessionID   string `json:"session_id"`
		Alive       bool   `json:"alive"`
	} `json:"session"`
	Overcommit *struct {
		CPU api.Milli `json:"cpu"`
	} `json:"overcommit"`
}

func (n nodeView) String() string {
	s := fmt.Sprintf("%s status=%s drain_requested=%v isolated=%v version=%d", n.NodeID, n.Status, n.DrainRequested, n.Isolated, n.RegistrationVersion)
	if n.Session != nil {
		s += fmt.Sprintf(" session{incarnation=%d alive=%v}", n.Session.Incarnation, n.Session.Alive)
	}
	return s
}

// getNode reads one node through the member of h.
func (h *host) getNode(id string, extra ...string) (nodeView, error) {
	var n nodeView
	err := h.kiboJSON(&n, append([]string{"node", "get", id}, extra...)...)
	return n, err
}

// waitNode polls node id through h until cond holds.
func waitNode(t *testing.T, h *host, id string, d time.Duration, what string, cond func(nodeView) bool) nodeView {
	t.Helper()
	var got nodeView
	testenv.WaitFor(t, d, fmt.Sprintf("node %s %s (read through %s)", id, what, h.nodeID), func() (bool, string) {
		n, err := h.getNode(id, "--consistent")
		if err != nil {
			return false, err.Error()
		}
		got = n
		return cond(n), n.String()
	})
	return got
}

type status struct {
	NodeID    string `json:"node_id"`
	RaftState string `json:"raft_state"`
	Leader    string `json:"leader"`
}

// formCluster creates the cluster on the first host and enrolls the others
// with grants, one at a time: a ctrl member becomes a voter when it first
// serves, so each waits until the leader replicates to it. The first three
// hosts are ctrl members, a fourth one is node-only.
func formCluster(t *testing.T, l *lab) *cluster {
	c := &cluster{lab: l}
	for i, h := range l.hosts {
		if i < 3 {
			h.nodeID, h.roles = fmt.Sprintf("ctrl%d", i+1), "ctrl,node"
			c.ctrls = append(c.ctrls, h)
		} else {
			h.nodeID, h.roles = fmt.Sprintf("node%d", i+1), "node"
			c.node = h
		}
	}
	first := c.ctrls[0]
	if r := first.kibotos("init", "--data-dir", first.dataDir, "--advertise", first.addr(), "--node-id", first.nodeID, "--roles", first.roles); r.code != 0 {
		t.Fatal(r)
	}
	first.startServe()
	c.waitFollowsLeader(t, first)
	for _, h := range l.hosts[1:] {
		grant := first.kibo("enrollment", "grant", h.nodeID, "--roles", h.roles)
		if grant.code != 0 {
			t.Fatal(grant)
		}
		token := strings.TrimSpace(grant.stdout)
		if r := h.kibotos("join", "--data-dir", h.dataDir, "--advertise", h.addr(), "--grant", token, first.addr()); r.code != 0 {
			t.Fatal(r)
		}
		h.startServe()
		if strings.Contains(h.roles, "ctrl") {
			c.waitFollowsLeader(t, h)
			continue
		}
		// A node-only host holds no operator credential: its CLI
		// uses one issued to a person, as an operator would bring.
		creds := h.dataDir + "-operator"
		if r := first.kibo("operator", "issue", "e2e-"+h.nodeID, "--out", creds); r.code != 0 {
			t.Fatal(r)
		}
		h.creds = creds
	}
	n := len(l.hosts)
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d READY nodes in node list", n), func() (bool, string) {
		var list struct {
			Nodes []nodeView `json:"nodes"`
		}
		if err := l.hosts[n-1].kiboJSON(&list, "node", "list"); err != nil {
			return false, err.Error()
		}
		ready := 0
		var seen []string
		for _, n := range list.Nodes {
			seen = append(seen, n.NodeID+"="+n.Status)
			if n.Status == api.NodeReady {
				ready++
			}
		}
		return ready == n && len(list.Nodes) == n, strings.Join(seen, " ")
	})
	return c
}

// waitFollowsLeader waits until the ctrl member on h knows a leader: a
// member hears from the leader only once it is in the Raft configuration.
func (c *cluster) waitFollowsLeader(t *testing.T, h *host) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, h.nodeID+" to see a ctrl leader", func() (bool, string) {
		var st status
		if err := h.kiboJSON(&st, "status"); err != nil {
			return false, err.Error()
		}
		return st.Leader != "" && (st.RaftState == "Leader" || st.RaftState == "Follower"), fmt.Sprintf("%+v", st)
	})
}

// leader asks the running ctrl members who leads and returns that host.
func (c *cluster) leader(t *testing.T) *host {
	t.Helper()
	var found *host
	testenv.WaitFor(t, 10*time.Second, "a ctrl leader", func() (bool, string) {
		var seen []string
		for _, h := range c.ctrls {
			var st status
			if err := h.kiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			for _, cand := range c.ctrls {
				if cand.addr() == st.Leader {
					found = cand
					return true, ""
				}
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.nodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
	return found
}

// waitLeaderOtherThan waits until a running ctrl member other than
// stopped reports a leader that is not stopped.
func (c *cluster) waitLeaderOtherThan(t *testing.T, stopped *host) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, "a ctrl leader other than "+stopped.nodeID, func() (bool, string) {
		var seen []string
		for _, h := range c.ctrls {
			if h == stopped {
				continue
			}
			var st status
			if err := h.kiboJSON(&st, "status"); err != nil {
				seen = append(seen, err.Error())
				continue
			}
			if st.Leader != "" && st.Leader != stopped.addr() {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%s: %+v", h.nodeID, st))
		}
		return false, strings.Join(seen, "; ")
	})
}

// testDrain: an operator on the node-only member's host drains a ctrl
// node (the write is forwarded to the leader), replays the command id and
// cancels the drain.
func testDrain(t *testing.T, c *cluster) {
	target := c.ctrls[1].nodeID
	cmdID := "e2e-drain-" + c.prefix
	drain := func() (nodeView, bool) {
		r := c.node.kibo("node", "drain", target, "--command-id", cmdID, "--json")
		if r.code != 0 {
			t.Fatal(r)
		}
		var n nodeView
		var body struct {
			Replayed bool `json:"replayed"`
		}
		if err := decodeResult(r, &n); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(r.stdout), &body); err != nil {
			t.Fatal(err)
		}
		return n, body.Replayed
	}
	first, replayed := drain()
	if !first.DrainRequested || replayed {
		t.Fatalf("first drain: want drain_requested and not replayed, got %s replayed=%v", first, replayed)
	}
	if n, err := c.node.getNode(target); err != nil || !n.DrainRequested {
		t.Fatalf("node get after drain: %s %v", n, err)
	}
	again, replayed := drain()
	if !replayed || again.RegistrationVersion != first.RegistrationVersion {
		t.Fatalf("replay of %s: want replayed with the first result (version %d), got %s replayed=%v", cmdID, first.RegistrationVersion, again, replayed)
	}
	if r := c.node.kibo("node", "cancel-drain", target); r.code != 0 {
		t.Fatal(r)
	}
	waitNode(t, c.node, target, 5*time.Second, "READY with no drain requested", func(n nodeView) bool {
		return !n.DrainRequested && n.Status == api.NodeReady
	})
}

// testIsolate: isolate is refused while the node-only member holds its
// session; once it is cut off and its session ended, isolate succeeds, the
// old process is refused when the network heals and exits 13, and a
// restart (new incarnation) clears the isolation.
func testIsolate(t *testing.T, c *cluster) {
	victim, admin := c.node, c.ctrls[0]
	before := waitNode(t, admin, victim.nodeID, 10*time.Second, "READY", func(n nodeView) bool {
		return n.Status == api.NodeReady && n.Session != nil && n.Session.Alive
	})
	if r := admin.kibo("node", "isolate", victim.nodeID, "--confirm-host-cannot-write"); r.code != api.ExitFailedPrecondition {
		t.Fatalf("isolate with a live session: want exit %d, got %s", api.ExitFailedPrecondition, r)
	}

	victim.partition()
	healed := false
	defer func() {
		if !healed {
			victim.heal() // leave the network whole for whatever runs next
		}
	}()
	waitNode(t, admin, victim.nodeID, 10*time.Second, "NOT_READY with its session ended", func(n nodeView) bool {
		return n.Status == api.NodeNotReady && n.Session != nil && !n.Session.Alive
	})
	if r := admin.kibo("node", "isolate", victim.nodeID, "--confirm-host-cannot-write"); r.code != 0 {
		t.Fatal(r)
	}
	if n, err := admin.getNode(victim.nodeID, "--consistent"); err != nil || n.Status != api.NodeIsolated || !n.Isolated {
		t.Fatalf("after isolate: want ISOLATED, got %s %v", n, err)
	}

	old := victim.serveProc()
	victim.heal()
	healed = true
	// The agent backs off up to ~6.4 s between attempts while cut off.
	code, ok := old.waitExit(20 * time.Second)
	if !ok {
		t.Fatalf("isolated member %s (pid %d) still runs 20s after the network healed", victim.nodeID, old.cmd.Process.Pid)
	}
	if code != api.ExitFailedPrecondition || !old.logContains("node isolated") {
		t.Fatalf("isolated member exited %d (want %d), log has \"node isolated\": %v", code, api.ExitFailedPrecondition, old.logContains("node isolated"))
	}

	victim.startServe()
	after := waitNode(t, admin, victim.nodeID, 15*time.Second, "READY again with a new incarnation", func(n nodeView) bool {
		return n.Status == api.NodeReady && !n.Isolated && n.Session != nil && n.Session.Alive
	})
	if after.Session.Incarnation <= before.Session.Incarnation {
		t.Fatalf("incarnation after restart %d, want more than %d", after.Session.Incarnation, before.Session.Incarnation)
	}
}

// ---- Linearizability of one register across a leader crash ----

// The register is the cpu overcommit multiplier of the node-only member's
// node: `overcommit set --cpu` writes it, `node get --consistent` reads it.
// Every write carries a value no other write uses, so a read names the one
// write it observed.

type regInput struct {
	write bool
	value api.Milli // the value written
}

type regOutput struct {
	value   api.Milli // the value read
	unknown bool      // a write whose outcome the client could not learn
}

func registerModel(initial api.Milli) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return initial },
		Step: func(state, input, output any) (bool, any) {
			in, st := input.(regInput), state.(api.Milli)
			if in.write {
				return true, in.value
			}
			return output.(regOutput).value == st, st
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(regInput), output.(regOutput)
			switch {
			case in.write && out.unknown:
				return fmt.Sprintf("write(%s) -> ?", in.value)
			case in.write:
				return fmt.Sprintf("write(%s)", in.value)
			default:
				return fmt.Sprintf("read() -> %s", out.value)
			}
		},
		DescribeState: func(state any) string { return state.(api.Milli).String() },
	}
}

// history collects operations from concurrent clients.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	stats map[string]int
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(op porcupine.Operation, kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
	h.stats[kind]++
}

func (h *history) count(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stats[kind]++
}

// definiteFailure is an exit code after which the write surely did not
// happen: the request was refused before it reached the log.
func definiteFailure(code int) bool {
	switch code {
	case api.ExitUsage, api.ExitInvalidArgument, api.ExitNotFound, api.ExitFailedPrecondition, api.ExitVersionMismatch, api.ExitPermissionDenied:
		return true
	}
	return false
}

const opTimeout = 10 * time.Second

// write sets the register through h and records the outcome.
func (hist *history) write(client int, h *host, reg string, v api.Milli) {
	call := hist.now()
	r := h.kiboTimeout(opTimeout, "node", "overcommit", "set", reg, "--cpu", v.String())
	ret := hist.now()
	op := porcupine.Operation{ClientId: client, Input: regInput{write: true, value: v}, Call: call, Return: ret, Output: regOutput{}}
	switch {
	case r.code == 0:
		hist.add(op, "write ok")
	case definiteFailure(r.code):
		hist.count(fmt.Sprintf("write refused (exit %d)", r.code))
	default:
		// It may have been applied, now or later: it may take effect at any
		// time after its call, so its return is open-ended.
		op.Return, op.Output = math.MaxInt64, regOutput{unknown: true}
		hist.add(op, fmt.Sprintf("write unknown (exit %d)", r.code))
	}
}

// read reads the register through h with a consistent read; a failed read
// observed nothing and is left out of the history.
func (hist *history) read(client int, h *host, reg string) (api.Milli, bool) {
	call := hist.now()
	r := h.kiboTimeout(opTimeout, "node", "get", reg, "--json", "--consistent")
	ret := hist.now()
	var n nodeView
	if r.code != 0 || decodeResult(r, &n) != nil || n.Overcommit == nil {
		hist.count(fmt.Sprintf("read failed (exit %d)", r.code))
		return 0, false
	}
	hist.add(porcupine.Operation{ClientId: client, Input: regInput{}, Call: call, Return: ret, Output: regOutput{value: n.Overcommit.CPU}}, "read ok")
	return n.Overcommit.CPU, true
}

// members is the set of members clients may talk to; the one about to be
// killed leaves it first.
type members struct {
	mu    sync.Mutex
	hosts []*host
}

func (m *members) pick(rng *rand.Rand) *host {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hosts[rng.IntN(len(m.hosts))]
}

func (m *members) add(h *host) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hosts = append(m.hosts, h)
}

func (m *members) remove(h *host) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, x := range m.hosts {
		if x == h {
			m.hosts = append(m.hosts[:i:i], m.hosts[i+1:]...)
			return
		}
	}
}

// testLinearizable runs concurrent clients against the followers and the
// node-only member while the leader is killed, then checks the history
// with porcupine and that no acknowledged write was lost.
func testLinearizable(t *testing.T, c *cluster) {
	const (
		clients  = 4
		runFor   = 6 * time.Second
		killAt   = 2 * time.Second
		initialV = api.Milli(1000)
	)
	reg := c.node.nodeID
	// Clients start on every member but the leader of the moment.
	leader := c.leader(t)
	pool := &members{}
	for _, h := range c.hosts {
		if h != leader {
			pool.hosts = append(pool.hosts, h)
		}
	}
	// A known starting value, acknowledged before any client starts.
	if r := pool.hosts[0].kibo("node", "overcommit", "set", reg, "--cpu", initialV.String()); r.code != 0 {
		t.Fatal(r)
	}

	hist := &history{start: time.Now(), stats: map[string]int{}}
	ctx, cancel := context.WithTimeout(context.Background(), runFor)
	defer cancel()
	var next atomic.Int64 // values 1.001, 1.002, ...: unique per write
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				h := pool.pick(rng)
				if rng.IntN(2) == 0 {
					v := initialV + api.Milli(next.Add(1))
					if v > api.MaxMultiplier {
						return
					}
					// The run's deadline never cuts a call short: its outcome would be lost.
					hist.write(id, h, reg, v)
				} else {
					hist.read(id, h, reg)
				}
			}
		}(i)
	}
	time.Sleep(killAt) // the kill happens mid-run; this is scheduling, not an assertion
	// Ask again: the leader may have moved while the clients ran.
	victim := c.leader(t)
	pool.remove(victim)
	killedAt := hist.now()
	victim.crash()
	t.Logf("killed leader %s (%s) at %s", victim.nodeID, victim.addr(), time.Duration(killedAt))
	wg.Wait()
	others := pool.hosts

	// A last consistent read after every client stopped: it must see the
	// outcome of every acknowledged write.
	var final api.Milli
	testenv.WaitFor(t, 15*time.Second, "a final consistent read", func() (bool, string) {
		v, ok := hist.read(clients, others[0], reg)
		final = v
		return ok, "read failed"
	})
	t.Logf("history: %d operations %v; final value %s", len(hist.ops), hist.stats, final)
	if hist.stats["write ok"] < 20 || hist.stats["read ok"] < 20 {
		t.Fatalf("too few successful operations to mean anything: %v", hist.stats)
	}

	if n := ackedAfter(hist.ops, killedAt+int64(time.Second)); n == 0 {
		t.Fatalf("no write was acknowledged from 1s after the leader was killed on: the cluster made no progress after failover")
	}

	ops, applied, dropped := resolveUnknownWrites(hist.ops)
	t.Logf("writes with unknown outcome: %d seen by a read (so applied), %d never seen (dropped)", applied, dropped)
	model := registerModel(initialV)
	res, info := porcupine.CheckOperationsVerbose(model, ops, 30*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("%s-linearizability.html", c.prefix))
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Fatalf("history is not linearizable (porcupine: %v); visualization in %s", res, path)
	}
	if lost := lostWrites(ops, initialV, final); len(lost) > 0 {
		t.Fatalf("final value %s loses acknowledged writes: %s", final, strings.Join(lost, ", "))
	}

	// The crashed member comes back from its data dir, rejoins and catches up.
	victim.startServe()
	waitNode(t, others[0], victim.nodeID, 20*time.Second, "READY after restart", func(n nodeView) bool {
		return n.Status == api.NodeReady && n.Session != nil && n.Session.Alive
	})
	testenv.WaitFor(t, 10*time.Second, victim.nodeID+"'s own replica to hold the final value "+final.String(), func() (bool, string) {
		n, err := victim.getNode(reg) // not --consistent: read its local state
		if err != nil {
			return false, err.Error()
		}
		if n.Overcommit == nil {
			return false, n.String()
		}
		return n.Overcommit.CPU == final, "cpu " + n.Overcommit.CPU.String()
	})
}

// ackedAfter counts acknowledged writes called after t.
func ackedAfter(ops []porcupine.Operation, t int64) int {
	n := 0
	for _, op := range ops {
		if op.Input.(regInput).write && !op.Output.(regOutput).unknown && op.Call > t {
			n++
		}
	}
	return n
}

// resolveUnknownWrites narrows writes of unknown outcome so that the check
// stays fast, without changing its verdict (values are unique, and the
// history ends with a read):
//   - a write no read observed can always be linearized after everything,
//     where it changes nothing: it is dropped;
//   - a write some read observed took effect before the first such read
//     returned: that return is its return.
func resolveUnknownWrites(ops []porcupine.Operation) (out []porcupine.Operation, applied, dropped int) {
	seenAt := map[api.Milli][]int64{} // value -> returns of the reads that saw it
	for _, op := range ops {
		if !op.Input.(regInput).write {
			v := op.Output.(regOutput).value
			seenAt[v] = append(seenAt[v], op.Return)
		}
	}
	for _, op := range ops {
		in, o := op.Input.(regInput), op.Output.(regOutput)
		if in.write && o.unknown {
			// A read that returned before the call cannot have seen this
			// write; it stays in the history and the check rejects it.
			first := int64(math.MaxInt64)
			for _, r := range seenAt[in.value] {
				if r >= op.Call && r < first {
					first = r
				}
			}
			if first == math.MaxInt64 {
				dropped++
				continue
			}
			op.Return = first
			applied++
		}
		out = append(out, op)
	}
	return out, applied, dropped
}

// lostWrites checks the final value against the acknowledged writes: the
// write that produced it must not have finished before an acknowledged
// write started (that later write would have to come after it). It returns
// the acknowledged writes the final value would overwrite.
func lostWrites(ops []porcupine.Operation, initial, final api.Milli) []string {
	var source *porcupine.Operation
	for i := range ops {
		if in := ops[i].Input.(regInput); in.write && in.value == final {
			source = &ops[i]
		}
	}
	var lost []string
	for _, op := range ops {
		in, out := op.Input.(regInput), op.Output.(regOutput)
		if !in.write || out.unknown || in.value == final {
			continue
		}
		switch {
		case final == initial:
			lost = append(lost, in.value.String()+" (final value is the initial one)")
		case source == nil:
			return []string{"final value " + final.String() + " was never written"}
		case op.Call > source.Return:
			lost = append(lost, fmt.Sprintf("%s (started %s after %s returned)", in.value, time.Duration(op.Call-source.Return), final))
		}
	}
	return lost
}

// TestRegisterChecker checks the checking on made-up histories (no root
// needed): a stale read and a lost acknowledged write are caught, and an
// unacknowledged write may or may not have happened.
func TestRegisterChecker(t *testing.T) {
	w := func(v api.Milli, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: regInput{write: true, value: v}, Output: regOutput{}, Call: call, Return: ret}
	}
	unknown := func(v api.Milli, call int64) porcupine.Operation {
		return porcupine.Operation{Input: regInput{write: true, value: v}, Output: regOutput{unknown: true}, Call: call, Return: math.MaxInt64}
	}
	r := func(v api.Milli, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: 1, Input: regInput{}, Output: regOutput{value: v}, Call: call, Return: ret}
	}
	m := registerModel(1000)
	cases := []struct {
		name       string
		ops        []porcupine.Operation
		final      api.Milli
		lin, lossy bool
	}{
		{"stale read", []porcupine.Operation{w(1001, 0, 10), r(1000, 20, 30)}, 1000, false, true},
		{"lost write", []porcupine.Operation{w(1001, 0, 10), w(1002, 20, 30), r(1001, 40, 50)}, 1001, false, true},
		{"unknown write seen", []porcupine.Operation{unknown(1001, 0), r(1001, 20, 30)}, 1001, true, false},
		{"unknown write not seen", []porcupine.Operation{unknown(1001, 0), r(1000, 20, 30)}, 1000, true, false},
		{"unknown write seen before its call", []porcupine.Operation{r(1001, 0, 10), unknown(1001, 20), r(1001, 30, 40)}, 1001, false, false},
		{"concurrent writes", []porcupine.Operation{w(1001, 0, 30), w(1002, 10, 20), r(1001, 40, 50)}, 1001, true, false},
	}
	for _, tc := range cases {
		ops, _, _ := resolveUnknownWrites(tc.ops)
		lin := porcupine.CheckOperations(m, ops)
		lost := lostWrites(ops, 1000, tc.final)
		if lin != tc.lin || (len(lost) > 0) != tc.lossy {
			t.Errorf("%s: linearizable %v (want %v), lost writes %v (want some: %v)", tc.name, lin, tc.lin, lost, tc.lossy)
		}
	}
}
