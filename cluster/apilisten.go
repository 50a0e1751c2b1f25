package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/kibotos/kibotos/api"
)

// The API listener serves applications: the member's route table over
// HTTPS to callers with an API key (Authorization: Bearer), never a
// client certificate. Only ctrl members serve it, since keys are checked
// against the replicated state. It is off unless configured ([api] listen).

// Default per-key rate limit of the API listener ([api] rate and burst).
const (
	DefaultAPIRate  = 50
	DefaultAPIBurst = 100
	// apiKeysRemembered bounds the rate limiter's memory: buckets of this
	// many keys at most (idle ones go first).
	apiKeysRemembered = 4096
)

// APIConfig is a member's [api]: where the API listener for applications
// listens and with which certificate.
type APIConfig struct {
	// Listen is HOST:PORT; "" serves no API listener.
	Listen string
	// CertFile and KeyFile are a certificate chain and its key (PEM), e.g.
	// from a public CA; both or neither. Without them the member serves a
	// certificate of the cluster CA for its advertised and listen hosts.
	CertFile, KeyFile string
	// Rate and Burst limit each key's requests; 0: the defaults.
	Rate  float64
	Burst int
	// Optional makes a listen address in use a warning, not an error: the
	// member serves without the listener (kibotos dev's default address,
	// which another dev cluster may hold).
	Optional bool
	// alsoHosts are more names a certificate of the cluster CA answers
	// for: the E2B listener's *.domain of sandbox hosts.
	alsoHosts []string
}

// Check says what is wrong with c, as a fix.
func (c APIConfig) Check() error {
	switch {
	case (c.CertFile == "") != (c.KeyFile == ""):
		return errors.New("[api] cert_file and key_file go together: give both (a configured certificate) or neither (one of the cluster CA)")
	case c.Listen == "" && (c.CertFile != "" || c.Rate != 0 || c.Burst != 0):
		return errors.New("[api] has no listen address: give listen, or delete the section")
	case c.Rate < 0 || c.Burst < 0:
		return fmt.Errorf("[api] rate %g and burst %d: want positive numbers (default %d requests a second, bursts of %d)", c.Rate, c.Burst, DefaultAPIRate, DefaultAPIBurst)
	}
	if _, _, err := net.SplitHostPort(c.Listen); c.Listen != "" && err != nil {
		return fmt.Errorf("[api] listen %q: want HOST:PORT", c.Listen)
	}
	return nil
}

func (c APIConfig) rate() float64 { return cmp.Or(c.Rate, DefaultAPIRate) }
func (c APIConfig) burst() int    { return cmp.Or(c.Burst, DefaultAPIBurst) }

// apiListener is the running API listener.
type apiListener struct {
	srv   *http.Server
	addr  string
	limit *buckets // per API key
	// refusals: requests without a valid key, per remote address.
	refusals *refusalLimiter
}

// checkAPI refuses an [api] this member cannot serve, before it listens
// on anything.
func (s *Server) checkAPI() error {
	c := s.cfg.API
	if err := c.Check(); err != nil {
		return err
	}
	if c.Listen != "" && !s.id.HasRole(api.RoleCtrl) {
		return fmt.Errorf("member %s is not a ctrl member: [api] listen is served by ctrl members only, which check API keys against the replicated state; remove [api] from its configuration", s.id.NodeID)
	}
	return nil
}

// startAPI serves the API listener when one is configured; its server
// runs in s.wg until shutdown.
func (s *Server) startAPI() error {
	c := s.cfg.API
	if c.Listen == "" {
		return nil
	}
	a, err := s.serveKeys("api", "API listener", c, 2*time.Minute, s.apiRoutes)
	if a != nil {
		s.bearerAPI = a
	}
	return err
}

// serveKeys serves a listener of callers with API keys (configured in
// [section], called what in logs) at c.Listen, with c's certificate (or
// one of the cluster CA), each key held to [api]'s rate; handler is its
// routes. nil, nil: the address is in use and c is Optional.
func (s *Server) serveKeys(section, what string, c APIConfig, writeTimeout time.Duration, handler func(*apiListener) http.Handler) (*apiListener, error) {
	tlsConf, source, err := s.apiTLS(c)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		if c.Optional {
			s.log.Warn(what+" not started: its address is in use", "address", c.Listen, "err", err)
			return nil, nil
		}
		return nil, fmt.Errorf("[%s] listen %s: %w; choose a free address", section, c.Listen, err)
	}
	rate, burst := s.cfg.API.rate(), s.cfg.API.burst()
	a := &apiListener{addr: ln.Addr().String(), limit: newBuckets(rate, burst, apiKeysRemembered), refusals: newRefusalLimiter()}
	a.srv = &http.Server{Handler: handler(a), TLSConfig: tlsConf, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: writeTimeout, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, ErrorLog: slogStd(s.log)}
	s.wg.Go(func() { a.srv.ServeTLS(ln, "", "") })
	s.log.Info(what+" serving", "address", a.addr, "certificate", source, "rate", rate, "burst", burst)
	return a, nil
}

// APIAddr is the address the API listener serves at, "" when it does not.
func (s *Server) APIAddr() string {
	if s.bearerAPI == nil {
		return ""
	}
	return s.bearerAPI.addr
}

// shutdown lets the requests under way finish within ctx.
func (a *apiListener) shutdown(ctx context.Context) {
	if a != nil {
		a.srv.Shutdown(ctx)
	}
}

// close drops its connections at once (Kill).
func (a *apiListener) close() {
	if a != nil {
		a.srv.Close()
	}
}

// apiTLS is the API listener's TLS: no client certificate is asked (an
// application's credential is its key), and the server certificate is
// the configured one or one of the cluster CA; source says which.
func (s *Server) apiTLS(c APIConfig) (*tls.Config, string, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.NoClientCert}
	if c.CertFile != "" {
		fc, err := loadFileCert(c.CertFile, c.KeyFile, s.log)
		if err != nil {
			return nil, "", err
		}
		conf.GetCertificate = fc.get
		return conf, c.CertFile, nil
	}
	ic := &issuedCert{s: s, hosts: append(apiHosts(s.id.Advertise, c.Listen), c.alsoHosts...)}
	if _, err := ic.get(nil); err != nil {
		return nil, "", fmt.Errorf("API listener of member %s: issue its certificate: %w", s.id.NodeID, err)
	}
	conf.GetCertificate = ic.get
	return conf, "cluster CA", nil
}

// apiHosts are the hosts a cluster-issued API certificate answers for:
// the advertised one, and the listen one unless it is a wildcard.
func apiHosts(advertise, listen string) []string {
	var out []string
	for _, addr := range []string{advertise, listen} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			continue
		}
		if len(out) == 0 || out[0] != host {
			out = append(out, host)
		}
	}
	return out
}
