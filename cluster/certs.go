package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

// holdsOperatorCert says whether a member with roles holds its host's
// operator certificate (tls/admin.*): ctrl members, which hold the CA key
// anyway, and members admitted with the operator role. Every other host
// holds none, so that taking it over gives no power over the cluster.
func holdsOperatorCert(roles []string) bool {
	return contains(roles, api.RoleCtrl) || contains(roles, api.RoleOperator)
}

// readCerts reads the member's member and operator certificates from its
// data directory; admin is empty where the directory holds none.
func readCerts(d datadir.Dir) (member, admin tls.Certificate, err error) {
	if member, err = d.MemberCertificate(); err != nil {
		return member, admin, err
	}
	if !d.HasAdminCertificate() {
		return member, tls.Certificate{}, nil
	}
	admin, err = d.AdminCertificate()
	return member, admin, err
}

// loadCerts is the certificate store of the member whose data directory is d.
func loadCerts(d datadir.Dir) (*trust.Store, error) {
	m, a, err := readCerts(d)
	if err != nil {
		return nil, err
	}
	cs, err := trust.NewStore(m, a)
	if err != nil {
		return nil, fmt.Errorf("certificates in %s: %w", d, err)
	}
	return cs, nil
}

// renewLoop renews the member's certificates at half-life and checks twice
// an hour (a member that was down past half-life renews at start).
func (s *Server) renewLoop() {
	for {
		admin := s.certs.Admin()
		if trust.DueForRenewal(s.certs.Member().Leaf, time.Now()) || (admin != nil && trust.DueForRenewal(admin.Leaf, time.Now())) {
			ctx, cancel := context.WithTimeout(s.life, time.Minute)
			err := s.RenewCertificates(ctx)
			cancel()
			if err != nil {
				s.log.Warn("certificate renewal failed; retrying", "err", err, "not_after", s.certs.Member().Leaf.NotAfter)
			}
		}
		select {
		case <-s.stop:
			return
		case <-time.After(s.cfg.Timings.RenewCheck):
		}
	}
}

// RenewCertificates gets fresh member and, where the member holds one,
// operator certificates for this member's keys, writes them to the data
// directory and serves them at once. A ctrl member signs them itself
// after checking its own admission; a node-only member asks a ctrl member
// over its authenticated channel.
func (s *Server) RenewCertificates(ctx context.Context) error {
	d := s.cfg.DataDir
	var adminKey *ecdsa.PublicKey
	// A leftover one of a node-only member (member.Run removes it at
	// start) is not renewed: asking for it would be refused.
	if s.certs.Admin() != nil && holdsOperatorCert(s.id.Roles) {
		var err error
		if adminKey, err = trust.ReadPublicKeyOf(d.AdminKey()); err != nil {
			return err
		}
	}
	s.rot.renewMu.Lock()
	defer s.rot.renewMu.Unlock()
	var out api.RenewResponse
	var err error
	if s.holdsCAKey() {
		out, err = s.renewFor(s.certs.Member().Leaf, adminKey)
	} else {
		var req api.RenewRequest
		if adminKey != nil {
			req.AdminKey = trust.PublicKeyPEM(adminKey)
		}
		body, _ := json.Marshal(req)
		err = s.callCtrl(ctx, "/v1/internal/certs/renew", body, &out)
	}
	if err != nil {
		return fmt.Errorf("renew the certificates of member %s: %w", s.id.NodeID, err)
	}
	if adminKey != nil && out.AdminCert == "" {
		return fmt.Errorf("renew the certificates of member %s: ctrl renewed no operator certificate for %s; retry", s.id.NodeID, d.AdminCert())
	}
	if err := datadir.WriteFileAtomic(d.MemberCert(), []byte(out.MemberCert), 0o600); err != nil {
		return err
	}
	if adminKey != nil {
		if err := datadir.WriteFileAtomic(d.AdminCert(), []byte(out.AdminCert), 0o600); err != nil {
			return err
		}
	}
	m, a, err := readCerts(d)
	if err != nil {
		return err
	}
	if err := s.certs.Set(m, a); err != nil {
		return fmt.Errorf("certificates in %s: %w", d, err)
	}
	s.resetMemberConns()
	s.log.Info("certificates renewed", "not_after", s.certs.Member().Leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// renewFor issues the renewal of a member certificate (same key, same
// addresses, roles and admission as the node's registration now says) and
// an operator certificate for adminKey (nil: none). Only admitted nodes
// get one, and an operator certificate only a member whose roles hold
// one (holdsOperatorCert; its roles are checked against the state).
func (s *Server) renewFor(old *x509.Certificate, adminKey *ecdsa.PublicKey) (api.RenewResponse, error) {
	id, err := trust.FromCert(old)
	if err != nil {
		return api.RenewResponse{}, api.Errorf(api.CodeUnauthenticated, "%v", err)
	}
	if err := s.admitted(id); err != nil {
		return api.RenewResponse{}, err
	}
	pub, ok := old.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return api.RenewResponse{}, api.Errorf(api.CodeInvalidArgument, "member certificate of %s has no ECDSA key", id.NodeID)
	}
	if adminKey != nil && !holdsOperatorCert(id.Roles) {
		// Only a build from before issue 44 asks this. The whole renewal
		// is refused, not just this part: such a build would write the
		// missing certificate as an empty file and not start again.
		return api.RenewResponse{}, api.Errorf(api.CodePermissionDenied, "member %s (%s) may not hold an operator certificate: upgrade it to this release, which renews its member certificate alone", id.NodeID, strings.Join(id.Roles, ","))
	}
	ca := s.signingCA()
	member, err := ca.Issue(id, trust.Hosts(old), pub, s.lifetime(trust.MemberLifetime))
	if err != nil {
		return api.RenewResponse{}, err
	}
	if adminKey == nil {
		return api.RenewResponse{MemberCert: string(member) + string(ca.CertPEM)}, nil
	}
	admin := id
	admin.Kind, admin.Roles = trust.KindAdmin, nil
	adminCert, err := ca.Issue(admin, nil, adminKey, s.lifetime(trust.AdminLifetime))
	if err != nil {
		return api.RenewResponse{}, err
	}
	return api.RenewResponse{MemberCert: string(member) + string(ca.CertPEM), AdminCert: string(adminCert)}, nil
}

// lifetime is the production lifetime unless the timings shorten it (tests).
func (s *Server) lifetime(def time.Duration) time.Duration {
	if l := s.cfg.Timings.CertLifetime; l > 0 {
		return l
	}
	return def
}

// handleRenew renews the calling member's certificates (ctrl members only;
// a member renews only its own).
func (s *Server) handleRenew(r *http.Request, req api.RenewRequest) response {
	var adminKey *ecdsa.PublicKey
	if req.AdminKey != "" {
		var err error
		if adminKey, err = trust.ParsePublicKeyPEM(req.AdminKey); err != nil {
			return fail(api.Errorf(api.CodeInvalidArgument, "renewal for %s: admin_public_key is not an ECDSA PEM key: %v", callerOf(r).name, err))
		}
	}
	out, err := s.renewFor(r.TLS.PeerCertificates[0], adminKey)
	if err != nil {
		return fail(err)
	}
	return answer(out)
}

// dnsName is what a certificate's DNS SAN may hold (RFC 1123 labels).
var dnsName = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)

