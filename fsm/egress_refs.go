package fsm

import (
	"bytes"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

type egressRef struct {
	name string
	rev  uint64
}

// policiesOf are w's policy in force and the one a pending change asks for.
func policiesOf(w *api.Workspace) []*api.NetworkPolicy {
	if w == nil {
		return nil
	}
	var out []*api.NetworkPolicy
	if w.Network != nil {
		out = append(out, w.Network)
	}
	if w.Pending != nil && w.Pending.Network != nil {
		out = append(out, w.Pending.Network)
	}
	return out
}

func usesEgressObject(p *api.NetworkPolicy) bool {
	return p != nil && p.Egress != "" && p.Egress != api.EgressNone && p.Egress != api.EgressPublic
}

func egressRefsOf(w *api.Workspace) []egressRef {
	var out []egressRef
	for _, p := range policiesOf(w) {
		if r := (egressRef{p.Egress, p.EgressRevision}); usesEgressObject(p) && !containsRef(out, r) {
			out = append(out, r)
		}
	}
	return out
}

func containsRef(list []egressRef, r egressRef) bool {
	for _, x := range list {
		if x == r {
			return true
		}
	}
	return false
}

func resolverRefsOf(w *api.Workspace) []string {
	var out []string
	for _, p := range policiesOf(w) {
		if p.Resolver != "" && !containsString(out, p.Resolver) {
			out = append(out, p.Resolver)
		}
	}
	return out
}

// moveRefs replaces old's references to Egress revisions and Resolvers by
// w's (either may be nil) and drops the revisions nothing uses any more.
func moveRefs(tx *bolt.Tx, old, w *api.Workspace) error {
	var id string
	for _, x := range []*api.Workspace{old, w} {
		if x != nil {
			id = x.WorkspaceID
		}
	}
	oldE, newE := egressRefsOf(old), egressRefsOf(w)
	oldR, newR := resolverRefsOf(old), resolverRefsOf(w)
	eb, rb := tx.Bucket(bucketEgressRefs), tx.Bucket(bucketResolverRefs)
	for _, r := range oldE {
		if !containsRef(newE, r) {
			if err := eb.Delete(egressRefKey(r.name, r.rev, id)); err != nil {
				return err
			}
		}
	}
	for _, r := range newE {
		if !containsRef(oldE, r) {
			if err := eb.Put(egressRefKey(r.name, r.rev, id), nil); err != nil {
				return err
			}
		}
	}
	for _, n := range oldR {
		if !containsString(newR, n) {
			if err := rb.Delete(resolverRefKey(n, id)); err != nil {
				return err
			}
		}
	}
	for _, n := range newR {
		if !containsString(oldR, n) {
			if err := rb.Put(resolverRefKey(n, id), nil); err != nil {
				return err
			}
		}
	}
	for _, r := range oldE {
		if !containsRef(newE, r) {
			if err := dropUnusedRevision(tx, r.name, r.rev); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropUnusedRevision deletes revision rev of Egress name unless it is the
// latest or a Workspace still references it.
func dropUnusedRevision(tx *bolt.Tx, name string, rev uint64) error {
	r, err := getRecord[egressRecord](tx, bucketEgress, []byte(name))
	if err != nil {
		return err
	}
	if r != nil && r.Revision == rev {
		return nil
	}
	prefix := append(revisionKey(name, rev), 0)
	if k, _ := tx.Bucket(bucketEgressRefs).Cursor().Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
		return nil
	}
	return tx.Bucket(bucketEgressRevisions).Delete(revisionKey(name, rev))
}
