package fsm

import (
	"bytes"
	"errors"
	"fmt"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// GetEgress returns one Egress (never its password), or not_found.
func GetEgress(tx *bolt.Tx, name string) (*api.Egress, error) {
	r, err := mustEgress(tx, name)
	if err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

// ListEgress returns up to pageSize (0: all) Egress objects by name,
// starting after pageToken.
func ListEgress(tx *bolt.Tx, ns *string, pageSize int, pageToken string) (*api.EgressList, error) {
	out := &api.EgressList{Egress: []api.Egress{}}
	err := pageOf(tx, bucketEgress, pageSize, pageToken, func(k, v []byte) error {
		if !inNamespace(string(k), ns) {
			return errSkip
		}
		var r egressRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketEgress, k, err)
		}
		out.Egress = append(out.Egress, *egressView(tx, &r))
		return nil
	}, &out.NextPageToken)
	return out, err
}

// GetResolver returns one Resolver, or not_found.
func GetResolver(tx *bolt.Tx, name string) (*api.Resolver, error) {
	r, err := mustResolver(tx, name)
	if err != nil {
		return nil, err
	}
	return resolverView(tx, r), nil
}

// ListResolvers returns up to pageSize (0: all) Resolvers by name,
// starting after pageToken.
func ListResolvers(tx *bolt.Tx, ns *string, pageSize int, pageToken string) (*api.ResolverList, error) {
	out := &api.ResolverList{Resolvers: []api.Resolver{}}
	err := pageOf(tx, bucketResolvers, pageSize, pageToken, func(k, v []byte) error {
		if !inNamespace(string(k), ns) {
			return errSkip
		}
		var r resolverRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("state record %s/%s is corrupt: %w", bucketResolvers, k, err)
		}
		out.Resolvers = append(out.Resolvers, *resolverView(tx, &r))
		return nil
	}, &out.NextPageToken)
	return out, err
}

// errSkip, returned by pageOf's fn, leaves the key out of the page.
var errSkip = errors.New("skip")

// pageOf calls fn for up to pageSize keys of bucket after pageToken and
// sets next to the last key when more remain; a key fn skips (errSkip)
// does not count.
func pageOf(tx *bolt.Tx, bucket []byte, pageSize int, pageToken string, fn func(k, v []byte) error, next *string) error {
	c := tx.Bucket(bucket).Cursor()
	var k, v []byte
	if pageToken == "" {
		k, v = c.First()
	} else if k, v = c.Seek([]byte(pageToken)); k != nil && string(k) == pageToken {
		k, v = c.Next()
	}
	var last []byte
	for n := 0; k != nil; k, v = c.Next() {
		if pageSize > 0 && n == pageSize {
			*next = string(last)
			return nil
		}
		if err := fn(k, v); errors.Is(err, errSkip) {
			continue
		} else if err != nil {
			return err
		}
		last = append(last[:0], k...)
		n++
	}
	return nil
}

// TaskNetwork is what a node needs of the objects policy p names: the
// Egress at the revision p records (without credentials) and the
// Resolver's upstreams. Either is nil when p names none.
func TaskNetwork(tx *bolt.Tx, p *api.NetworkPolicy) (*api.TaskEgress, *api.TaskResolver, error) {
	var te *api.TaskEgress
	var tr *api.TaskResolver
	if p == nil {
		return nil, nil, nil
	}
	if usesEgressObject(p) {
		rev, err := getRevision(tx, p.Egress, p.EgressRevision)
		if err != nil {
			return nil, nil, err
		}
		if rev == nil {
			return nil, nil, api.Errorf(api.CodeInternal, "egress %s revision %d is not kept although a policy uses it", p.Egress, p.EgressRevision)
		}
		te = &api.TaskEgress{Name: p.Egress, Revision: rev.Revision, SOCKS5: rev.SOCKS5, Credentials: rev.Username != ""}
	}
	if p.Resolver != "" {
		r, err := getRecord[resolverRecord](tx, bucketResolvers, []byte(p.Resolver))
		if err != nil {
			return nil, nil, err
		}
		if r == nil {
			return nil, nil, api.Errorf(api.CodeInternal, "resolver %s does not exist although a policy uses it", p.Resolver)
		}
		tr = &api.TaskResolver{Name: r.Name, Upstreams: append([]string(nil), r.Upstreams...)}
	}
	return te, tr, nil
}

// EgressCredentials returns revision rev of Egress name with its
// credentials for node, which must run (or be about to run, or be
// changing to) a Workspace whose policy uses exactly that revision.
func EgressCredentials(tx *bolt.Tx, node, name string, rev uint64) (*api.EgressCredentials, error) {
	if err := ValidObjectName(kindEgress, name); err != nil {
		return nil, err
	}
	r, err := getRevision(tx, name, rev)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, api.Errorf(api.CodeNotFound, "egress %s has no revision %d: it was deleted or no Workspace uses that revision any more", name, rev)
	}
	prefix := append(revisionKey(name, rev), 0)
	c := tx.Bucket(bucketEgressRefs).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		w, err := getWorkspace(tx, string(k[len(prefix):]))
		if err != nil {
			return nil, err
		}
		if w != nil && usesOn(w, node, egressRef{name, rev}) {
			return &api.EgressCredentials{Name: name, Revision: r.Revision, SOCKS5: r.SOCKS5, Username: r.Username, Password: r.Password}, nil
		}
	}
	return nil, api.Errorf(api.CodePermissionDenied,
		"node %s runs no Workspace whose network policy uses egress %s revision %d: credentials go only to the node of such a Workspace", node, name, rev)
}

// usesOn: w's execution on node has a policy using ref, or a change
// pending on node asks for one.
func usesOn(w *api.Workspace, node string, ref egressRef) bool {
	uses := func(p *api.NetworkPolicy) bool {
		return usesEgressObject(p) && p.Egress == ref.name && p.EgressRevision == ref.rev
	}
	if w.NodeID == node && w.InstanceID != "" && uses(w.Network) {
		return true
	}
	return w.Pending != nil && w.Pending.NodeID == node && uses(w.Pending.Network)
}
