package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/faultfs"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/member"
	"github.com/kibotos/kibotos/vmm/template"
)

// Options of one run.
type Options struct {
	Seed       uint64
	Duration   time.Duration // of the workload under faults
	Hosts      int           // 3 ctrl,node members, and node-only ones past them
	Workspaces int           // made before the run; the workload adds and deletes more
	Clients    int
	FaultEvery time.Duration // mean pause between two faults
	Faults     []string      // the kinds the nemesis picks from (of FaultKinds)
	FaultHold  time.Duration // the longest a fault is held (the shortest: 30% of it)
	// Settle bounds how long every Workspace may take to reach a stable
	// state once the faults are healed.
	Settle time.Duration
	// KeepDir, when set, receives every log of the lab if an anomaly was
	// found (the lab's own directory goes with its cleanup).
	KeepDir string
	Logf    func(format string, args ...any)
}

// workspaceSpec is every Workspace of the run: small busybox guests whose
// traffic leaves through the Egress egressName (the node's egress process).
var workspaceSpec = "--template " + template.DefaultName + " --cpu 1 --memory 256MiB --egress " + egressName

const egressName = "nemesis"

// sharedPoolMiB is the size of the shared pool's file system: the layers,
// pause snapshots and Volumes of the run fit several times over.
const sharedPoolMiB = 4096

// stable are the states a Workspace rests in.
var stable = map[string]bool{api.WorkspaceAvailable: true, api.WorkspaceStopped: true, api.WorkspacePaused: true, api.WorkspaceFailed: true}

