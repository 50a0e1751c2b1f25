package fsm

import (
	"bytes"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Namespaces (issue 45): Workspaces, Volumes and API keys belong to one.
// "default" always exists without a record and is what every record
// without a namespace belongs to, so the records written before this
// level need no change. Names of Volumes are unique within a namespace;
// Workspace ids are unique across the cluster.
//
// The objects of every other namespace are indexed under it
// (bucketNamespaceObjects), which is how a delete knows the namespace is
// empty and how its usage is counted without reading every record.

// LevelNamespaces is the level of namespaces and API keys:
// OpNamespaceCreate, OpNamespaceDelete, OpAPIKeyCreate, OpAPIKeyRevoke,
// the Namespace of WorkspaceCreateArgs, VolumeCreateArgs, VolumeArgs and
// VolumeResizeArgs (refused by the leader below it: an older voter would
// put the object in default), and entries whose actor is an API key.
const LevelNamespaces = 14

// Namespace and API key operations.
const (
	OpNamespaceCreate = "namespace.create"
	OpNamespaceDelete = "namespace.delete"
	OpAPIKeyCreate    = "api_key.create"
	OpAPIKeyRevoke    = "api_key.revoke"
	OpNamespaceQuota  = "namespace.set_quota"
)

// NamespaceArgs names a namespace.
type NamespaceArgs struct {
	Name string `json:"name"`
}

// namespaceRecord is a namespace as stored.
type namespaceRecord struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
	// Quota bounds what the namespace's objects take (quotas.go).
	Quota *api.NamespaceQuota `json:"quota,omitempty"`
	// Defaults are its Workspaces' lifetime defaults (nsdefaults.go).
	Defaults *api.NamespaceDefaults `json:"defaults,omitempty"`
}

// Kinds of object in the namespace index.
const (
	nsKindWorkspace = "w"
	nsKindVolume    = "v"
)

// nsObjectKey indexes object id of kind under namespace ns (stored form).
func nsObjectKey(ns, kind, id string) []byte { return []byte(ns + "\x00" + kind + "\x00" + id) }

// moveNamespaceIndex keeps the index entry of an object in step: the
// namespace of an object never changes, so only its birth and its end
// matter.
func moveNamespaceIndex(tx *bolt.Tx, kind, ns, id string, born, gone bool) error {
	if ns == "" {
		return nil
	}
	switch {
	case born:
		return tx.Bucket(bucketNamespaceObjects).Put(nsObjectKey(ns, kind, id), nil)
	case gone:
		return tx.Bucket(bucketNamespaceObjects).Delete(nsObjectKey(ns, kind, id))
	}
	return nil
}

// namespaceExists refuses a namespace that is not valid or not there.
func namespaceExists(tx *bolt.Tx, ns string) error {
	if ns == "" || ns == api.DefaultNamespace {
		return nil
	}
	if err := api.ValidNamespace(ns); err != nil {
		return err
	}
	if tx.Bucket(bucketNamespaces).Get([]byte(ns)) == nil {
		return api.Errorf(api.CodeNotFound, "namespace %s does not exist: create it with kibo namespace create %s, or check the name with kibo namespace list", ns, ns)
	}
	return nil
}

func applyNamespaceCreate(ac *applyCtx) (any, error) {
	var a NamespaceArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidNamespace(a.Name); err != nil {
		return nil, err
	}
	b := ac.tx.Bucket(bucketNamespaces)
	if a.Name == api.DefaultNamespace || b.Get([]byte(a.Name)) != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "namespace %s already exists: choose another name", a.Name)
	}
	if countAtMost(ac.tx, bucketNamespaces, api.MaxNamespaces) >= api.MaxNamespaces {
		return nil, api.Errorf(api.CodeResourceExhausted, "namespace %s: the cluster holds at most %d namespaces; delete an unused one first", a.Name, api.MaxNamespaces)
	}
	rec := namespaceRecord{Name: a.Name, CreatedAt: *at(ac.e), CreatedBy: ac.e.Actor}
	if err := putJSON(ac.tx, bucketNamespaces, []byte(a.Name), rec); err != nil {
		return nil, err
	}
	return namespaceView(ac.tx, rec)
}

