package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// CA rotation on a member. Ctrl members follow the rotation record of
// their replica (fsm/ca.go): from its begin they keep the new CA in
// tls/ca-next.{crt,key} and trust both; from its signing phase they sign
// with the new CA; its finish makes the new pair tls/ca.{crt,key} and the
// only CA trusted. Every member, node-only ones too, asks ctrl for the
// trusted set every TrustPoll, writes it to tls/ca.crt and renews its
// certificates at once when the CA that signs now did not issue them.

// caState is the member's CAs: the cluster CA whose key it holds (ctrl)
// or whose certificate it has, the one that signs now and the one ctrl
// says signs (what its own certificates must be issued by).
type caState struct {
	// mu serializes the changes of files and sets (syncCA, installTrust).
	mu sync.Mutex
	// renewMu: one renewal at a time (renewLoop and trustLoop).
	renewMu sync.Mutex
	active  atomic.Pointer[trust.CA]
	signer  atomic.Pointer[trust.CA]
	// next is the CA a rotation under way moves to (ctrl members, from
	// its begin to its finish): the nodes' data planes accept credentials
	// signed with the key derived from it too.
	next atomic.Pointer[trust.CA]
	// signing is the certificate of the CA that signs now, as this
	// member knows it: its own signer on ctrl, ctrl's word elsewhere.
	signing atomic.Pointer[x509.Certificate]
	phase   atomic.Value // string
	// synced is the record (phase and new CA) and own CA syncCA last
	// brought the member in step with (mu): every applied batch wakes
	// it, and only a change touches keys and files.
	synced string
}

func (c *caState) init(ca *trust.CA) {
	c.active.Store(ca)
	c.signer.Store(ca)
	c.signing.Store(ca.Cert)
	c.phase.Store("")
}

// signingCA is the CA this ctrl member signs with now.
func (s *Server) signingCA() *trust.CA { return s.rot.signer.Load() }

// activeCA is the cluster CA of tls/ca.crt and tls/ca.key; enrollment
// grant secrets derive from its key until a rotation finishes.
func (s *Server) activeCA() *trust.CA { return s.rot.active.Load() }

// SigningCA is the certificate of the CA that signs now, as this member
// knows it: a certificate another CA issued is to be replaced (the node's
// data-plane certificate, by its link).
func (s *Server) SigningCA() *x509.Certificate { return s.rot.signing.Load() }

// holdsCAKey reports whether this member signs (ctrl members).
func (s *Server) holdsCAKey() bool { return s.activeCA().Key != nil }

// trustedBundle is the CAs trusted now as PEM, the cluster CA first.
func (s *Server) trustedBundle() string { return string(s.roots.Bundle()) }

// watchCA keeps a ctrl member's CA files, trusted set and signer in step
// with its replica's rotation record, until the member stops.
func (s *Server) watchCA() {
	for {
		changed := s.changed.next() // before the sync: no change is missed
		if err := s.syncCA(); err != nil {
			s.log.Warn("CA rotation: this member's CA files are not in step with the state; retrying at the next change", "err", err)
		}
		select {
		case <-s.stop:
			return
		case <-changed:
		}
	}
}

