package fsm

import (
	"bytes"
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func applyEgressCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a EgressCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressCreate(a); err != nil {
		return nil, err
	}
	socks5, _ := normalizeSOCKS5(a.Name, a.SOCKS5)
	if old, err := getEgress(tx, a.Name); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "egress %s already exists (revision %d): change it with kibo egress update %s, or choose another name", a.Name, old.Revision, a.Name)
	}
	if countAtMost(tx, bucketEgress, api.MaxEgressObjects) >= api.MaxEgressObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "egress %s: the cluster keeps at most %d Egress objects: delete unused ones with kibo egress delete NAME", a.Name, api.MaxEgressObjects)
	}
	r := &egressRecord{Name: a.Name, Revision: 1, SOCKS5: socks5, Username: a.Username, PasswordSet: a.Password != "",
		CreatedAt: *at(e), UpdatedAt: *at(e), Version: 1}
	if err := putRevision(tx, r, &egressRevision{Revision: 1, SOCKS5: socks5, Username: a.Username, Password: a.Password, CreatedAt: *at(e)}); err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

// applyEgressUpdate makes a new revision. It moves no Workspace: each
// keeps the revision its policy records until a set-network naming the
// Egress or its next start. An update that changes nothing is no new
// revision.
func applyEgressUpdate(tx *bolt.Tx, e *Entry) (any, error) {
	var a EgressUpdateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressUpdate(a); err != nil {
		return nil, err
	}
	r, err := mustEgress(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	cur, err := getRevision(tx, r.Name, r.Revision)
	if err != nil {
		return nil, err
	}
	if cur == nil {
		return nil, fmt.Errorf("egress %s: its latest revision %d is missing", r.Name, r.Revision)
	}
	next := *cur
	if a.SOCKS5 != nil {
		next.SOCKS5, _ = normalizeSOCKS5(a.Name, *a.SOCKS5)
	}
	if a.ClearCredentials {
		next.Username, next.Password = "", ""
	}
	if a.Username != nil {
		next.Username = *a.Username
	}
	if a.Password != nil {
		next.Password = *a.Password
	}
	if err := validCredentials(a.Name, next.Username, next.Password); err != nil {
		return nil, err
	}
	if next.SOCKS5 == cur.SOCKS5 && next.Username == cur.Username && next.Password == cur.Password {
		return egressView(tx, r), nil
	}
	next.Revision, next.CreatedAt = r.Revision+1, *at(e)
	old := r.Revision
	r.Revision, r.SOCKS5, r.Username, r.PasswordSet = next.Revision, next.SOCKS5, next.Username, next.Password != ""
	r.UpdatedAt = *at(e)
	r.Version++
	if err := putRevision(tx, r, &next); err != nil {
		return nil, err
	}
	if err := dropUnusedRevision(tx, r.Name, old); err != nil {
		return nil, err
	}
	return egressView(tx, r), nil
}

func applyEgressDelete(tx *bolt.Tx, e *Entry) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	r, err := mustEgress(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindEgress, r.Name, usersOf(tx, bucketEgressRefs, r.Name), egressUsersFix); err != nil {
		return nil, err
	}
	out := egressView(tx, r)
	var drop [][]byte
	prefix := []byte(r.Name + "\x00")
	c := tx.Bucket(bucketEgressRevisions).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		drop = append(drop, append([]byte(nil), k...))
	}
	for _, k := range drop {
		if err := tx.Bucket(bucketEgressRevisions).Delete(k); err != nil {
			return nil, err
		}
	}
	if err := tx.Bucket(bucketEgress).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}

func applyResolverCreate(tx *bolt.Tx, e *Entry) (any, error) {
	var a ResolverCreateArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if err := ValidObjectName(kindResolver, a.Name); err != nil {
		return nil, err
	}
	ups, err := normalizeUpstreams(a.Name, a.Upstreams)
	if err != nil {
		return nil, err
	}
	if old, err := getResolver(tx, a.Name); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "resolver %s already exists (upstreams %s): delete it first, or choose another name", a.Name, strings.Join(old.Upstreams, ","))
	}
	if countAtMost(tx, bucketResolvers, api.MaxResolverObjects) >= api.MaxResolverObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "resolver %s: the cluster keeps at most %d Resolver objects: delete unused ones with kibo resolver delete NAME", a.Name, api.MaxResolverObjects)
	}
	r := &resolverRecord{Name: a.Name, Upstreams: ups, CreatedAt: *at(e), Version: 1}
	if err := putJSON(tx, bucketResolvers, []byte(r.Name), r); err != nil {
		return nil, err
	}
	return resolverView(tx, r), nil
}

func applyResolverDelete(tx *bolt.Tx, e *Entry) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	r, err := mustResolver(tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, r.Version, "resolver "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindResolver, r.Name, usersOf(tx, bucketResolverRefs, r.Name), resolverUsersFix); err != nil {
		return nil, err
	}
	out := resolverView(tx, r)
	if err := tx.Bucket(bucketResolvers).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}
