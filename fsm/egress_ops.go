package fsm

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/kibotos/kibotos/api"
)

func applyEgressCreate(ac *applyCtx) (any, error) {
	var a EgressCreateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressCreate(a); err != nil {
		return nil, err
	}
	socks5, _ := normalizeSOCKS5(a.Name, a.SOCKS5)
	if old, err := getRecord[egressRecord](ac.tx, bucketEgress, []byte(a.Name)); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "egress %s already exists (revision %d): change it with kibo egress update %s, or choose another name", a.Name, old.Revision, a.Name)
	}
	if countAtMost(ac.tx, bucketEgress, api.MaxEgressObjects) >= api.MaxEgressObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "egress %s: the cluster keeps at most %d Egress objects: delete unused ones with kibo egress delete NAME", a.Name, api.MaxEgressObjects)
	}
	r := &egressRecord{Name: a.Name, Revision: 1, SOCKS5: socks5, Username: a.Username, PasswordSet: a.Password != "",
		CreatedAt: *at(ac.e), UpdatedAt: *at(ac.e), Version: 1}
	if err := putRevision(ac.tx, r, &egressRevision{Revision: 1, SOCKS5: socks5, Username: a.Username, Password: a.Password, CreatedAt: *at(ac.e)}); err != nil {
		return nil, err
	}
	return egressView(ac.tx, r), nil
}

// applyEgressUpdate makes a new revision. It moves no Workspace: each
// keeps the revision its policy records until a set-network naming the
// Egress or its next start. An update that changes nothing is no new
// revision.
func applyEgressUpdate(ac *applyCtx) (any, error) {
	var a EgressUpdateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckEgressUpdate(a); err != nil {
		return nil, err
	}
	r, err := mustEgress(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	cur, err := getRevision(ac.tx, r.Name, r.Revision)
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
		return egressView(ac.tx, r), nil
	}
	next.Revision, next.CreatedAt = r.Revision+1, *at(ac.e)
	old := r.Revision
	r.Revision, r.SOCKS5, r.Username, r.PasswordSet = next.Revision, next.SOCKS5, next.Username, next.Password != ""
	r.UpdatedAt = *at(ac.e)
	r.Version++
	if err := putRevision(ac.tx, r, &next); err != nil {
		return nil, err
	}
	if err := dropUnusedRevision(ac.tx, r.Name, old); err != nil {
		return nil, err
	}
	return egressView(ac.tx, r), nil
}

func applyEgressDelete(ac *applyCtx) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	r, err := mustEgress(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, r.Version, "egress "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindEgress, r.Name, usersOf(ac.tx, bucketEgressRefs, r.Name), egressUsersFix); err != nil {
		return nil, err
	}
	out := egressView(ac.tx, r)
	var drop [][]byte
	prefix := []byte(r.Name + "\x00")
	c := ac.tx.Bucket(bucketEgressRevisions).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		drop = append(drop, append([]byte(nil), k...))
	}
	for _, k := range drop {
		if err := ac.tx.Bucket(bucketEgressRevisions).Delete(k); err != nil {
			return nil, err
		}
	}
	if err := ac.tx.Bucket(bucketEgress).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}

func applyResolverCreate(ac *applyCtx) (any, error) {
	var a ResolverCreateArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := ValidObjectName(kindResolver, a.Name); err != nil {
		return nil, err
	}
	ups, err := normalizeUpstreams(a.Name, a.Upstreams)
	if err != nil {
		return nil, err
	}
	if old, err := getRecord[resolverRecord](ac.tx, bucketResolvers, []byte(a.Name)); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "resolver %s already exists (upstreams %s): delete it first, or choose another name", a.Name, strings.Join(old.Upstreams, ","))
	}
	if countAtMost(ac.tx, bucketResolvers, api.MaxResolverObjects) >= api.MaxResolverObjects {
		return nil, api.Errorf(api.CodeResourceExhausted, "resolver %s: the cluster keeps at most %d Resolver objects: delete unused ones with kibo resolver delete NAME", a.Name, api.MaxResolverObjects)
	}
	r := &resolverRecord{Name: a.Name, Upstreams: ups, CreatedAt: *at(ac.e), Version: 1}
	if err := putJSON(ac.tx, bucketResolvers, []byte(r.Name), r); err != nil {
		return nil, err
	}
	return resolverView(ac.tx, r), nil
}

func applyResolverDelete(ac *applyCtx) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	r, err := mustResolver(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, r.Version, "resolver "+r.Name); err != nil {
		return nil, err
	}
	if err := inUse(kindResolver, r.Name, usersOf(ac.tx, bucketResolverRefs, r.Name), resolverUsersFix); err != nil {
		return nil, err
	}
	out := resolverView(ac.tx, r)
	if err := ac.tx.Bucket(bucketResolvers).Delete([]byte(r.Name)); err != nil {
		return nil, err
	}
	return out, nil
}
