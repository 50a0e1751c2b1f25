package ctrl

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// CA rotation, the leader's part: in phase trusting, once every admitted
// member says it trusts the new CA, the leader moves the rotation to
// signing. It never finishes a rotation by itself: dropping the old CA
// cuts off every member still on it, which is the operator's call
// (kibo ca finish).

// CATrust is how the leader learns the members' side of a rotation.
type CATrust interface {
	// MemberTrust asks member n (this member included) what it trusts
	// and which CAs issued its certificates.
	MemberTrust(ctx context.Context, n *api.Node) (api.MemberTrust, error)
	// ClusterCA is the CA this member holds as the cluster's.
	ClusterCA() *x509.Certificate
}

// CAView is what a rotation's status is computed from.
type CAView interface {
	View(fn func(tx *bolt.Tx) error) error
	CATrust
}

// memberTrustTimeout bounds each member's answer to a status: a member
// that is down shows as unreachable instead of holding the status up.
const memberTrustTimeout = 2 * time.Second

// CARotationStatus is kibo ca status and the record it was computed
// from (nil when no rotation ever began).
func CARotationStatus(ctx context.Context, c CAView) (api.CAStatus, *fsm.CARotation, error) {
	var rec *fsm.CARotation
	var nodes []api.Node
	var operators []api.Operator
	err := c.View(func(tx *bolt.Tx) error {
		var err error
		if rec, err = fsm.GetCARotation(tx); err != nil {
			return err
		}
		if operators, err = fsm.ListOperators(tx, time.Now()); err != nil {
			return err
		}
		l, err := fsm.ListNodes(tx, 0, "")
		if err != nil {
			return err
		}
		for _, n := range l.Nodes {
			if n.Admission == api.Admitted && !n.Retired {
				nodes = append(nodes, n)
			}
		}
		return nil
	})
	if err != nil {
		return api.CAStatus{}, nil, err
	}
	st := api.CAStatus{Members: make([]api.CAMemberStatus, len(nodes))}
	target := c.ClusterCA()
	if rec.UnderWay() {
		old, next, err := rec.CACerts()
		if err != nil {
			return api.CAStatus{}, nil, err
		}
		st.Phase, st.StartedBy = rec.Phase, rec.StartedBy
		started := rec.StartedAt
		st.StartedAt = &started
		oldState, nextState := api.CAActive, api.CANext
		if rec.Phase == fsm.CAPhaseSigning {
			oldState, nextState = api.CAOld, api.CAActive
		}
		st.CAs = []api.CAInfo{caInfo(old, oldState), caInfo(next, nextState)}
		target = next
		st.Personal = onOldCA(operators, rec)
	} else if target != nil {
		st.CAs = []api.CAInfo{caInfo(target, api.CAActive)}
	}
	if target == nil {
		return st, rec, nil
	}
	fp := trust.Fingerprint(target)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, memberTrustTimeout)
			defer cancel()
			row := api.CAMemberStatus{NodeID: n.NodeID, TrustsNew: api.TrustUnreachable, MemberCert: "-", DataPlane: "-"}
			mt, err := c.MemberTrust(ctx, &n)
			if err != nil {
				row.Error = err.Error()
				st.Members[i] = row
				return
			}
			row.TrustsNew = api.TrustNo
			if slices.Contains(mt.Trusts, fp) {
				row.TrustsNew = api.TrustYes
			}
			// A member without the ctrl or operator role holds no admin
			// certificate.
			row.MemberCert = newOrOld(mt.Member == fp && (mt.Admin == fp || mt.Admin == ""))
			if mt.DataPlane != "" {
				row.DataPlane = newOrOld(mt.DataPlane == fp)
			}
			st.Members[i] = row
		})
	}
	wg.Wait()
	return st, rec, nil
}

// onOldCA are the active operator credentials of persons issued before
// the rotation's signing phase, so by the old CA: no member renews them,
// and the finish ends them.
func onOldCA(operators []api.Operator, rec *fsm.CARotation) []string {
	var out []string
	for _, o := range operators {
		if o.State == api.OperatorActive && (rec.Phase != fsm.CAPhaseSigning || o.IssuedAt.Before(rec.SigningAt)) {
			out = append(out, "operator:"+o.Name)
		}
	}
	return out
}

func newOrOld(isNew bool) string {
	if isNew {
		return api.CertNew
	}
	return api.CertOld
}

func caInfo(c *x509.Certificate, state string) api.CAInfo {
	return api.CAInfo{Fingerprint: trust.Fingerprint(c), State: state, NotAfter: c.NotAfter.UTC()}
}

// OnOldCA are the members of a status whose certificates the new CA did
// not issue yet (or that did not answer): a finish would cut them off.
func OnOldCA(st api.CAStatus) []string {
	var out []string
	for _, m := range st.Members {
		if m.MemberCert != api.CertNew || m.DataPlane == api.CertOld {
			out = append(out, m.NodeID)
		}
	}
	return out
}

// driveCARotation moves a rotation from trusting to signing once every
// admitted member trusts the new CA, until the lead ends.
func (l *Leader) driveCARotation(ctx context.Context) {
	tick := time.NewTicker(l.t.SessionPing)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var rec *fsm.CARotation
		if err := l.c.View(func(tx *bolt.Tx) error {
			var err error
			rec, err = fsm.GetCARotation(tx)
			return err
		}); err != nil || rec == nil || rec.Phase != fsm.CAPhaseTrusting {
			continue // the fan-out only while it can move the rotation on
		}
		st, rec, err := CARotationStatus(ctx, l.c)
		if err != nil || rec == nil || rec.Phase != fsm.CAPhaseTrusting {
			continue
		}
		ready := true
		for _, m := range st.Members {
			ready = ready && m.TrustsNew == api.TrustYes
		}
		if !ready {
			continue
		}
		_, next, err := rec.CACerts()
		if err != nil {
			continue
		}
		res, err := l.c.ApplyOp(ctx, fsm.OpCARotateSign, fsm.CARotateSignArgs{Fingerprint: trust.Fingerprint(next)})
		if err == nil {
			err = res.Err()
		}
		if err != nil {
			l.log.Warn("CA rotation: could not move to signing with the new CA; retrying", "err", err)
			continue
		}
		l.log.Info("CA rotation: every member trusts the new CA; ctrl signs with it now", "fingerprint", trust.Fingerprint(next))
	}
}