// Run forms the cluster, runs the workload and the nemesis for
// o.Duration, heals everything, checks, deletes every Workspace and checks
// what is left. The lab's cleanup (t) removes everything it made.
func Run(t *testing.T, o Options) *Report {
	clusterlab.Require(t)
	l := clusterlab.New(t, o.Hosts)
	root := clusterlab.VMRoot(t, l)
	for _, h := range l.Hosts {
		h.DataDir = filepath.Join(root, fmt.Sprintf("h%d", h.Index))
		// As under the host's systemd: a killed member's VMs run on
		// and its restart takes them over.
		h.SystemdOutlives = true
	}
	artifacts := clusterlab.BuildArtifacts(t, root, l.Bin)
	// The shared pool is a file system of its own, which the pool-full
	// fault fills, served through a FUSE layer the disk faults act in;
	// both mounted before the members' private systemd start (their VMMs
	// see the mounts of that moment).
	shared, sharedDisk := filepath.Join(root, "shared"), filepath.Join(root, "shared-disk")
	testenv.SmallFS(t, sharedDisk, sharedPoolMiB)
	disk := faultfs.Mount(t, sharedDisk, shared)
	configs := map[*clusterlab.Host]string{}
	var cmu sync.Mutex
	serve := func(h *clusterlab.Host) {
		cmu.Lock()
		cfg, ok := configs[h]
		if !ok {
			clusterlab.InstallArtifacts(t, artifacts, h)
			cfg = clusterlab.WriteConfig(t, h, shared)
			configs[h] = cfg
		}
		cmu.Unlock()
		clusterlab.StartServeConfig(h, cfg)
	}
	// Three ctrl voters (ctrl,node); hosts past the third are node-only.
	c := clusterlab.FormServing(t, l, serve)
	admin := c.Ctrls[0]
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "storage-pool", "set-capacity", "shared", "100GiB")
	proxy := l.StartProxy(t)
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "egress", "create", egressName, "--socks5", proxy.SOCKS, "--username", proxy.Username, "--password-file", proxy.PasswordFile)
	for _, h := range l.Hosts {
		clusterlab.WaitNodeReport(t, admin, h.NodeID, 60*time.Second, "ready for Workspaces", clusterlab.ReadyForWorkspaces)
	}

	hist := newHistory()
	w := &Workload{cluster: c, hist: hist, spec: workspaceSpec, proxy: proxy}
	for range o.Workspaces {
		var ws api.Workspace
		args := append([]string{"workspace", "create", "--json"}, strings.Fields(workspaceSpec)...)
		if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.BootTimeout, args...), &ws); err != nil {
			t.Fatal(err)
		}
		w.add(ws.WorkspaceID, true)
	}
	o.Logf("cluster of %d hosts with %d Workspaces ready; seed %d, %s of workload and faults", len(l.Hosts), o.Workspaces, o.Seed, o.Duration)

	n := &Nemesis{cluster: c, hist: hist, root: root, pool: shared, disk: disk, work: w, kinds: o.Faults, every: o.FaultEvery, hold: o.FaultHold, restart: serve, log: o.Logf}
	rep := &Report{Seed: o.Seed, Seconds: int(o.Duration / time.Second), Hosts: len(l.Hosts)}
	ctx, cancel := context.WithTimeout(context.Background(), o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	sampler := &diskSampler{root: root, hist: hist, hosts: map[string]string{}}
	for _, h := range l.Hosts {
		sampler.hosts[h.DataDir] = h.NodeID
	}
	wg.Go(func() { sampler.run(ctx) })
	wg.Go(func() { n.run(ctx, rand.New(rand.NewPCG(o.Seed, 0))) })
	for i := range o.Clients {
		wg.Go(func() { w.run(ctx, i, rand.New(rand.NewPCG(o.Seed, uint64(i+1)))) })
	}
	wg.Wait()
	o.Logf("workload and faults ended: %d operations, %d faults", len(hist.Ops()), len(n.Faults()))

	// Everything is healed (each fault heals before the nemesis
	// returns); a member killed last was restarted. Check.
	ops := hist.Ops()
	rep.Anomalies = append(rep.Anomalies, n.anomalies(ops)...)
	rep.Anomalies = append(rep.Anomalies, sampler.anomalies(ops)...)
	rep.Anomalies = append(rep.Anomalies, membersUp(l)...)
	// The checks talk to a member that answers: the first one may be
	// the one a fault left down.
	admin = answering(t, l, o.Settle)
	healNodes(admin, l)
	rep.Anomalies = append(rep.Anomalies, nodesBack(t, admin, l, o.Settle)...)
	rep.Anomalies = append(rep.Anomalies, settle(t, admin, ops, o.Settle)...)
	rep.Anomalies = append(rep.Anomalies, readBack(t, admin, w, hist)...)
	rep.Anomalies = append(rep.Anomalies, readBackVolumes(t, admin, w, hist)...)
	ops = hist.Ops()
	rep.Anomalies = append(rep.Anomalies, checkVersions(ops)...)
	rep.Anomalies = append(rep.Anomalies, checkNotFound(ops)...)
	rep.Anomalies = append(rep.Anomalies, deleteAll(t, admin, root, l, ops)...)
	rep.Anomalies = append(rep.Anomalies, panics(l)...)
	rep.tally(ops, n.Faults())
	if len(rep.Anomalies) > 0 && o.KeepDir != "" {
		keepLogs(t, l, o.KeepDir)
	}
	return rep
}

// healNodes cancels every drain: a client's cancel may not have got
// through a fault.
func healNodes(admin *clusterlab.Host, l *clusterlab.Lab) {
	for _, h := range l.Hosts {
		admin.Kibo("node", "cancel-drain", h.NodeID)
	}
}

// membersUp reports every member process that is not running once the
// faults are healed: a restart that failed.
func membersUp(l *clusterlab.Lab) []Anomaly {
	var out []Anomaly
	for _, h := range l.Hosts {
		if p := h.ServeProc(); p.Exited() {
			out = append(out, Anomaly{Kind: "member-exited", Detail: fmt.Sprintf("the member of %s exited (code %d) and is not running after the faults: %s", h.NodeID, p.Code, lastError(p.Log))})
		}
	}
	return out
}

