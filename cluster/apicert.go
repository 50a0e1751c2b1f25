package cluster

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kibotos/kibotos/trust"
)

// The API listener's server certificate comes from one of two sources,
// both read at each handshake through tls.Config.GetCertificate so that
// a new certificate is served without a restart.

// issuedCert is a certificate of the cluster CA for the API listener,
// issued by this ctrl member itself (it holds the CA key) with a key
// that never leaves its memory. It is issued again at half-life and as
// soon as another CA signs (a rotation's signing phase), as the member
// certificate is.
type issuedCert struct {
	s     *Server
	hosts []string

	mu  sync.Mutex
	cur *tls.Certificate
	by  *trust.CA // the CA that issued cur
}

func (ic *issuedCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	ca := ic.s.signingCA()
	if ic.cur != nil && ic.by == ca && !trust.DueForRenewal(ic.cur.Leaf, time.Now()) {
		return ic.cur, nil
	}
	c, err := ic.issue(ca)
	if err != nil {
		if ic.cur != nil {
			// The one before is valid for half its life yet.
			ic.s.log.Warn("API listener certificate not renewed; serving the one before", "err", err, "not_after", ic.cur.Leaf.NotAfter)
			return ic.cur, nil
		}
		return nil, err
	}
	ic.cur, ic.by = c, ca
	return c, nil
}

func (ic *issuedCert) issue(ca *trust.CA) (*tls.Certificate, error) {
	s := ic.s
	member, err := trust.FromCert(s.certs.Member().Leaf)
	if err != nil {
		return nil, err
	}
	id := trust.Identity{ClusterID: member.ClusterID, Kind: trust.KindAPIServer, NodeID: member.NodeID, Admitted: member.Admitted}
	c, err := ca.IssueTLS(id, ic.hosts, s.lifetime(trust.APIServerLifetime))
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// fileCertCheck is how often the configured files are looked at for a
// new certificate (an ACME client replaces them every few weeks).
const fileCertCheck = 10 * time.Second

// fileCert is the configured certificate ([api] cert_file, key_file),
// read again when either file changes. A pair that does not load (the
// certificate replaced, the key not yet) keeps the one before served
// until it does.
type fileCert struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   string // size and modification time of both files when cur was read
	checked time.Time
}

func loadFileCert(certFile, keyFile string, log *slog.Logger) (*fileCert, error) {
	f := &fileCert{certFile: certFile, keyFile: keyFile, log: log}
	stamp, err := f.stampNow()
	if err == nil {
		f.cur, err = f.load()
	}
	if err != nil {
		return nil, fmt.Errorf("[api] cert_file %s and key_file %s: %w; give a PEM certificate chain and its key", certFile, keyFile, err)
	}
	f.stamp, f.checked = stamp, time.Now()
	return f, nil
}

func (f *fileCert) load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

func (f *fileCert) stampNow() (string, error) {
	var stamp string
	for _, p := range []string{f.certFile, f.keyFile} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		stamp += fmt.Sprintf("%d@%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

func (f *fileCert) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.checked) < fileCertCheck {
		return f.cur, nil
	}
	f.checked = time.Now()
	stamp, err := f.stampNow()
	if err != nil || stamp == f.stamp {
		if err != nil {
			f.log.Warn("API listener certificate files unreadable; serving the certificate read before", "cert_file", f.certFile, "err", err)
		}
		return f.cur, nil
	}
	c, err := f.load()
	if err != nil {
		f.log.Warn("API listener certificate files changed but do not load; serving the certificate read before", "cert_file", f.certFile, "err", err)
		return f.cur, nil
	}
	f.cur, f.stamp = c, stamp
	f.log.Info("API listener certificate reloaded", "cert_file", f.certFile, "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return c, nil
}
