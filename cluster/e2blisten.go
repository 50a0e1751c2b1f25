package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/e2b"
)

// E2BConfig is [e2b]: the listener of E2B's control API on a ctrl member
// (e2b/), for the official E2B SDKs with a Kibotos API key.
type E2BConfig struct {
	// Listen is HOST:PORT; "" serves none.
	Listen string
	// CertFile and KeyFile: as [api]'s; neither: a certificate of the
	// cluster CA for the advertised and listen hosts.
	CertFile, KeyFile string
	// Domain is the sandboxes' domain the SDKs are told; "" none.
	Domain string
	// BaseTemplate is what E2B's template "base" means.
	BaseTemplate string
	// Optional: a listen address in use is a warning (kibotos dev).
	Optional bool
}

// Check says what is wrong with c, as a fix.
func (c E2BConfig) Check() error {
	if c.Listen == "" && (c.CertFile != "" || c.Domain != "") {
		return errors.New("[e2b] has no listen address: give listen, or delete the section")
	}
	if err := (APIConfig{Listen: c.Listen, CertFile: c.CertFile, KeyFile: c.KeyFile}).Check(); err != nil {
		return errors.New(strings.Replace(err.Error(), "[api]", "[e2b]", 1))
	}
	if c.Domain != "" && !sandboxDomainPattern.MatchString(c.Domain) {
		return fmt.Errorf("[e2b] domain %q: want the DNS name under which sandboxes are <port>-<sandboxID>.DOMAIN, such as e2b.example.com, with :PORT when the listener is not on 443", c.Domain)
	}
	if c.Listen != "" && c.BaseTemplate == "" {
		return errors.New("[e2b] base_template is empty: name the template E2B's \"base\" means")
	}
	return nil
}

// sandboxDomainPattern is a DNS name of two labels or more, and a port.
var sandboxDomainPattern = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(:[0-9]{1,5})?$`)

// wildcard is the name a certificate of the cluster CA gives the
// sandboxes' hosts, <port>-<sandboxID>.<domain>: *.domain without the
// port a domain may name.
func (c E2BConfig) wildcard() []string {
	if c.Domain == "" {
		return nil
	}
	host := c.Domain
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return []string{"*." + host}
}

// e2bWriteTimeout bounds an answer of the E2B listener: a create waits
// for the sandbox to run.
const e2bWriteTimeout = 5 * time.Minute

// checkE2B refuses an [e2b] this member cannot serve.
func (s *Server) checkE2B() error {
	c := s.cfg.E2B
	if err := c.Check(); err != nil {
		return err
	}
	if c.Listen != "" && !s.id.HasRole(api.RoleCtrl) {
		return fmt.Errorf("member %s is not a ctrl member: [e2b] listen is served by ctrl members only, which check API keys against the replicated state; remove [e2b] from its configuration", s.id.NodeID)
	}
	return nil
}

// startE2B serves E2B's control API when [e2b] is configured. Each
// request calls this member's API routes in process as its X-API-Key
// (e2b.Config.Client), through the API listener's own key check.
func (s *Server) startE2B() error {
	c := s.cfg.E2B
	if c.Listen == "" {
		return nil
	}
	a, err := s.serveKeys("e2b", "E2B API listener", APIConfig{Listen: c.Listen, CertFile: c.CertFile, KeyFile: c.KeyFile, Optional: c.Optional, alsoHosts: c.wildcard()}, e2bWriteTimeout,
		func(a *apiListener) http.Handler {
			routes := s.routeMux()
			sandboxes := &e2bSandboxes{s: s, limit: a.limit, routes: routes}
			s.wg.Go(func() { sandboxes.guests.run(s.stop) })
			inner := s.authenticateBearer(a, routes)
			return e2b.NewHandler(e2b.Config{BaseTemplate: c.BaseTemplate, Domain: c.Domain, Log: s.log.With("component", "e2b"),
				Sandboxes: sandboxes,
				Client: func(key, remote string) *api.Client {
					// Read-your-writes on any member: a create is read
					// back at once, from the leader.
					cl := api.NewHandlerClient(inner, key, remote)
					cl.Consistent = true
					return cl
				}})
		})
	if a != nil {
		s.e2bAPI = a
	}
	return err
}

// E2BAddr is the address the E2B API listener serves at, "" when none.
func (s *Server) E2BAddr() string {
	if s.e2bAPI == nil {
		return ""
	}
	return s.e2bAPI.addr
}