// lastError is the last line of the log at path that says why a process
// ended (a panic, a fatal error, the CLI's error), else its last line.
func lastError(path string) string {
	var found string
	clusterlab.AnyLine(path, func(line string) bool {
		for _, p := range []string{"panic: ", "fatal error: ", "kibotos: error: "} {
			if strings.HasPrefix(line, p) {
				found = line
			}
		}
		return false
	})
	if found == "" {
		return clusterlab.Tail(path, 1)
	}
	return found
}

// answering is the first host whose member answers a consistent read
// within d (the first host when none does: the checks then report it).
func answering(t *testing.T, l *clusterlab.Lab, d time.Duration) *clusterlab.Host {
	var found *clusterlab.Host
	testenv.Poll(t, d, func() bool {
		for _, h := range l.Hosts {
			if r := h.Kibo("workspace", "list", "--all", "--consistent", "-q"); r.Code == 0 {
				found = h
				return true
			}
		}
		return false
	})
	if found == nil {
		return l.Hosts[0]
	}
	return found
}

// nodesBack waits until every node is READY for Workspaces again (its
// session alive, its report in), and reports those that are not within d.
func nodesBack(t *testing.T, admin *clusterlab.Host, l *clusterlab.Lab, d time.Duration) []Anomaly {
	var out []Anomaly
	deadline := time.Now().Add(d)
	for _, h := range l.Hosts {
		var last clusterlab.NodeReport
		ok := testenv.Poll(t, time.Until(deadline), func() bool {
			var n clusterlab.NodeReport
			if err := admin.KiboJSON(&n, "node", "get", h.NodeID, "--consistent"); err != nil {
				return false
			}
			last = n
			return clusterlab.ReadyForWorkspaces(n) && n.Session != nil && n.Session.Alive
		})
		if !ok {
			out = append(out, Anomaly{Kind: "node-not-ready", Detail: fmt.Sprintf("node %s not ready for Workspaces %s after the faults were healed: %s", h.NodeID, d, last)})
		}
	}
	return out
}

// keepLogs copies every log of the lab (members, data planes, VMMs and
// consoles) to dir, for the anomalies a report names.
func keepLogs(t *testing.T, l *clusterlab.Lab, dir string) {
	copyTree := func(src, dst string) {
		if _, err := os.Stat(src); err != nil {
			return
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			t.Errorf("keep logs: %v", err)
			return
		}
		if out, err := exec.Command("cp", "-a", src+"/.", dst+"/").CombinedOutput(); err != nil {
			t.Errorf("keep logs: cp %s: %v %s", src, err, out)
		}
	}
	copyTree(filepath.Join(l.Dir, "logs"), filepath.Join(dir, "members"))
	for _, h := range l.Hosts {
		d := datadir.Dir(h.DataDir)
		copyTree(filepath.Join(d.NodeDir(), "systemd", "logs"), filepath.Join(dir, h.NodeID, "units"))
		copyTree(filepath.Join(d.StorageRoot(), "machine-logs"), filepath.Join(dir, h.NodeID, "machine-logs"))
		copyTree(filepath.Join(d.StorageRoot(), "runtime", "registry"), filepath.Join(dir, h.NodeID, "registry"))
	}
	t.Logf("logs of the run kept in %s", dir)
}

// listAll is every Workspace ctrl knows, read from the leader.
func listAll(admin *clusterlab.Host) ([]api.Workspace, error) {
	var list struct {
		Workspaces []api.Workspace `json:"workspaces"`
	}
	err := admin.KiboJSON(&list, "workspace", "list", "--all", "--consistent")
	return list.Workspaces, err
}

