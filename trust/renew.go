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
// client) and operator ones. Renewal swaps them while connections keep
// being made with whatever is current, so readers never lock.
type Store struct {
	member atomic.Pointer[tls.Certificate]
	admin  atomic.Pointer[tls.Certificate]
}

// NewStore holds member and admin, whose leaves are parsed here when the
// loader did not (tls.LoadX509KeyPair does, tls.X509KeyPair may not).
func NewStore(member, admin tls.Certificate) (*Store, error) {
	s := &Store{}
	if err := s.Set(member, admin); err != nil {
		return nil, err
	}
	return s, nil
}

// Set replaces both certificates at once, after parsing their leaves.
func (s *Store) Set(member, admin tls.Certificate) error {
	for _, c := range []*tls.Certificate{&member, &admin} {
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
	s.admin.Store(&admin)
	return nil
}

// Member is the current member certificate; its Leaf is set. It has the
// shape of Client.Cert and tls.Config.GetCertificate's source.
func (s *Store) Member() *tls.Certificate { return s.member.Load() }

// Admin is the current operator certificate; its Leaf is set.
func (s *Store) Admin() *tls.Certificate { return s.admin.Load() }