// handleDataPlaneCert signs the server certificate of the calling node's
// data-plane process: the node's id, kind dataplane, 24 h.
func (s *Server) handleDataPlaneCert(r *http.Request, req api.DataPlaneCertRequest) response {
	c := callerOf(r) // a node member (nodeMembers)
	pub, err := trust.ParsePublicKeyPEM(req.PublicKey)
	if err != nil {
		return fail(api.Errorf(api.CodeInvalidArgument, "data-plane certificate for node %s: public_key is not an ECDSA PEM key: %v", c.id.NodeID, err))
	}
	if len(req.Hosts) > 16 {
		return fail(api.Errorf(api.CodeInvalidArgument, "data-plane certificate for node %s: %d hosts; give at most 16", c.id.NodeID, len(req.Hosts)))
	}
	for _, h := range req.Hosts {
		if net.ParseIP(h) == nil && !dnsName.MatchString(h) {
			return fail(api.Errorf(api.CodeInvalidArgument, "data-plane certificate for node %s: host %q is neither an IP address nor a DNS name", c.id.NodeID, h))
		}
	}
	out, err := s.issueDataPlane(c.id, pub, req.Hosts)
	if err != nil {
		return fail(err)
	}
	return answer(out)
}

func (s *Server) issueDataPlane(member trust.Identity, pub *ecdsa.PublicKey, hosts []string) (api.DataPlaneCertResponse, error) {
	id := trust.Identity{ClusterID: member.ClusterID, Kind: trust.KindDataPlane, NodeID: member.NodeID, Admitted: member.Admitted}
	lifetime := s.lifetime(trust.DataPlaneLifetime)
	ca := s.signingCA()
	cert, err := ca.Issue(id, hosts, pub, lifetime)
	if err != nil {
		return api.DataPlaneCertResponse{}, err
	}
	return api.DataPlaneCertResponse{Cert: string(cert) + string(ca.CertPEM), NotAfter: time.Now().Add(lifetime).UTC()}, nil
}

// DataPlaneCertificate gets a server certificate for this node's data-plane
// key: signed here on a ctrl member, by a ctrl member otherwise.
func (s *Server) DataPlaneCertificate(ctx context.Context, pub *ecdsa.PublicKey, hosts []string) (api.DataPlaneCertResponse, error) {
	if s.holdsCAKey() {
		id, err := trust.FromCert(s.certs.Member().Leaf)
		if err != nil {
			return api.DataPlaneCertResponse{}, err
		}
		if err := s.admitted(id); err != nil {
			return api.DataPlaneCertResponse{}, err
		}
		return s.issueDataPlane(id, pub, hosts)
	}
	body, _ := json.Marshal(api.DataPlaneCertRequest{PublicKey: trust.PublicKeyPEM(pub), Hosts: hosts})
	var out api.DataPlaneCertResponse
	return out, s.callCtrl(ctx, "/v1/internal/certs/dataplane", body, &out)
}

// callCtrl posts an internal call to the first ctrl member that answers.
func (s *Server) callCtrl(ctx context.Context, path string, body []byte, out any) error {
	var lastErr error = api.Errorf(api.CodeUnavailable, "no ctrl member is known to member %s", s.id.NodeID)
	for _, addr := range s.ctrlAddrs() {
		if addr == s.id.Advertise {
			continue
		}
		lastErr = memberCall(ctx, s.memberClient(), addr, path, body, out)
		if lastErr == nil || api.CodeOf(lastErr) != api.CodeUnavailable {
			return lastErr
		}
	}
	return lastErr
}
