package fsm

import (
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/kibotos/kibotos/api"
	bolt "go.etcd.io/bbolt"
)

// checkIndex verifies the node index holds exactly what every Workspace occupies.
func checkIndex(t testing.TB, f *FSM) {
	t.Helper()
	if err := f.View(func(tx *bolt.Tx) error { return indexProblem(tx) }); err != nil {
		t.Fatal(err)
	}
}

func indexProblem(tx *bolt.Tx) error {
	want, wantPending := map[string]bool{}, map[string]bool{}
	wantHolds := map[string]Holds{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for _, n := range occupied(w) {
			want[string(wsNodeKey(n, w.WorkspaceID))] = true
		}
		if n := pendingNode(w); n != "" {
			wantPending[string(wsNodeKey(n, w.WorkspaceID))] = true
		}
		for _, n := range nodesOf(w) {
			h, c := wantHolds[n], holdsOf(w, n)
			h.Instances += c.Instances
			h.Layers += c.Layers
			h.Volumes += c.Volumes
			h.Allocated.CPU += c.Allocated.CPU
			h.Allocated.MemoryBytes += c.Allocated.MemoryBytes
			if h == (Holds{}) {
				continue
			}
			wantHolds[n] = h
		}
		return nil
	}); err != nil {
		return err
	}
	got := map[string]bool{}
	tx.Bucket(bucketWorkspaceNodes).ForEach(func(k, _ []byte) error { got[string(k)] = true; return nil })
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("workspace node index %q, want %q", keys(got), keys(want))
	}
	gotPending := map[string]bool{}
	tx.Bucket(bucketWorkspaceCommands).ForEach(func(k, _ []byte) error { gotPending[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotPending, wantPending) {
		return fmt.Errorf("pending command index %q, want %q", keys(gotPending), keys(wantPending))
	}
	// The holds counters equal what the records hold, recounted.
	gotHolds := map[string]Holds{}
	if err := tx.Bucket(bucketNodeHolds).ForEach(func(k, _ []byte) error {
		h, err := nodeHolds(tx, string(k))
		gotHolds[string(k)] = h
		return err
	}); err != nil {
		return err
	}
	if !reflect.DeepEqual(gotHolds, wantHolds) {
		return fmt.Errorf("node holds counters %+v, recounted from the records %+v", gotHolds, wantHolds)
	}
	if err := poolUseProblem(tx); err != nil {
		return err
	}
	if err := volumesProblem(tx); err != nil {
		return err
	}
	if err := forksProblem(tx); err != nil {
		return err
	}
	if err := endsProblem(tx); err != nil {
		return err
	}
	return refsProblem(tx)
}

// poolUseProblem recounts what the Workspaces' layers take of each pool.
func poolUseProblem(tx *bolt.Tx) error {
	waits := map[string]bool{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err == nil && w.DeleteWaitsForPool != "" {
			waits[string(poolWaitKey(w.DeleteWaitsForPool, w.WorkspaceID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err == nil && v.DeleteWaitsForPool != "" {
			waits[string(poolWaitKey(v.DeleteWaitsForPool, v.VolumeID))] = true
		}
		return err
	}); err != nil {
		return err
	}
	gotWaits := map[string]bool{}
	tx.Bucket(bucketPoolWaits).ForEach(func(k, _ []byte) error { gotWaits[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotWaits, waits) {
		return fmt.Errorf("pool waits index %q, want %q", keys(gotWaits), keys(waits))
	}
	want := map[string]PoolUse{}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for pool, c := range workspaceCharges(w) {
			u := want[pool]
			u.Layers += c.Layers
			u.UsedBytes += c.UsedBytes
			want[pool] = u
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err != nil {
			return err
		}
		if pool, c := volumeCharge(v); pool != "" {
			u := want[pool]
			u.Volumes += c.Volumes
			u.UsedBytes += c.UsedBytes
			want[pool] = u
		}
		return nil
	}); err != nil {
		return err
	}
	got := map[string]PoolUse{}
	if err := tx.Bucket(bucketPoolUse).ForEach(func(k, _ []byte) error {
		u, err := poolUse(tx, string(k))
		got[string(k)] = u
		return err
	}); err != nil {
		return err
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("pool use counters %+v, recounted from the records %+v", got, want)
	}
	return nil
}

// volumesProblem checks the Volume indexes (names, pending commands) and
// that every Volume's attachment and use right are its Workspace's.
func volumesProblem(tx *bolt.Tx) error {
	names, cmds, nsObjects := map[string]bool{}, map[string]bool{}, map[string]bool{}
	usage := map[string]api.NamespaceResources{}
	attachedTo := map[string]string{} // volume id → workspace id
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err != nil {
			return err
		}
		for _, m := range attachedVolumes(w) {
			if other, ok := attachedTo[m.VolumeID]; ok {
				return fmt.Errorf("volume %s attached to %s and %s", m.VolumeID, other, w.WorkspaceID)
			}
			attachedTo[m.VolumeID] = w.WorkspaceID
			v, err := getVolume(tx, m.VolumeID)
			if err != nil || v == nil {
				return fmt.Errorf("workspace %s lists volume %s without a record (%v)", w.WorkspaceID, m.VolumeID, err)
			}
			held := w.Layer != nil && w.Layer.Held
			if v.WorkspaceID != w.WorkspaceID || v.MountPath != m.Path || v.Held != held || (w.Layer != nil && v.NodeID != w.Layer.NodeID) {
				return fmt.Errorf("volume %s %+v is not in step with its workspace %s (layer %+v)", v.Name, v, w.WorkspaceID, w.Layer)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketVolumes).ForEach(func(k, _ []byte) error {
		v, err := getVolume(tx, string(k))
		if err != nil {
			return err
		}
		names[string(volNameKey(v.Namespace, v.Name))+"="+v.VolumeID] = true
		if v.Namespace != "" {
			nsObjects[string(nsObjectKey(v.Namespace, nsKindVolume, v.VolumeID))] = true
			usage[v.Namespace] = usage[v.Namespace].Add(volCharge(v))
		}
		if v.Pending != nil {
			cmds[string(volCmdKey(v.Pending.NodeID, v.VolumeID))] = true
		}
		if v.WorkspaceID != "" && attachedTo[v.VolumeID] != v.WorkspaceID {
			return fmt.Errorf("volume %s says it is attached to %s, which does not list it", v.Name, v.WorkspaceID)
		}
		if v.WorkspaceID == "" && v.Held {
			return fmt.Errorf("volume %s is held while detached", v.Name)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tx.Bucket(bucketWorkspaces).ForEach(func(k, _ []byte) error {
		w, err := getWorkspace(tx, string(k))
		if err == nil && w.Namespace != "" {
			nsObjects[string(nsObjectKey(w.Namespace, nsKindWorkspace, w.WorkspaceID))] = true
			usage[w.Namespace] = usage[w.Namespace].Add(wsCharge(w))
		}
		return err
	}); err != nil {
		return err
	}
	gotUsage := map[string]api.NamespaceResources{}
	tx.Bucket(bucketNamespaceUsage).ForEach(func(k, v []byte) error {
		var u api.NamespaceResources
		jsonRecord(bucketNamespaceUsage, k, v, &u)
		if u != (api.NamespaceResources{}) {
			gotUsage[string(k)] = u
		}
		return nil
	})
	for ns, u := range usage {
		if u == (api.NamespaceResources{}) {
			delete(usage, ns)
		}
	}
	if !reflect.DeepEqual(gotUsage, usage) {
		return fmt.Errorf("namespace usage %+v, want %+v from the records", gotUsage, usage)
	}
	gotObjects := map[string]bool{}
	tx.Bucket(bucketNamespaceObjects).ForEach(func(k, _ []byte) error { gotObjects[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotObjects, nsObjects) {
		return fmt.Errorf("namespace objects index %q, want %q", keys(gotObjects), keys(nsObjects))
	}
	gotNames, gotCmds := map[string]bool{}, map[string]bool{}
	tx.Bucket(bucketVolumeNames).ForEach(func(k, v []byte) error { gotNames[string(k)+"="+string(v)] = true; return nil })
	tx.Bucket(bucketVolumeCommands).ForEach(func(k, _ []byte) error { gotCmds[string(k)] = true; return nil })
	if !reflect.DeepEqual(gotNames, names) {
		return fmt.Errorf("volume names index %q, want %q", keys(gotNames), keys(names))
	}
	if !reflect.DeepEqual(gotCmds, cmds) {
		return fmt.Errorf("volume command index %q, want %q", keys(gotCmds), keys(cmds))
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sorted(ids ...string) []string {
	out := append([]string{}, ids...)
	sort.Strings(out)
	return out
}