// applyNamespaceDelete deletes an empty namespace: its API keys go with
// it (they can reach nothing else), its Workspaces and Volumes must be
// deleted first.
func applyNamespaceDelete(ac *applyCtx) (any, error) {
	var a NamespaceArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidNamespace(a.Name); err != nil {
		return nil, err
	}
	if a.Name == api.DefaultNamespace {
		return nil, api.Errorf(api.CodeFailedPrecondition, "namespace default cannot be deleted: it holds every object that names no namespace")
	}
	if err := namespaceExists(ac.tx, a.Name); err != nil {
		return nil, err
	}
	u, err := namespaceUsage(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if u.Workspaces > 0 || u.Volumes > 0 || u.Egress > 0 || u.Resolvers > 0 {
		return nil, api.Errorf(api.CodeFailedPrecondition, "namespace %s still holds %d Workspaces, %d Volumes, %d Egress and %d Resolver objects: delete them first (kibo workspace list -n %s, kibo volume list -n %s, kibo egress list -n %s, kibo resolver list -n %s)",
			a.Name, u.Workspaces, u.Volumes, u.Egress, u.Resolvers, a.Name, a.Name, a.Name, a.Name)
	}
	if err := deleteNamespaceKeys(ac.tx, a.Name); err != nil {
		return nil, err
	}
	for _, b := range [][]byte{bucketNamespaceUsage, bucketNamespaceCounters} {
		if err := ac.tx.Bucket(b).Delete([]byte(a.Name)); err != nil {
			return nil, err
		}
	}
	if err := ac.tx.Bucket(bucketNamespaces).Delete([]byte(a.Name)); err != nil {
		return nil, err
	}
	return map[string]string{"deleted": a.Name}, nil
}

// namespaceUsage counts what namespace ns (a name, default included)
// holds. The default namespace has no index: its objects are those
// without a namespace, counted from the records.
func namespaceUsage(tx *bolt.Tx, ns string) (api.NamespaceUsage, error) {
	var u api.NamespaceUsage
	stored := api.StoredNamespace(ns)
	keys := tx.Bucket(bucketAPIKeys).Cursor()
	prefix := []byte(stored + "\x00")
	for k, _ := keys.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = keys.Next() {
		u.APIKeys++
	}
	if stored != "" {
		u.Egress, u.Resolvers = countObjects(tx, bucketEgress, stored), countObjects(tx, bucketResolvers, stored)
		c := tx.Bucket(bucketNamespaceObjects).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			switch string(k[len(prefix)]) {
			case nsKindWorkspace:
				u.Workspaces++
			case nsKindVolume:
				u.Volumes++
			}
		}
		return u, nil
	}
	// Default's objects are those no other namespace indexes: counted
	// from the keys alone, no record decoded (metrics read this at every
	// scrape).
	for _, c := range []struct {
		bucket []byte
		kind   string
		n      *int
	}{{bucketWorkspaces, nsKindWorkspace, &u.Workspaces}, {bucketVolumes, nsKindVolume, &u.Volumes}} {
		*c.n = tx.Bucket(c.bucket).Stats().KeyN - countIndexed(tx, c.kind)
	}
	return u, nil
}

// countIndexed counts the objects of kind of every namespace but default.
func countIndexed(tx *bolt.Tx, kind string) int {
	n := 0
	c := tx.Bucket(bucketNamespaceObjects).Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if _, rest, ok := bytes.Cut(k, []byte{0}); ok && bytes.HasPrefix(rest, []byte(kind+"\x00")) {
			n++
		}
	}
	return n
}

func namespaceView(tx *bolt.Tx, rec namespaceRecord) (api.Namespace, error) {
	ns := api.Namespace{Name: rec.Name, CreatedAt: rec.CreatedAt, CreatedBy: rec.CreatedBy, Quota: rec.Quota, Defaults: rec.Defaults}
	u, err := namespaceUsage(tx, rec.Name)
	if err != nil {
		return ns, err
	}
	ns.Usage = u
	if rec.Name != api.DefaultNamespace {
		ns.Usage.NamespaceResources, err = namespaceResources(tx, rec.Name)
	}
	return ns, err
}

// GetNamespace is namespace name with its usage.
func GetNamespace(tx *bolt.Tx, name string) (api.Namespace, error) {
	if name == api.DefaultNamespace {
		return namespaceView(tx, namespaceRecord{Name: name})
	}
	if err := namespaceExists(tx, name); err != nil {
		return api.Namespace{}, err
	}
	var rec namespaceRecord
	if _, err := getJSON(tx, bucketNamespaces, []byte(name), &rec); err != nil {
		return api.Namespace{}, err
	}
	return namespaceView(tx, rec)
}

// ListNamespaces is every namespace, default first, then by name.
func ListNamespaces(tx *bolt.Tx) ([]api.Namespace, error) {
	def, err := GetNamespace(tx, api.DefaultNamespace)
	if err != nil {
		return nil, err
	}
	out := []api.Namespace{def}
	err = tx.Bucket(bucketNamespaces).ForEach(func(k, v []byte) error {
		var rec namespaceRecord
		if err := jsonRecord(bucketNamespaces, k, v, &rec); err != nil {
			return err
		}
		ns, err := namespaceView(tx, rec)
		out = append(out, ns)
		return err
	})
	return out, err
}
