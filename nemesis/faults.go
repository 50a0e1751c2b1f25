package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/internal/faultfs"
	"github.com/kibotos/kibotos/internal/testenv"
)

// Fault is one injected fault, from injection to heal (nanoseconds since
// the run began, as the history's ops).
type Fault struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	Start  int64  `json:"start_ns"`
	End    int64  `json:"end_ns"`
	Detail string `json:"detail,omitempty"`
}

func (f Fault) String() string {
	return fmt.Sprintf("%8.3fs..%8.3fs %s %s %s", float64(f.Start)/1e9, float64(f.End)/1e9, f.Kind, f.Target, f.Detail)
}

// FaultKinds are the faults the nemesis picks from.
var FaultKinds = []string{
	"kill-member", "pause-leader", "kill-vmm", "kill-dataplane", "kill-egress",
	"partition-host", "partition-leader", "cut-outbound", "cut-inbound", "flaky-link",
	"step-clock", "pool-full", "disk-errors", "slow-disk",
}

// Nemesis injects one fault at a time from its seeded source, holds it
// for a bounded time and heals it before the next.
type Nemesis struct {
	cluster *clusterlab.Cluster
	hist    *History
	root    string      // the hosts' storage: VMMs mention it
	pool    string      // the shared pool's file system
	disk    *faultfs.FS // the FUSE layer the shared pool is served through
	work    *Workload
	kinds   []string
	every   time.Duration
	hold    time.Duration // the longest a fault is held
	restart func(h *clusterlab.Host)

	mu     sync.Mutex
	faults []Fault
	errs   []error // a fault that could not be injected or healed
	seen   []Anomaly
	log    func(format string, args ...any)
}

// failed records that the harness could not inject or heal a fault: the
// run's results no longer mean what they say, and the report says so.
func (n *Nemesis) failed(err error) {
	n.mu.Lock()
	n.errs = append(n.errs, err)
	n.mu.Unlock()
}

// found records an anomaly a fault showed.
func (n *Nemesis) found(a Anomaly) {
	n.mu.Lock()
	n.seen = append(n.seen, a)
	n.mu.Unlock()
}

// anomalies are what the faults showed and the harness's own failures,
// as anomalies of the run.
func (n *Nemesis) anomalies(ops []Op) []Anomaly {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []Anomaly
	for _, a := range n.seen {
		a.History = of(ops, a.Workspace)
		out = append(out, a)
	}
	for _, err := range n.errs {
		out = append(out, Anomaly{Kind: "harness", Detail: err.Error()})
	}
	return out
}

// run injects faults until ctx ends; every fault is healed when it returns.
func (n *Nemesis) run(ctx context.Context, rng *rand.Rand) {
	for {
		// The pause between faults: every, ±50%.
		wait := n.every/2 + time.Duration(rng.Int64N(int64(n.every)))
		if ctxsleep.Sleep(ctx, wait) != nil {
			return
		}
		kind := n.kinds[rng.IntN(len(n.kinds))]
		// The hold: from 30% of the longest to the longest.
		hold := n.hold*3/10 + time.Duration(rng.Int64N(int64(n.hold*7/10)+1))
		f := Fault{Kind: kind, Start: n.hist.now()}
		n.inject(ctx, rng, &f, hold)
		f.End = n.hist.now()
		n.log("fault %s", f)
		n.mu.Lock()
		n.faults = append(n.faults, f)
		n.mu.Unlock()
	}
}

// Faults is what was injected.
func (n *Nemesis) Faults() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Fault(nil), n.faults...)
}

