package fsm

import (
	"errors"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Quotas of a namespace (issue 45): running Workspaces, their vCPU and
// memory, Volume bytes and the snapshot bytes of paused Workspaces. What
// a namespace's objects take is kept in step by every write of a
// Workspace or Volume (bucketNamespaceUsage, like a pool's use), and the
// ops that ask for more (create and fork, start and resume, pause,
// Volume create and resize) check it here, in the log's order: of two
// creates racing for the last room, the later one is refused.
//
// The default namespace has no quota: it is the operators'.

// wsCharge is what Workspace w takes of its namespace's quota: an
// Instance (it runs, or is being started or stopped) and its snapshot.
func wsCharge(w *api.Workspace) api.NamespaceResources {
	var r api.NamespaceResources
	if w == nil {
		return r
	}
	if w.InstanceID != "" {
		r.RunningWorkspaces, r.CPU, r.MemoryBytes = 1, w.CPU, w.MemoryBytes
	}
	if s := w.Snapshot; s != nil && !s.Discarded && s.From == "" {
		r.SnapshotBytes = s.SizeBytes
	}
	return r
}

// volCharge is what Volume v takes: its size, or what a pending resize
// grows it to.
func volCharge(v *api.Volume) api.NamespaceResources {
	if _, u := volumeCharge(v); u.UsedBytes > 0 {
		return api.NamespaceResources{VolumeBytes: u.UsedBytes}
	}
	return api.NamespaceResources{}
}

// moveNamespaceUsage moves an object's charge from before to after in
// the usage of namespace ns (stored form; default keeps none).
func moveNamespaceUsage(tx *bolt.Tx, ns string, before, after api.NamespaceResources) error {
	if ns == "" || before == after {
		return nil
	}
	u, err := namespaceResources(tx, ns)
	if err != nil {
		return err
	}
	u = u.Sub(before).Add(after)
	return putJSON(tx, bucketNamespaceUsage, []byte(ns), u)
}

func namespaceResources(tx *bolt.Tx, ns string) (api.NamespaceResources, error) {
	var u api.NamespaceResources
	_, err := getJSON(tx, bucketNamespaceUsage, []byte(ns), &u)
	return u, err
}

// moveWorkspaceUsage is the workspaceDerived step of the usage.
func moveWorkspaceUsage(ac *applyCtx, old, w *api.Workspace) error {
	ns := ""
	switch {
	case w != nil:
		ns = w.Namespace
	case old != nil:
		ns = old.Namespace
	}
	return moveNamespaceUsage(ac.tx, ns, wsCharge(old), wsCharge(w))
}

// checkQuota refuses asking for more of namespace ns (stored form) than
// its quota leaves, naming the quota, what is in use and what is asked.
func checkQuota(tx *bolt.Tx, ns string, ask api.NamespaceResources) error {
	if ns == "" || ask == (api.NamespaceResources{}) {
		return nil
	}
	var rec namespaceRecord
	if ok, err := getJSON(tx, bucketNamespaces, []byte(ns), &rec); err != nil || !ok || rec.Quota == nil {
		return err
	}
	use, err := namespaceResources(tx, ns)
	if err != nil {
		return err
	}
	q := rec.Quota
	over := func(what string, limit *uint64, used, asked uint64, format func(uint64) string) error {
		if limit == nil || asked == 0 || used+asked <= *limit {
			return nil
		}
		return api.Errorf(api.CodeResourceExhausted, "namespace %s: %s quota %s, %s in use, %s asked: free some or ask an operator to raise it (kibo namespace set-quota %s)",
			ns, what, format(*limit), format(used), format(asked), ns)
	}
	count := func(n uint64) string { return fmt.Sprint(n) }
	cpu := func(n uint64) string { return api.Milli(n).String() }
	for _, c := range []error{
		over("running Workspaces", q.RunningWorkspaces, uint64(use.RunningWorkspaces), uint64(ask.RunningWorkspaces), count),
		over("vCPU", q.CPU, uint64(use.CPU), uint64(ask.CPU), cpu),
		over("memory", q.MemoryBytes, use.MemoryBytes, ask.MemoryBytes, api.FormatBytes),
		over("Volume bytes", q.VolumeBytes, use.VolumeBytes, ask.VolumeBytes, api.FormatBytes),
		over("snapshot bytes", q.SnapshotBytes, use.SnapshotBytes, ask.SnapshotBytes, api.FormatBytes),
	} {
		if c != nil {
			return c
		}
	}
	return nil
}

// runCharge is what starting an Instance of w asks for.
func runCharge(w *api.Workspace) api.NamespaceResources {
	return api.NamespaceResources{RunningWorkspaces: 1, CPU: w.CPU, MemoryBytes: w.MemoryBytes}
}

// NamespaceQuotaArgs changes a namespace's quota: Set's fields that are
// given replace the quota's, Clear names those to lift (running_workspaces,
// cpu, memory, volume_bytes, snapshot_bytes).
type NamespaceQuotaArgs struct {
	Name  string             `json:"name"`
	Set   api.NamespaceQuota `json:"set"`
	Clear []string           `json:"clear,omitempty"`
}

func applyNamespaceSetQuota(ac *applyCtx) (any, error) {
	var a NamespaceQuotaArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidNamespace(a.Name); err != nil {
		return nil, err
	}
	if a.Name == api.DefaultNamespace {
		return nil, api.Errorf(api.CodeFailedPrecondition, "namespace default has no quota: it is the operators'; give tenants namespaces of their own")
	}
	if err := namespaceExists(ac.tx, a.Name); err != nil {
		return nil, err
	}
	var rec namespaceRecord
	if _, err := getJSON(ac.tx, bucketNamespaces, []byte(a.Name), &rec); err != nil {
		return nil, err
	}
	q := api.NamespaceQuota{}
	if rec.Quota != nil {
		q = *rec.Quota
	}
	if err := q.Apply(a.Set, a.Clear); err != nil {
		return nil, err
	}
	rec.Quota = &q
	if q == (api.NamespaceQuota{}) {
		rec.Quota = nil
	}
	if err := putJSON(ac.tx, bucketNamespaces, []byte(a.Name), rec); err != nil {
		return nil, err
	}
	return namespaceView(ac.tx, rec)
}

// quotaSuffix follows the quota in every refusal: "namespace NS: WHAT quota ...".
const quotaSuffix = " quota "

// QuotaRefusal says whether err is a quota refusal of checkQuota, and of
// which namespace and quota (for the members' metrics).
func QuotaRefusal(err error) (ns, quota string, ok bool) {
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeResourceExhausted {
		return "", "", false
	}
	rest, found := strings.CutPrefix(e.Message, "namespace ")
	if !found {
		return "", "", false
	}
	ns, rest, found = strings.Cut(rest, ": ")
	if !found {
		return "", "", false
	}
	quota, _, found = strings.Cut(rest, quotaSuffix)
	return ns, quota, found
}

// countTimeout counts a timeout action done in namespace ns (stored
// form), in the state: equal on every ctrl member, like placements.
func countTimeout(tx *bolt.Tx, ns, action string) error {
	key := []byte(api.ShownNamespace(ns))
	var c api.NamespaceCounters
	if _, err := getJSON(tx, bucketNamespaceCounters, key, &c); err != nil {
		return err
	}
	if c.Timeouts == nil {
		c.Timeouts = map[string]uint64{}
	}
	c.Timeouts[action]++
	return putJSON(tx, bucketNamespaceCounters, key, c)
}

// NamespaceFigures are a namespace's metrics.
type NamespaceFigures struct {
	api.Namespace
	Counters api.NamespaceCounters
}

// NamespaceMetrics are the figures of every namespace, default first.
func NamespaceMetrics(tx *bolt.Tx) ([]NamespaceFigures, error) {
	list, err := ListNamespaces(tx)
	if err != nil {
		return nil, err
	}
	out := make([]NamespaceFigures, len(list))
	for i, ns := range list {
		out[i].Namespace = ns
		if _, err := getJSON(tx, bucketNamespaceCounters, []byte(ns.Name), &out[i].Counters); err != nil {
			return nil, err
		}
	}
	return out, nil
}
