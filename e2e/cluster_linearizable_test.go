package e2e

import (
	"context"
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
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
)

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
func (hist *history) write(client int, h *clusterlab.Host, reg string, v api.Milli) {
	call := hist.now()
	r := h.KiboTimeout(opTimeout, "node", "overcommit", "set", reg, "--cpu", v.String())
	ret := hist.now()
	op := porcupine.Operation{ClientId: client, Input: regInput{write: true, value: v}, Call: call, Return: ret, Output: regOutput{}}
	switch {
	case r.Code == 0:
		hist.add(op, "write ok")
	case definiteFailure(r.Code):
		hist.count(fmt.Sprintf("write refused (exit %d)", r.Code))
	default:
		// It may have been applied, now or later: it may take effect at any
		// time after its call, so its return is open-ended.
		op.Return, op.Output = math.MaxInt64, regOutput{unknown: true}
		hist.add(op, fmt.Sprintf("write unknown (exit %d)", r.Code))
	}
}

// read reads the register through h with a consistent read; a failed read
// observed nothing and is left out of the history.
func (hist *history) read(client int, h *clusterlab.Host, reg string) (api.Milli, bool) {
	call := hist.now()
	r := h.KiboTimeout(opTimeout, "node", "get", reg, "--json", "--consistent")
	ret := hist.now()
	var n clusterlab.NodeView
	if r.Code != 0 || clusterlab.DecodeResult(r, &n) != nil || n.Overcommit == nil {
		hist.count(fmt.Sprintf("read failed (exit %d)", r.Code))
		return 0, false
	}
	hist.add(porcupine.Operation{ClientId: client, Input: regInput{}, Call: call, Return: ret, Output: regOutput{value: n.Overcommit.CPU}}, "read ok")
	return n.Overcommit.CPU, true
}

// members is the set of members clients may talk to; the one about to be
// killed leaves it first.
type members struct {
	mu    sync.Mutex
	hosts []*clusterlab.Host
}

func (m *members) pick(rng *rand.Rand) *clusterlab.Host {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hosts[rng.IntN(len(m.hosts))]
}

func (m *members) add(h *clusterlab.Host) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hosts = append(m.hosts, h)
}

func (m *members) remove(h *clusterlab.Host) {
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
func testLinearizable(t *testing.T, c *clusterlab.Cluster) {
	const (
		clients  = 4
		runFor   = 6 * time.Second
		killAt   = 2 * time.Second
		initialV = api.Milli(1000)
	)
	reg := c.Node.NodeID
	// Clients start on every member but the leader of the moment.
	leader := c.Leader(t)
	pool := &members{}
	for _, h := range c.Hosts {
		if h != leader {
			pool.hosts = append(pool.hosts, h)
		}
	}
	// A known starting value, acknowledged before any client starts.
	if r := pool.hosts[0].Kibo("node", "overcommit", "set", reg, "--cpu", initialV.String()); r.Code != 0 {
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
	victim := c.Leader(t)
	pool.remove(victim)
	killedAt := hist.now()
	victim.Crash()
	t.Logf("killed leader %s (%s) at %s", victim.NodeID, victim.Addr(), time.Duration(killedAt))
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
		path := filepath.Join(os.TempDir(), fmt.Sprintf("%s-linearizability.html", c.Prefix))
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualization: %v", err)
		}
		t.Fatalf("history is not linearizable (porcupine: %v); visualization in %s", res, path)
	}
	if lost := lostWrites(ops, initialV, final); len(lost) > 0 {
		t.Fatalf("final value %s loses acknowledged writes: %s", final, strings.Join(lost, ", "))
	}

	// The crashed member comes back from its data dir, rejoins and catches up.
	victim.StartServe()
	clusterlab.WaitNode(t, others[0], victim.NodeID, 20*time.Second, "READY after restart", func(n clusterlab.NodeView) bool {
		return n.Status == api.NodeReady && n.Session != nil && n.Session.Alive
	})
	testenv.WaitFor(t, 10*time.Second, victim.NodeID+"'s own replica to hold the final value "+final.String(), func() (bool, string) {
		n, err := victim.GetNode(reg) // not --consistent: read its local state
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
