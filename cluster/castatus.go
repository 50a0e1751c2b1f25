package cluster

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/ctrl"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// The operator's side of a CA rotation: kibo ca rotate and finish, on
// the leader; kibo ca status, on the leader with ?consistent=true (the
// CLI's) or from any ctrl member's replica.

// handleCARotate begins a rotation: the leader makes the new CA for the
// cluster id and proposes it with the CA it replaces. A retry with the
// same command id gets the first answer (the CA made for it is dropped).
func (s *Server) handleCARotate(r *http.Request, req api.WriteMeta) response {
	rec, err := s.caRotation()
	if err != nil {
		return fail(err)
	}
	if rec.BegunBy(req.CommandID) {
		raw, err := json.Marshal(rec.View())
		if err != nil {
			return fail(err)
		}
		return resultResponse{value: raw, replayed: true}
	}
	next, err := trust.NewCA(s.id.ClusterID)
	if err != nil {
		return fail(api.Errorf(api.CodeInternal, "CA rotation: make the new CA: %v", err))
	}
	key, err := trust.EncodeKey(next.Key)
	if err != nil {
		return fail(err)
	}
	args := fsm.CARotateBeginArgs{OldCert: string(s.activeCA().CertPEM), NewCert: string(next.CertPEM), NewKey: string(key)}
	return s.write(r, fsm.OpCARotateBegin, req, args)
}

// handleCAFinish ends the rotation under way: refused while a member's
// certificates are not under the new CA, unless forced.
func (s *Server) handleCAFinish(r *http.Request, req api.CAFinishRequest) response {
	st, rec, err := ctrl.CARotationStatus(r.Context(), leaderCluster{s})
	if err != nil {
		return fail(err)
	}
	if !rec.UnderWay() {
		return fail(api.Errorf(api.CodeFailedPrecondition, "no CA rotation is under way: begin one with kibo ca rotate"))
	}
	_, next, err := rec.CACerts()
	if err != nil {
		return fail(err)
	}
	if pending := ctrl.OnOldCA(st); len(pending) > 0 && !req.Force && rec.Phase == fsm.CAPhaseSigning {
		return fail(api.Errorf(api.CodeFailedPrecondition, "CA rotation: members %s are not all on the new CA yet (kibo ca status): wait for them, or finish with --force and join them again", strings.Join(pending, ", ")))
	}
	return s.write(r, fsm.OpCARotateFinish, req.WriteMeta, fsm.CARotateFinishArgs{Fingerprint: trust.Fingerprint(next), Force: req.Force})
}

// handleCAStatus is kibo ca status.
func (s *Server) handleCAStatus(r *http.Request) response {
	st, _, err := ctrl.CARotationStatus(r.Context(), leaderCluster{s})
	if err != nil {
		return fail(err)
	}
	return answer(st)
}

// MemberTrust asks member n its side of a rotation (this member answers
// itself).
func (c leaderCluster) MemberTrust(ctx context.Context, n *api.Node) (api.MemberTrust, error) {
	s := c.s
	if n.NodeID == s.id.NodeID {
		return s.memberTrust(), nil
	}
	if n.Address == "" {
		return api.MemberTrust{}, api.Errorf(api.CodeUnavailable, "node %s has no address registered", n.NodeID)
	}
	tr := s.client.HTTPTransport(trust.Want{Kind: trust.KindMember, NodeID: n.NodeID}, time.Second)
	defer tr.CloseIdleConnections()
	var out api.MemberTrust
	err := memberRequest(ctx, &http.Client{Transport: tr}, http.MethodGet, n.Address, "/v1/internal/trust/status", nil, &out)
	return out, err
}

// ClusterCA is the cluster CA this member holds.
func (c leaderCluster) ClusterCA() *x509.Certificate { return c.s.activeCA().Cert }