// syncCA applies the rotation record to this ctrl member. It acts only
// while the member's own CA is the record's old one (or already its new
// one, to finish what a crash interrupted): a replay of an earlier
// rotation at start never undoes a later one.
func (s *Server) syncCA() error {
	rec, err := s.caRotation()
	if err != nil || rec == nil {
		return err
	}
	s.rot.mu.Lock()
	defer s.rot.mu.Unlock()
	active := s.activeCA()
	fp := trust.Fingerprint(active.Cert)
	at := rec.Phase + "\x00" + rec.NewCert + "\x00" + fp
	if at == s.rot.synced {
		return nil
	}
	old, next, err := rec.CACerts()
	if err != nil {
		return fmt.Errorf("rotation record: %w", err)
	}
	onOld, onNew := old != nil && fp == trust.Fingerprint(old), fp == trust.Fingerprint(next)
	if !onOld && !onNew {
		s.rot.synced = at
		return nil // a record of an earlier rotation, replayed
	}
	key, err := trust.ParseKeyPEM([]byte(rec.NewKey))
	if err != nil {
		return fmt.Errorf("rotation record: new CA key: %w", err)
	}
	nextCA := &trust.CA{Cert: next, CertPEM: []byte(rec.NewCert), Key: key}
	d := s.cfg.DataDir
	switch {
	case rec.UnderWay() && onOld:
		if err := writeIfChanged(d.CANextCert(), []byte(rec.NewCert)); err != nil {
			return err
		}
		if err := writeIfChanged(d.CANextKey(), []byte(rec.NewKey)); err != nil {
			return err
		}
		if err := s.trustCAs([]*x509.Certificate{active.Cert, next}); err != nil {
			return err
		}
		if cur := s.rot.next.Load(); cur == nil || trust.Fingerprint(cur.Cert) != trust.Fingerprint(next) {
			// Stored before the sessions end: a welcome sent from here
			// on has the new CA's credential key (the leader holds the
			// sessions; elsewhere this closes nothing).
			s.rot.next.Store(nextCA)
			s.log.Info("CA rotation under way: control sessions end so the nodes' data planes get the new CA's credential key too", "fingerprint", trust.Fingerprint(next))
			s.sessions.closeAll()
		}
		nextCA = s.rot.next.Load()
		signer := active
		if rec.Phase == fsm.CAPhaseSigning {
			signer = nextCA
		}
		s.setSigner(signer, rec.Phase)
	case !rec.UnderWay() && onOld:
		// ca.key first: until ca.crt is rewritten it still holds the new
		// certificate too, and LoadCA picks the one of the key.
		if err := datadir.WriteFileAtomic(d.CAKey(), []byte(rec.NewKey), 0o600); err != nil {
			return err
		}
		if err := datadir.WriteFileAtomic(d.CACert(), []byte(rec.NewCert), 0o600); err != nil {
			return err
		}
		s.rot.active.Store(nextCA)
		s.rot.next.Store(nil)
		// The data-plane credential key derives from the cluster CA key:
		// the nodes' data planes accept the new one since the begin, and
		// the welcome of their next session drops the old one (the
		// leader holds the sessions; elsewhere this closes nothing).
		s.log.Info("CA rotation finished: control sessions end so the nodes' data planes get the new credential key", "fingerprint", trust.Fingerprint(next))
		s.sessions.closeAll()
		fallthrough
	case !rec.UnderWay() && onNew:
		s.rot.next.Store(nil)
		if err := s.trustCAs([]*x509.Certificate{next}); err != nil {
			return err
		}
		s.setSigner(s.activeCA(), "")
		for _, p := range []string{d.CANextCert(), d.CANextKey()} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	s.rot.synced = at
	return nil
}

// caRotation is the rotation record of this member's replica.
func (s *Server) caRotation() (*fsm.CARotation, error) {
	var rec *fsm.CARotation
	err := s.fsm.View(func(tx *bolt.Tx) error {
		var err error
		rec, err = fsm.GetCARotation(tx)
		return err
	})
	return rec, err
}

// setSigner makes ca the signer (rot.mu held). Every applied batch syncs:
// only a change of CA or phase replaces it and is logged.
func (s *Server) setSigner(ca *trust.CA, phase string) {
	fp := trust.Fingerprint(ca.Cert)
	if trust.Fingerprint(s.rot.signer.Load().Cert) == fp && s.rot.phase.Load() == phase {
		return
	}
	s.rot.signer.Store(ca)
	s.rot.signing.Store(ca.Cert)
	s.rot.phase.Store(phase)
	s.log.Info("CA rotation: signing CA", "fingerprint", fp, "phase", phase)
}

// trustCAs installs the trusted set (rot.mu held): Roots, tls/ca.crt,
// and when a CA was dropped, the end of the watched connections (Raft,
// control sessions) whose peer was verified only against it.
func (s *Server) trustCAs(cas []*x509.Certificate) error {
	before := s.roots.Fingerprints()
	var want []string
	for _, c := range cas {
		want = append(want, trust.Fingerprint(c))
	}
	if slices.Equal(before, want) {
		return nil // node-only members ask every TrustPoll: mostly nothing changed
	}
	if err := s.roots.Set(cas); err != nil {
		return err
	}
	if err := writeIfChanged(s.cfg.DataDir.CACert(), s.roots.Bundle()); err != nil {
		return err
	}
	dropped := false
	for _, fp := range before {
		dropped = dropped || !s.roots.TrustsFingerprint(fp)
	}
	s.log.Info("CA rotation: trusted CAs changed", "trusted", s.roots.Fingerprints())
	s.resetMemberConns()
	if dropped {
		s.closeUntrustedConns()
	}
	return nil
}

// closeUntrustedConns ends the watched connections verified against a CA
// no longer trusted; their peers reconnect with certificates of the CA
// trusted now (or cannot, when they missed the rotation).
func (s *Server) closeUntrustedConns() {
	s.conns.mu.Lock()
	var stale []net.Conn
	for c := range s.conns.conns {
		wc, ok := c.(*watchedConn)
		if !ok {
			continue
		}
		tc, ok := wc.Conn.(*tls.Conn)
		if ok && !s.roots.TrustsChains(tc.ConnectionState().VerifiedChains) {
			stale = append(stale, c)
		}
	}
	s.conns.mu.Unlock()
	for _, c := range stale {
		s.log.Warn("connection verified against a CA no longer trusted closed", "peer", c.(*watchedConn).id.Name(), "remote", c.RemoteAddr().String())
		c.Close()
	}
}

// writeIfChanged writes data to path (0600, atomically) unless it holds it.
func writeIfChanged(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	return datadir.WriteFileAtomic(path, data, 0o600)
}

// trustLoop keeps the member's trusted set and certificates in step with
// ctrl: every TrustPoll a node-only member asks a ctrl member what to
// trust, and any member whose certificates the signing CA did not issue
// renews them at once.
func (s *Server) trustLoop() {
	t := time.NewTicker(s.cfg.Timings.TrustPoll)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.life, time.Minute)
		if err := s.followTrust(ctx); err != nil {
			s.log.Warn("CA rotation: could not follow ctrl's trusted CAs; retrying", "err", err)
		}
		cancel()
	}
}