// settle waits until every Workspace rests in a stable state with nothing
// pending, and reports those that do not within d.
func settle(t *testing.T, admin *clusterlab.Host, ops []Op, d time.Duration) []Anomaly {
	var last []api.Workspace
	var err error
	testenv.Poll(t, d, func() bool {
		last, err = listAll(admin)
		if err != nil {
			return false
		}
		for _, ws := range last {
			if !stable[ws.State] || ws.Pending != nil {
				return false
			}
		}
		return true
	})
	if err != nil {
		return []Anomaly{{Kind: "unavailable", Detail: fmt.Sprintf("the cluster did not list its Workspaces within %s of the last fault: %v", d, err)}}
	}
	var out []Anomaly
	for _, ws := range last {
		if !stable[ws.State] || ws.Pending != nil {
			out = append(out, Anomaly{Kind: "not-settled", Workspace: ws.WorkspaceID, Detail: fmt.Sprintf("%s %s after the faults were healed", clusterlab.WorkspaceString(ws), d), History: of(ops, ws.WorkspaceID)})
		}
	}
	return out
}

// readBack brings every Workspace of the workload up, one at a time,
// reads its appends back and deletes it. Its own calls go into the
// history (client -1).
func readBack(t *testing.T, admin *clusterlab.Host, w *Workload, hist *History) []Anomaly {
	var out []Anomaly
	list, err := listAll(admin)
	if err != nil {
		return []Anomaly{{Kind: "unavailable", Detail: err.Error()}}
	}
	for _, ws := range list {
		if ws.State == api.WorkspaceFailed {
			// A FAILED Workspace may still hold its Instance's
			// resources, for troubleshooting: the documented way
			// back is stop --force, then start.
			o := w.op(-1, admin, "stop-force", ws.WorkspaceID)
			if o = w.finish(o, admin.KiboTimeout(opTimeout, "workspace", "stop", ws.WorkspaceID, "--force", "--timeout", lifecycleWait)); o.Outcome != OK {
				out = append(out, Anomaly{Kind: "cannot-start", Workspace: ws.WorkspaceID, Detail: fmt.Sprintf("stop --force of %s after the faults: %s", clusterlab.WorkspaceString(ws), o.Detail), History: of(hist.Ops(), ws.WorkspaceID)})
				continue
			}
			ws.State = api.WorkspaceStopped
		}
		up := map[string]string{api.WorkspacePaused: "resume", api.WorkspaceStopped: "start"}[ws.State]
		if up != "" {
			o := w.op(-1, admin, up, ws.WorkspaceID)
			if o = w.finish(o, admin.KiboTimeout(opTimeout, "workspace", up, ws.WorkspaceID, "--timeout", lifecycleWait)); o.Outcome != OK {
				out = append(out, Anomaly{Kind: "cannot-start", Workspace: ws.WorkspaceID, Detail: fmt.Sprintf("%s of %s after the faults: %s", up, clusterlab.WorkspaceString(ws), o.Detail), History: of(hist.Ops(), ws.WorkspaceID)})
				continue
			}
		}
		o := w.op(-1, admin, "read-back", ws.WorkspaceID)
		r := admin.KiboTimeout(opTimeout, "workspace", "exec", ws.WorkspaceID, "--", "sh", "-c", "cat "+seqFile+" 2>/dev/null; true")
		if o = w.finish(o, r); o.Outcome != OK {
			out = append(out, Anomaly{Kind: "cannot-read", Workspace: ws.WorkspaceID, Detail: o.Detail, History: of(hist.Ops(), ws.WorkspaceID)})
			continue
		}
		out = append(out, checkAppends(ws.WorkspaceID, "append", ws.ForkedFrom, hist.Ops(), r.Stdout)...)
		// Its Egress carries its traffic again (the egress process a
		// fault killed was started again): within a few tries.
		var f Op
		testenv.Poll(t, 30*time.Second, func() bool { f = w.fetch(-1, admin, ws.WorkspaceID); return f.Outcome == OK })
		if f.Outcome != OK {
			out = append(out, Anomaly{Kind: "egress-broken", Workspace: ws.WorkspaceID, Detail: "30 s after the faults, wget through its Egress: " + f.Detail, History: of(hist.Ops(), ws.WorkspaceID)})
		}
		// Read, it goes: the next one needs its room (the workload may
		// have made more than the hosts run at once).
		o = w.op(-1, admin, "delete", ws.WorkspaceID)
		w.finish(o, admin.KiboTimeout(opTimeout, "workspace", "delete", ws.WorkspaceID, "--timeout", lifecycleWait))
	}
	return out
}

