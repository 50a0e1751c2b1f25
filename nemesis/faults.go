package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/ctxsleep"
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

// FaultKinds are the faults the nemesis picks from. (The egress process
// runs only for Workspaces with an Egress object, which this workload
// does not make: killing it is not among them yet.)
var FaultKinds = []string{"kill-member", "pause-leader", "partition-host", "kill-vmm", "kill-dataplane"}

// Nemesis injects one fault at a time from its seeded source, holds it
// for a bounded time and heals it before the next.
type Nemesis struct {
	cluster *clusterlab.Cluster
	hist    *History
	root    string // the hosts' storage: VMMs mention it
	every   time.Duration
	restart func(h *clusterlab.Host)

	mu     sync.Mutex
	faults []Fault
	log    func(format string, args ...any)
}

// run injects faults until ctx ends; every fault is healed when it returns.
func (n *Nemesis) run(ctx context.Context, rng *rand.Rand) {
	for {
		// The pause between faults: every, ±50%.
		wait := n.every/2 + time.Duration(rng.Int64N(int64(n.every)))
		if ctxsleep.Sleep(ctx, wait) != nil {
			return
		}
		kind := FaultKinds[rng.IntN(len(FaultKinds))]
		hold := 3*time.Second + time.Duration(rng.Int64N(int64(7*time.Second)))
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
	case "partition-host":
		f.Target = h.NodeID
		h.Partition()
		ctxsleep.Sleep(ctx, hold)
		h.Heal()
	case "kill-vmm":
		pids := clusterlab.QemuPIDs(n.root)
		if len(pids) == 0 {
			f.Detail = "no VMM running: skipped"
			return
		}
		pid := pids[rng.IntN(len(pids))]
		f.Target, f.Detail = "pid "+strconv.Itoa(pid), layersOf(pid)
		syscall.Kill(pid, syscall.SIGKILL)
	case "kill-dataplane":
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

// layersOf names the Workspace layers the QEMU process pid has open, from
// its command line (<pool>/layers/<workspace>.qcow2).
func layersOf(pid int) string {
	return strings.Join(layerWorkspaces(clusterlab.Cmdline(pid)), ",")
}

func layerWorkspaces(args []string) []string {
	var out []string
	for _, a := range args {
		for _, part := range strings.Split(a, ",") {
			i := strings.Index(part, "/layers/")
			if i < 0 || !strings.HasSuffix(part, ".qcow2") {
				continue
			}
			out = append(out, strings.TrimSuffix(part[i+len("/layers/"):], ".qcow2"))
		}
	}
	return out
}
