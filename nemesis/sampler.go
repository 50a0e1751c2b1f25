package nemesis

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/ctxsleep"
	"github.com/kibotos/kibotos/storagepool"
)

// Single writer, sampled every half second from the hosts' QEMU processes:
// no layer or Volume open in two of them, and none open for long in one
// whose node the file's holder record does not name (a node that finds
// its object handed to another stops its writer within a second of
// reading the record, FenceInterval; a member stopped by a fault reads it
// once it runs again).

// fenceBound is how long a writer may go on after its object's holder
// record names another node: the longest fault that stops a member (a
// leader paused 10 s, a member killed and restarted) and its restart.
const fenceBound = 20 * time.Second

// Sample is what one scan of the hosts' QEMU processes found: the
// Workspaces and Volumes whose file more than one has open, with their
// PIDs.
type Sample struct {
	At     int64            `json:"at_ns"`
	Shared map[string][]int `json:"shared"`
}

// diskSampler scans the hosts' QEMU processes every half second.
type diskSampler struct {
	root  string
	hosts map[string]string // data directory → node id
	hist  *History

	mu      sync.Mutex
	samples int
	found   []Sample
	// unheld: a writer whose holder record names another node, since
	// when (key: pid and object); overdue: those past fenceBound.
	unheld  map[string]int64
	overdue []Anomaly
}

func (s *diskSampler) run(ctx context.Context) {
	for {
		procs := map[int][]string{}
		for _, pid := range clusterlab.QemuPIDs(s.root) {
			if args := clusterlab.Cmdline(pid); args != nil {
				procs[pid] = args
			}
		}
		shared := sharedDisks(procs)
		now := s.hist.now()
		s.mu.Lock()
		s.samples++
		if len(shared) > 0 {
			s.found = append(s.found, Sample{At: now, Shared: shared})
		}
		s.checkHolders(procs, now)
		s.mu.Unlock()
		if ctxsleep.Sleep(ctx, 500*time.Millisecond) != nil {
			return
		}
	}
}

// checkHolders notes every writer whose holder record names another node
// than the one it runs on, and reports those that go on past fenceBound.
func (s *diskSampler) checkHolders(procs map[int][]string, now int64) {
	if s.unheld == nil {
		s.unheld = map[string]int64{}
	}
	seen := map[string]bool{}
	for pid, args := range procs {
		node := s.nodeOf(args)
		if node == "" {
			continue
		}
		for _, f := range diskFiles(args) {
			h, err := storagepool.ReadHolder(f.path)
			if err != nil || h == nil || h.NodeID == node {
				continue
			}
			key := fmt.Sprintf("%d %s", pid, f.id)
			seen[key] = true
			since, ok := s.unheld[key]
			switch {
			case !ok:
				s.unheld[key] = now
			case since >= 0 && time.Duration(now-since) > fenceBound:
				s.unheld[key] = -1 // reported once
				s.overdue = append(s.overdue, objectAnomaly("writer-not-holder", f.id, fmt.Sprintf(
					"QEMU pid %d on %s still had it open %.3fs after its holder record named %s (from %.3fs)", pid, node, float64(now)/1e9, h, float64(since)/1e9)))
			}
		}
	}
	for key := range s.unheld {
		if !seen[key] {
			delete(s.unheld, key)
		}
	}
}

// nodeOf is the node whose QEMU process has args: the data directory its
// command line names.
func (s *diskSampler) nodeOf(args []string) string {
	all := strings.Join(args, " ")
	for dir, node := range s.hosts {
		if strings.Contains(all, dir+"/") {
			return node
		}
	}
	return ""
}

func (s *diskSampler) anomalies(ops []Op) []Anomaly {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Anomaly
	for _, f := range s.found {
		for id, pids := range f.Shared {
			out = append(out, objectAnomaly("two-writers", id, fmt.Sprintf("at %.3fs its file was open in QEMU processes %v", float64(f.At)/1e9, pids)))
		}
	}
	out = append(out, s.overdue...)
	for i := range out {
		out[i].History = of(ops, out[i].Workspace+out[i].Volume)
	}
	return out
}

// objectAnomaly is an anomaly of a Workspace or a Volume, by its id.
func objectAnomaly(kind, id, detail string) Anomaly {
	a := Anomaly{Kind: kind, Detail: detail}
	if strings.HasPrefix(id, "vol-") {
		a.Volume = id
	} else {
		a.Workspace = id
	}
	return a
}

// sharedDisks finds the layers and Volumes that more than one of procs
// (PID → command line) has open.
func sharedDisks(procs map[int][]string) map[string][]int {
	holders := map[string][]int{}
	for pid, args := range procs {
		for _, f := range diskFiles(args) {
			holders[f.id] = append(holders[f.id], pid)
		}
	}
	for id, pids := range holders {
		if len(pids) < 2 {
			delete(holders, id)
			continue
		}
		sort.Ints(pids)
	}
	return holders
}

// disksOf names the Workspace layers and Volumes the QEMU process pid has
// open, from its command line.
func disksOf(pid int) string {
	var ids []string
	for _, f := range diskFiles(clusterlab.Cmdline(pid)) {
		ids = append(ids, f.id)
	}
	return strings.Join(ids, ",")
}

// poolFiles are where a writer's files are in a pool, by the directory
// and suffix around the object's id: a Workspace's layer and a Volume.
var poolFiles = []struct{ dir, suffix string }{{"/layers/", ".qcow2"}, {"/volumes/data/", ".img"}}

// diskFile is a Workspace's layer or a Volume a QEMU process has open.
type diskFile struct{ id, path string }

// diskFiles are the Workspace layers and Volumes a QEMU command line
// opens (-drive file=<path>,...).
func diskFiles(args []string) []diskFile {
	var out []diskFile
	for _, a := range args {
		for _, part := range strings.Split(a, ",") {
			path := strings.TrimPrefix(part, "file=")
			for _, f := range poolFiles {
				i := strings.Index(path, f.dir)
				if i >= 0 && strings.HasSuffix(path, f.suffix) {
					out = append(out, diskFile{id: strings.TrimSuffix(path[i+len(f.dir):], f.suffix), path: path})
				}
			}
		}
	}
	return out
}