func (s *Server) followTrust(ctx context.Context) error {
	if s.fsm == nil {
		var ts api.TrustSet
		if err := s.callCtrl(ctx, "/v1/internal/trust", []byte("{}"), &ts); err != nil {
			return err
		}
		if err := s.installTrust(ts); err != nil {
			return err
		}
	}
	signing := s.rot.signing.Load()
	// A member without the ctrl or operator role holds no admin certificate.
	admin := s.certs.Admin()
	if trust.IssuedBy(s.certs.Member().Leaf, signing) && (admin == nil || trust.IssuedBy(admin.Leaf, signing)) {
		return nil
	}
	return s.RenewCertificates(ctx)
}

// installTrust takes ctrl's trusted set on a node-only member.
func (s *Server) installTrust(ts api.TrustSet) error {
	var cas []*x509.Certificate
	var signing *x509.Certificate
	for _, p := range ts.CAs {
		c, err := trust.ParseCertPEM([]byte(p))
		if err != nil {
			return fmt.Errorf("trusted CAs from ctrl: %w", err)
		}
		cas = append(cas, c)
		if trust.Fingerprint(c) == ts.Signing {
			signing = c
		}
	}
	if signing == nil {
		return fmt.Errorf("trusted CAs from ctrl: the signing CA %s is not among them", ts.Signing)
	}
	s.rot.mu.Lock()
	defer s.rot.mu.Unlock()
	if err := s.trustCAs(cas); err != nil {
		return err
	}
	if s.rot.signing.Swap(signing) != signing {
		s.rot.phase.Store(ts.Phase)
	}
	return nil
}

// handleTrust tells a member what to trust (ctrl members, from their
// replica as they follow it).
func (s *Server) handleTrust(*http.Request) response {
	ts := api.TrustSet{Signing: trust.Fingerprint(s.signingCA().Cert), Phase: s.rot.phase.Load().(string)}
	for _, c := range s.roots.Certs() {
		ts.CAs = append(ts.CAs, string(trust.PEMOf(c)))
	}
	return answer(ts)
}

// memberTrust is this member's side of a rotation.
func (s *Server) memberTrust() api.MemberTrust {
	cas := s.roots.Certs()
	if sc := s.rot.signing.Load(); !s.roots.Trusts(sc) {
		cas = append(cas, sc)
	}
	mt := api.MemberTrust{NodeID: s.id.NodeID, Trusts: s.roots.Fingerprints(), Member: trust.IssuerOf(s.certs.Member().Leaf, cas)}
	if admin := s.certs.Admin(); admin != nil { // ctrl and operator members only
		// Empty only for a member that holds none.
		if mt.Admin = trust.IssuerOf(admin.Leaf, cas); mt.Admin == "" {
			mt.Admin = "unknown"
		}
	}
	if dp := s.own().DataPlaneCert; dp != nil {
		mt.DataPlane = trust.IssuerOf(dp(), cas)
	}
	return mt
}

// handleTrustStatus answers this member's side of a rotation (ctrl asks
// it for kibo ca status and to move the rotation on).
func (s *Server) handleTrustStatus(*http.Request) response { return answer(s.memberTrust()) }

// caRoutes are the CA rotation's routes.
func (s *Server) caRoutes() []route {
	return []route{
		{"POST", "/v1/internal/trust", members, atCtrl, s.handleTrust},
		{"GET", "/v1/internal/trust/status", fromCtrl("a CA rotation's progress is read through ctrl (kibo ca status)"), atLocal, s.handleTrustStatus},
		{"POST", "/v1/ca/rotate", operators, atLeader, decoded(s.handleCARotate)},
		{"POST", "/v1/ca/finish", operators, atLeader, decoded(s.handleCAFinish)},
		{"GET", "/v1/ca/status", operators, atReader, s.handleCAStatus},
	}
}