// deleteAll deletes every Workspace and Volume and reports what is left on
// the hosts: QEMU processes, Instance directories, files in the shared
// pool.
func deleteAll(t *testing.T, admin *clusterlab.Host, root string, l *clusterlab.Lab, ops []Op) []Anomaly {
	var out []Anomaly
	list, err := listAll(admin)
	if err != nil {
		return []Anomaly{{Kind: "unavailable", Detail: err.Error()}}
	}
	for _, ws := range list {
		r := admin.KiboTimeout(opTimeout, "workspace", "delete", ws.WorkspaceID, "--timeout", lifecycleWait)
		if r.Code != 0 {
			out = append(out, Anomaly{Kind: "cannot-delete", Workspace: ws.WorkspaceID, Detail: r.String(), History: of(ops, ws.WorkspaceID)})
		}
	}
	// Volumes readBackVolumes could not read (it deletes the others).
	var vols struct {
		Volumes []api.Volume `json:"volumes"`
	}
	if err := admin.KiboJSON(&vols, "volume", "list", "--consistent"); err != nil {
		out = append(out, Anomaly{Kind: "unavailable", Detail: "volume list: " + err.Error()})
	}
	for _, v := range vols.Volumes {
		if r := admin.KiboTimeout(opTimeout, "volume", "delete", v.VolumeID, "--timeout", lifecycleWait); r.Code != 0 {
			out = append(out, Anomaly{Kind: "cannot-delete", Volume: v.VolumeID, Detail: r.String(), History: of(ops, v.VolumeID)})
		}
	}
	var left []string
	testenv.Poll(t, time.Minute, func() bool {
		left = leftovers(root, l)
		return len(left) == 0
	})
	for _, what := range left {
		out = append(out, Anomaly{Kind: "leak", Detail: what + " left after every Workspace was deleted"})
	}
	return out
}

// leftovers are what a deleted Workspace may leave: its QEMU (its unit's
// process), its Instance directory, its network namespace, its layer and
// memory files.
func leftovers(root string, l *clusterlab.Lab) []string {
	var left []string
	for _, pid := range clusterlab.QemuPIDs(root) {
		left = append(left, fmt.Sprintf("QEMU pid %d", pid))
	}
	for _, h := range l.Hosts {
		d := datadir.Dir(h.DataDir)
		dirs, _ := filepath.Glob(filepath.Join(d.StorageRoot(), "runtime", "instances", "*"))
		for _, dir := range dirs {
			left = append(left, "Instance directory "+dir)
		}
		// An Instance's network namespace, pinned in its host's private
		// systemd's /run/netns (with the namespace go its links, rule
		// table and addresses).
		nss, _ := filepath.Glob(filepath.Join(member.DevSystemdDir(d), "run", "netns", runtime.NetNSName("inst-")+"*"))
		for _, ns := range nss {
			left = append(left, "network namespace "+ns)
		}
	}
	filepath.WalkDir(filepath.Join(root, "shared"), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			left = append(left, "file "+path)
		}
		return nil
	})
	sort.Strings(left)
	return left
}

// panics reports every log line of the lab's processes that says a Go
// program panicked or died of a fatal error.
func panics(l *clusterlab.Lab) []Anomaly {
	var out []Anomaly
	logs, _ := filepath.Glob(filepath.Join(l.Dir, "logs", "*"))
	for _, h := range l.Hosts {
		logs = append(logs, clusterlab.UnitLogs(datadir.Dir(h.DataDir))...)
	}
	for _, log := range logs {
		clusterlab.AnyLine(log, func(line string) bool {
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				out = append(out, Anomaly{Kind: "panic", Detail: filepath.Base(log) + ": " + line})
				return true
			}
			return false
		})
	}
	return out
}
