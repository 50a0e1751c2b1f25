package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/recordfmt"
	"github.com/kibotos/kibotos/netpol"
	"github.com/kibotos/kibotos/storagepool"
	"github.com/kibotos/kibotos/vmm/units"
)

// check-maintenance (process-model seed): with the node service stopped,
// may the node program be replaced (upgrade) or removed (remove)? It only
// reads: the exclusive lock (taken and released, and what it says of the
// node's cgroup), launch records, units and processes, the pools' layers,
// Volume files and holder records. It repairs
// nothing, bumps no incarnation and creates no directory.

// Maintenance operations.
const (
	OpUpgrade = "upgrade"
	OpRemove  = "remove"
)

// MaintenanceItem is one thing the check looked at.
type MaintenanceItem struct {
	Object   string `json:"object"`
	State    string `json:"state"`
	Blocking bool   `json:"blocking"`
	Detail   string `json:"detail,omitempty"`
}

// MaintenanceReport is the check's conclusion.
type MaintenanceReport struct {
	Operation string            `json:"operation"`
	OK        bool              `json:"ok"`
	Items     []MaintenanceItem `json:"items"`
}

// ErrRuntimeInUse: a node process holds the runtime's lock.
var ErrRuntimeInUse = errors.New("runtime is already in use")

// CheckMaintenance checks this node's runtime for op. cfg needs
// StorageRoot, NodeID, Units (the service manager the VMM units run
// under; nil when none runs any more, as after a private systemd ended
// with its node) and Pools.
func CheckMaintenance(ctx context.Context, cfg Config, op string) (*MaintenanceReport, error) {
	if op != OpUpgrade && op != OpRemove {
		return nil, fmt.Errorf("operation %q: use upgrade or remove", op)
	}
	rt := &Runtime{cfg: cfg, units: cfg.Units, instancesDir: filepath.Join(cfg.StorageRoot, "runtime", "instances")}
	unlock, err := lockForCheck(cfg)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return checkMaintenanceLocked(ctx, rt, cfg, op)
}

