package fsm

import (
	"strings"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Egress and Resolver objects of a namespace other than default are
// stored under "NAMESPACE:NAME" (':' is in no object or namespace name),
// so their records, revisions, references and the tasks nodes get are
// those of any object: the name is opaque past the API. Members qualify
// the names a request gives with its namespace; a Workspace's policy
// names objects of its own namespace only (normalizeNetwork).

const objectNamespaceSep = ":"

// ObjectName is the stored name of object name of namespace ns.
func ObjectName(ns, name string) string {
	if ns = api.StoredNamespace(ns); ns == "" {
		return name
	}
	return ns + objectNamespaceSep + name
}

// SplitObjectName is the namespace (stored form) and name of a stored
// object name.
func SplitObjectName(q string) (ns, name string) {
	if i := strings.Index(q, objectNamespaceSep); i >= 0 {
		return q[:i], q[i+1:]
	}
	return "", q
}

// qualifyPolicyName is the stored name of object name that a policy of a
// Workspace of namespace ns names: one given plainly is the namespace's;
// one already qualified (a stored policy) must be of the namespace.
func qualifyPolicyName(kind, ws, ns, name string) (string, error) {
	if !strings.Contains(name, objectNamespaceSep) {
		return ObjectName(ns, name), nil
	}
	if on, short := SplitObjectName(name); on != ns {
		return "", api.Errorf(api.CodeNotFound, "workspace %s: %s %s does not exist in its namespace %s: a Workspace uses its own namespace's objects", ws, kind, short, api.ShownNamespace(ns))
	}
	return name, nil
}

// scopeObjectOp holds a key's Egress and Resolver writes to its
// namespace: every such op names its object in args' "name".
func (s *keyScope) objectOp(e *Entry) error {
	if s == nil {
		return nil
	}
	switch e.Op {
	case OpEgressCreate, OpEgressUpdate, OpEgressDelete, OpResolverCreate, OpResolverDelete:
	default:
		return nil
	}
	var a struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(e.Args, &a); err != nil {
		return api.Errorf(api.CodeInvalidArgument, "%s: arguments are not valid JSON: %v", e.Op, err)
	}
	ns, short := SplitObjectName(a.Name)
	return s.permits(ns, strings.SplitN(e.Op, ".", 2)[0]+" "+short)
}

// countObjects counts the stored objects of namespace ns (stored form,
// not default) in an Egress or Resolver bucket.
func countObjects(tx *bolt.Tx, bucket []byte, ns string) int {
	prefix := []byte(ns + objectNamespaceSep)
	n := 0
	c := tx.Bucket(bucket).Cursor()
	for k, _ := c.Seek(prefix); k != nil && strings.HasPrefix(string(k), string(prefix)); k, _ = c.Next() {
		n++
	}
	return n
}

// inNamespace says whether stored object name q is of namespace ns (a
// name; nil: every namespace).
func inNamespace(q string, ns *string) bool {
	if ns == nil {
		return true
	}
	on, _ := SplitObjectName(q)
	return on == api.StoredNamespace(*ns)
}
