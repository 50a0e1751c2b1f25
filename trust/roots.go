package trust

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync/atomic"
)

// Roots are the CA certificates a member trusts: the cluster CA, or the
// old and the new one while a rotation overlaps them. The set is swapped
// whole at run time and read at every handshake, so a member starts and
// stops trusting a CA without a restart and without locking a reader.
type Roots struct {
	cur atomic.Pointer[rootSet]
}

// rootSet is one trusted set; it never changes once stored.
type rootSet struct {
	pool  *x509.CertPool
	certs []*x509.Certificate
	fps   map[string]bool
}

// NewRoots trusts certs (at least one).
func NewRoots(certs ...*x509.Certificate) (*Roots, error) {
	r := &Roots{}
	if err := r.Set(certs); err != nil {
		return nil, err
	}
	return r, nil
}

// Set replaces the trusted set with certs, at least one CA certificate.
func (r *Roots) Set(certs []*x509.Certificate) error {
	if len(certs) == 0 {
		return errors.New("trusted CAs: an empty set would refuse every peer: keep at least the cluster CA")
	}
	rs := &rootSet{pool: x509.NewCertPool(), fps: map[string]bool{}}
	for _, c := range certs {
		if !c.IsCA {
			return fmt.Errorf("trusted CAs: certificate %q is not a CA certificate", c.Subject.CommonName)
		}
		fp := Fingerprint(c)
		if rs.fps[fp] {
			continue
		}
		rs.fps[fp] = true
		rs.pool.AddCert(c)
		rs.certs = append(rs.certs, c)
	}
	r.cur.Store(rs)
	return nil
}

// Pool is the current set as a pool for chain verification.
func (r *Roots) Pool() *x509.CertPool { return r.cur.Load().pool }

// Certs are the current CA certificates, in the order they were set.
func (r *Roots) Certs() []*x509.Certificate { return r.cur.Load().certs }

// Trusts reports whether ca is in the current set.
func (r *Roots) Trusts(ca *x509.Certificate) bool { return r.cur.Load().fps[Fingerprint(ca)] }

// TrustsFingerprint reports whether the CA with fingerprint fp is trusted.
func (r *Roots) TrustsFingerprint(fp string) bool { return r.cur.Load().fps[fp] }

// Fingerprints are the current CAs' fingerprints, in order.
func (r *Roots) Fingerprints() []string {
	rs := r.cur.Load()
	out := make([]string, 0, len(rs.certs))
	for _, c := range rs.certs {
		out = append(out, Fingerprint(c))
	}
	return out
}

// TrustsChains reports whether one of the chains a handshake verified
// ends in a CA still trusted: a connection made before a CA was dropped
// carries chains to it, and stops being accepted with the CA.
func (r *Roots) TrustsChains(chains [][]*x509.Certificate) bool {
	rs := r.cur.Load()
	for _, ch := range chains {
		if len(ch) > 0 && rs.fps[Fingerprint(ch[len(ch)-1])] {
			return true
		}
	}
	return false
}

// Bundle is the current set as PEM, the form of the data directory's
// ca.crt (one certificate, or two during a rotation).
func (r *Roots) Bundle() []byte {
	var out []byte
	for _, c := range r.Certs() {
		out = append(out, pemEncode(pemCertificate, c.Raw)...)
	}
	return out
}

// ParseCertsPEM reads every certificate of a PEM bundle (at least one).
func ParseCertsPEM(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != pemCertificate {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// IssuedBy reports whether ca signed leaf.
func IssuedBy(leaf, ca *x509.Certificate) bool {
	return leaf != nil && ca != nil && leaf.CheckSignatureFrom(ca) == nil
}

// IssuerOf is the fingerprint of the CA among cas that signed leaf, ""
// when none did.
func IssuerOf(leaf *x509.Certificate, cas []*x509.Certificate) string {
	for _, ca := range cas {
		if IssuedBy(leaf, ca) {
			return Fingerprint(ca)
		}
	}
	return ""
}

// PEMOf is a certificate as PEM.
func PEMOf(c *x509.Certificate) []byte { return pemEncode(pemCertificate, c.Raw) }