// lockForCheck takes the runtime's exclusive lock the way a node would,
// without creating it: a check must not run beside a node process.
func lockForCheck(cfg Config) (unlock func(), err error) {
	lockPath := lockFile(cfg.StorageRoot)
	f, err := os.OpenFile(lockPath, os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// No node ever ran here: nothing it could have left behind.
		return func() {}, nil
	case err != nil:
		return nil, fmt.Errorf("runtime lock %s: %w", lockPath, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %s is locked by a running node process: stop the node service first", ErrRuntimeInUse, lockPath)
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// checkMaintenanceLocked is CheckMaintenance once the lock is held.
func checkMaintenanceLocked(ctx context.Context, rt *Runtime, cfg Config, op string) (*MaintenanceReport, error) {
	rep := &MaintenanceReport{Operation: op, Items: []MaintenanceItem{}}
	if _, err := os.Stat(rt.instancesDir); err == nil {
		verdicts, noRecord, problems, err := rt.inspect(ctx)
		if err != nil {
			return nil, err
		}
		for _, p := range problems {
			state := "unclear ownership"
			if errors.Is(p, recordfmt.ErrOutOfRange) {
				state = "record format"
			}
			rep.add(MaintenanceItem{Object: "runtime", State: state, Blocking: true, Detail: p.Error()})
		}
		for _, dir := range noRecord {
			rep.add(MaintenanceItem{Object: dir, State: "leftover", Blocking: true, Detail: "instance directory without a launch record: no Instance owns it (the node removes it when it starts)"})
		}
		owned := map[string]bool{}
		for _, v := range verdicts {
			rep.add(instanceItem(v, op, rt.processesLeft(v)))
			owned[NetNSName(v.rec.dirName())] = true
		}
		for _, it := range namespaceLeftovers(rt, owned) {
			rep.add(it)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, it := range helperItems(cfg) {
		rep.add(it)
	}
	if op == OpRemove {
		for _, it := range heldItems(cfg) {
			rep.add(it)
		}
	}
	rep.OK = true
	for _, it := range rep.Items {
		rep.OK = rep.OK && !it.Blocking
	}
	return rep, nil
}

func (r *MaintenanceReport) add(it MaintenanceItem) { r.Items = append(r.Items, it) }

// namespaceLeftovers lists the Instances' pinned network namespaces that
// no launch record owns: nobody would clean them up.
func namespaceLeftovers(rt *Runtime, owned map[string]bool) []MaintenanceItem {
	dir := netpol.DefaultNamespaceDir
	if rt.units != nil && rt.units.Target().NetNSDir != "" {
		dir = rt.units.Target().NetNSDir
	}
	ents, _ := os.ReadDir(dir)
	var out []MaintenanceItem
	for _, e := range ents {
		if name := e.Name(); strings.HasPrefix(name, NetNSName("")) && !owned[name] {
			out = append(out, MaintenanceItem{Object: filepath.Join(dir, name), State: "leftover", Blocking: true,
				Detail: "network namespace of an Instance without a launch record: nobody owns it; remove it with ip netns delete " + name + " once you know it is not in use"})
		}
	}
	return out
}

// helperItems judges the cgroup the node last ran in: a process still
// there is a tool it started (mkfs.ext4, qemu-img, ...) that has not
// finished, work the node left half done. Only a service of the node's
// own says that; in a shell's or a test's cgroup the node's tools cannot
// be told from the rest.
func helperItems(cfg Config) []MaintenanceItem {
	path := lockFile(cfg.StorageRoot)
	h, err := readLockHolder(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // no node ever ran here
	case errors.Is(err, errNoLockHolder):
		return []MaintenanceItem{{Object: path, State: "helper processes not checked",
			Detail: err.Error() + " (a build before this check wrote it): processes the node started cannot be found; start and stop the node once to record its cgroup"}}
	case errors.Is(err, recordfmt.ErrOutOfRange):
		return []MaintenanceItem{{Object: path, State: "record format", Blocking: true, Detail: err.Error()}}
	case err != nil:
		return []MaintenanceItem{{Object: path, State: "corrupt record", Blocking: true, Detail: err.Error()}}
	case h.CgroupDir == "" || !strings.HasSuffix(h.Cgroup, ".service"):
		return []MaintenanceItem{{Object: path, State: "helper processes not checked",
			Detail: fmt.Sprintf("node process %d ran in cgroup %q, not in a service of its own (a shell, a test, kibotos dev): what it started cannot be told from other processes there", h.PID, h.Cgroup)}}
	}
	pids, err := units.CgroupPIDs(h.CgroupDir)
	if err != nil {
		return []MaintenanceItem{{Object: h.CgroupDir, State: "helper processes", Blocking: true,
			Detail: fmt.Sprintf("the cgroup node process %d ran in cannot be read: %v", h.PID, err)}}
	}
	if len(pids) == 0 {
		return []MaintenanceItem{{Object: h.CgroupDir, State: "no helper processes", Detail: "nothing is left running in the cgroup the node ran in"}}
	}
	return []MaintenanceItem{{Object: h.CgroupDir, State: "helper processes", Blocking: true,
		Detail: fmt.Sprintf("host PIDs %s still run in the cgroup node process %d ran in: tools the node started have not finished; wait for them to end, or end them by PID once you know what they do, then check again",
			describePIDs(pids), h.PID)}}
}

// describePIDs lists host PIDs with their command lines, for messages.
func describePIDs(pids []int) string {
	pids = slices.Sorted(slices.Values(pids))
	var out []string
	for _, pid := range pids {
		out = append(out, fmt.Sprintf("%d (%s)", pid, procCommand(pid)))
	}
	return strings.Join(out, ", ")
}

// processesLeft is what is left of a VMM the node was ending, or saw
// end, when it stopped: a unit no longer active whose cgroup still holds
// processes, or whose main process still runs, is a shutdown the node
// had not finished (it waits for them, logging "instance cleanup
// pending"). Without a service manager nothing is left: a private
// systemd took its processes with it.
func (rt *Runtime) processesLeft(v verdict) error {
	if rt.units == nil || v.rec.Process == nil || !(v.gone || v.state == StateStopped) {
		return nil
	}
	return rt.checkEmpty(v.rec)
}

// instanceItem judges one Instance's record for op; left is what
// processesLeft found of its VMM.
func instanceItem(v verdict, op string, left error) MaintenanceItem {
	it := MaintenanceItem{Object: "instance " + v.rec.InstanceID, State: string(v.state)}
	var pending *CleanupPendingError
	switch {
	case errors.As(left, &pending):
		it.State, it.Blocking = "shutdown half done", true
		it.Detail = fmt.Sprintf("a shutdown is half done: unit %s is no longer active, but its cgroup %s still holds host PIDs %s (main process alive: %v): wait for them to end (most often they wait on storage that does not answer: fix it), then check again",
			v.rec.Unit, pending.Cgroup, describePIDs(pending.PIDs), pending.MainAlive)
	case left != nil:
		it.State, it.Blocking = "shutdown half done", true
		it.Detail = fmt.Sprintf("whether the shutdown of unit %s finished cannot be told: %v; inspect it with systemctl status %s, then check again", v.rec.Unit, left, v.rec.Unit)
	case v.state == StateStarting:
		it.Blocking, it.Detail = true, "a start is half-way done (its guest never answered): wait for it with the node running, or stop it"
	case v.state == StateRunning && v.rec.Network != nil && v.rec.Network.Switch != nil:
		sw := v.rec.Network.Switch
		it.State = sw.what() + " half done"
		it.Blocking, it.Detail = true, fmt.Sprintf("a %s is half done (from %s to %s, started %s): start the node so it finishes it, then check again",
			sw.what(), sw.From.describe(), v.rec.Network.Policy.describe(), sw.Started.Format(time.RFC3339))
	case op == OpRemove:
		// Running, failed or ended: its record waits for the control plane.
		it.Blocking, it.Detail = true, fmt.Sprintf("node Instance %s is active or requires cleanup: delete or stop its Workspace through the control plane first", v.rec.InstanceID)
	case v.state == StateRunning:
		it.Detail = "record matches its running unit (unit, InvocationID, PID, start time, executable, cgroup, network namespace): the new node takes it over"
	default:
		it.Detail = "ended; the new node keeps its record"
	}
	return it
}

// heldItems lists the retained layers and Volume files the node still
// holds in its pools (a remove must not leave them ownerless): every one
// of a standalone pool and those of a shared pool whose holder record
// names this node; one whose holder record names another node is that
// node's.
func heldItems(cfg Config) []MaintenanceItem {
	var out []MaintenanceItem
	for _, p := range cfg.Pools {
		layers, _ := filepath.Glob(filepath.Join(p.Path, "layers", "*.qcow2"))
		sort.Strings(layers)
		for _, l := range layers {
			out = appendHeld(out, cfg.NodeID, p, l, "retained layer",
				"writable layer in pool %s held by this node: delete its Workspace, or move it to another node of a shared pool")
		}
		for _, v := range volumeFiles(p.Path) {
			out = appendHeld(out, cfg.NodeID, p, v, "volume",
				"Volume file in pool %s held by this node: delete its Volume, or move it to another node of a shared pool")
		}
	}
	return out
}

// appendHeld adds the item of object, a file in pool p, unless another
// node holds it or nobody does in a shared pool. detail takes the pool id.
func appendHeld(out []MaintenanceItem, node string, p PoolDir, object, state, detail string) []MaintenanceItem {
	h, err := storagepool.ReadHolder(object)
	switch {
	case err != nil:
		return append(out, MaintenanceItem{Object: object, State: "unclear ownership", Blocking: true, Detail: err.Error()})
	case h != nil && h.NodeID != node:
		return out // another node's now (a moved pool, or a shared one)
	case h == nil && p.Shared:
		return out // released: any member may use it next
	}
	return append(out, MaintenanceItem{Object: object, State: state, Blocking: true, Detail: fmt.Sprintf(detail, p.ID)})
}

// volumeFiles are the Volume files of the pool at root, sorted: the
// regular files of volumes/data but holder records and the temporary
// files of unfinished writes.
func volumeFiles(root string) []string {
	dir := filepath.Join(root, "volumes", "data")
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		name := e.Name()
		if e.Type().IsRegular() && !strings.HasSuffix(name, storagepool.HolderSuffix) && !storagepool.IsTemp(name) {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out
}