// inject runs fault f for about hold, healing it before it returns (also
// when ctx ends early).
func (n *Nemesis) inject(ctx context.Context, rng *rand.Rand, f *Fault, hold time.Duration) {
	hosts := n.cluster.Hosts
	h := hosts[rng.IntN(len(hosts))]
	switch f.Kind {
	case "kill-member":
		// A power loss of the member process; its VMs (in the private
		// systemd) run on and are taken over by the restarted member.
		f.Target = h.NodeID
		p := h.ServeProc()
		p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.Done()
		ctxsleep.Sleep(ctx, hold/2)
		n.restart(h)
	case "pause-leader":
		// A long pause (GC, a stalled disk): the leader stops without
		// knowing it, and must not act as leader when it wakes.
		l := leader(n.cluster)
		if l == nil {
			f.Detail = "no leader found: skipped"
			return
		}
		f.Target = l.NodeID
		p := l.ServeProc()
		p.Cmd.Process.Signal(syscall.SIGSTOP)
		ctxsleep.Sleep(ctx, hold)
		p.Cmd.Process.Signal(syscall.SIGCONT)
	case "partition-host", "partition-leader":
		// A host, or the leader's, alone in a minority.
		if f.Kind == "partition-leader" {
			if h = leader(n.cluster); h == nil {
				f.Detail = "no leader found: skipped"
				return
			}
		}
		f.Target = h.NodeID
		err := h.SetLink(false)
		if err == nil {
			ctxsleep.Sleep(ctx, hold)
		}
		if herr := h.SetLink(true); herr != nil || err != nil {
			n.failed(fmt.Errorf("fault %s of %s: %w", f.Kind, h.NodeID, errors.Join(err, herr)))
		}
	case "cut-outbound", "cut-inbound", "flaky-link":
		// Asymmetric: the host hears the others and is not heard, or
		// the reverse; or a link that loses packets and queues.
		f.Target = h.NodeID
		var err error
		switch f.Kind {
		case "flaky-link":
			loss := 10 + rng.IntN(31)
			f.Detail = fmt.Sprintf("%d%% loss each way, 1 Mbit/s", loss)
			err = h.Flaky(loss, 1024)
		default:
			err = h.CutOneWay(f.Kind == "cut-outbound")
		}
		if err == nil {
			ctxsleep.Sleep(ctx, hold)
		}
		if herr := h.Unimpair(); herr != nil || err != nil {
			// The run's premise (every fault healed) no longer holds.
			n.failed(fmt.Errorf("fault %s of %s: %w", f.Kind, h.NodeID, errors.Join(err, herr)))
		}
	case "step-clock":
		// A host's clock jumps past the skew limit and back: the node
		// takes no new Workspaces meanwhile; what its member stamps as
		// leader carries the jump.
		step := api.MaxClockSkew + time.Duration(1+rng.IntN(60))*time.Second
		if rng.IntN(2) == 0 {
			step = -step
		}
		f.Target, f.Detail = h.NodeID, "by "+step.String()
		err := h.StepClock(step)
		if err == nil {
			ctxsleep.Sleep(ctx, hold)
		}
		if herr := h.StepClock(0); herr != nil || err != nil {
			n.failed(fmt.Errorf("fault %s of %s: %w", f.Kind, h.NodeID, errors.Join(err, herr)))
		}
	case "pool-full":
		// Every write to the shared pool fails with ENOSPC: guests
		// writing their layer or a Volume wait, pauses, creates and
		// resizes fail; all goes on once there is room. A guest writes
		// new blocks of its layer meanwhile, and must finish once the
		// pool has room.
		f.Target = "shared pool"
		err := testenv.Fill(n.pool)
		var probe <-chan Op
		if err == nil {
			probe = n.work.fillProbe(rng, n.cluster.Hosts[rng.IntN(len(n.cluster.Hosts))])
			ctxsleep.Sleep(ctx, hold)
		}
		if herr := testenv.Unfill(n.pool); herr != nil || err != nil {
			n.failed(fmt.Errorf("fault %s: %w", f.Kind, errors.Join(err, herr)))
		}
		f.Detail = n.checkProbe(f, probe, "the pool was full", "the pool had room")
	case "disk-errors", "slow-disk":
		// Under the shared pool's file system: a share of the file
		// reads, writes and syncs of layers, Volumes and snapshots fail
		// with EIO (the guest sees I/O errors, a pause or a create
		// fails), or each waits. A guest writes its layer meanwhile and
		// must answer, whatever it answers, once the disk is healed.
		f.Target = "shared pool"
		if f.Kind == "disk-errors" {
			share := 0.05 + rng.Float64()*0.45
			f.Detail = fmt.Sprintf("EIO on %.0f%% of file I/O", share*100)
			n.disk.Fail(syscall.EIO, share)
		} else {
			delay := time.Duration(10+rng.IntN(191)) * time.Millisecond
			f.Detail = fmt.Sprintf("each file operation waits %v", delay)
			n.disk.Slow(delay)
		}
		probe := n.work.fillProbe(rng, n.cluster.Hosts[rng.IntN(len(n.cluster.Hosts))])
		ctxsleep.Sleep(ctx, hold)
		n.disk.Heal()
		if d := n.checkProbe(f, probe, "the disk failed", "it was healed"); d != "" {
			f.Detail += "; " + d
		}
	case "kill-vmm":
		pids := clusterlab.QemuPIDs(n.root)
		if len(pids) == 0 {
			f.Detail = "no VMM running: skipped"
			return
		}
		pid := pids[rng.IntN(len(pids))]
		f.Target, f.Detail = "pid "+strconv.Itoa(pid), disksOf(pid)
		syscall.Kill(pid, syscall.SIGKILL)
	case "kill-dataplane", "kill-egress":
		sub := strings.TrimPrefix(f.Kind, "kill-")
		pids := helperPIDs(n.cluster.Dir, n.root, sub)
		if len(pids) == 0 {
			f.Detail = "no " + sub + " process: skipped"
			return
		}
		pid := pids[rng.IntN(len(pids))]
		f.Target = "pid " + strconv.Itoa(pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// checkProbe waits for a guest's write started during fault f (nil: none
// was) and says how it ended, "" without one; one the CLI got no answer
// to in opTimeout, which was started while the fault held (during) and
// waited on after it healed (after), is a stuck guest.
func (n *Nemesis) checkProbe(f *Fault, probe <-chan Op, during, after string) string {
	if probe == nil {
		return ""
	}
	o := <-probe
	// Stuck: the CLI gave up (opTimeout) without an answer. Any answer,
	// even an error, means the guest went on.
	if o.Code == -1 && time.Duration(o.Return-o.Call) >= opTimeout-time.Second {
		n.found(Anomaly{Kind: "guest-stuck", Workspace: o.Workspace, Detail: fmt.Sprintf("a write into its layer while %s (%.3fs..%.3fs) had not finished %s after %s: %s", during, float64(f.Start)/1e9, float64(n.hist.now())/1e9, opTimeout, after, o.Detail)})
	}
	return strings.TrimSpace(fmt.Sprintf("a write of %s: %s %s", o.Workspace, o.Outcome, o.Detail))
}

// leader is the host whose member leads, as the running ctrl members say;
// nil when none answers.
func leader(c *clusterlab.Cluster) *clusterlab.Host {
	for _, h := range c.Ctrls {
		var st clusterlab.RaftStatus
		if err := h.KiboJSON(&st, "status"); err != nil {
			continue
		}
		for _, cand := range c.Ctrls {
			if cand.Addr() == st.Leader {
				return cand
			}
		}
	}
	return nil
}

// helperPIDs are the lab's processes running `kibotos <sub> ...` (the
// data plane, the egress process): their command lines mention the lab's
// directory or the hosts' storage.
func helperPIDs(labDir, root, sub string) []int {
	return clusterlab.PIDs(func(args []string) bool {
		all := strings.Join(args, " ")
		return len(args) > 1 && filepath.Base(args[0]) == "kibotos" && args[1] == sub &&
			(strings.Contains(all, labDir) || strings.Contains(all, root))
	})
}
