package trust

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync/atomic"
	"time"
)

// DueForRenewal reports whether a certificate is past half its lifetime.
// Renewing at half-life leaves the other half to retry through a ctrl
// outage before the certificate stops working.
func DueForRenewal(c *x509.Certificate, now time.Time) bool {
	return now.After(c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2))
}

// Store holds a member's current certificates, its member (server and
// client) one and, on ctrl and operator members only, its host's operator
// one. Renewal swaps them while connections keep
// being made with whatever is current, so readers never lock.
type Store struct {
	member atomic.Pointer[tls.Certificate]
	admin  atomic.Pointer[tls.Certificate]
}

// NewStore holds member and admin, whose leaves are parsed here when the
// loader did not (tls.LoadX509KeyPair does, tls.X509KeyPair may not). An
// empty admin (no chain, no leaf) is none: the member holds no operator
// certificate.
func NewStore(member, admin tls.Certificate) (*Store, error) {
	s := &Store{}
	if err := s.Set(member, admin); err != nil {
		return nil, err
	}
	return s, nil
}

// Set replaces both certificates at once, after parsing their leaves.
func (s *Store) Set(member, admin tls.Certificate) error {
	none := admin.Leaf == nil && len(admin.Certificate) == 0
	for _, c := range []*tls.Certificate{&member, &admin} {
		if c == &admin && none {
			continue
		}
		if c.Leaf != nil {
			continue
		}
		if len(c.Certificate) == 0 {
			return fmt.Errorf("certificate store: a certificate without a chain: load it with its key file")
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			return err
		}
		c.Leaf = leaf
	}
	s.member.Store(&member)
	if none {
		s.admin.Store(nil)
	} else {
		s.admin.Store(&admin)
	}
	return nil
}

// Member is the current member certificate; its Leaf is set. It has the
// shape of Client.Cert and tls.Config.GetCertificate's source.
func (s *Store) Member() *tls.Certificate { return s.member.Load() }

// Admin is the current operator certificate (nil on a member that holds
// none); its Leaf is set.
func (s *Store) Admin() *tls.Certificate { return s.admin.Load() }
