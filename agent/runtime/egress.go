package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/agent/dnsfilter"
	"github.com/kibotos/kibotos/agent/egress"
	"github.com/kibotos/kibotos/netpol"
)

// Where the node's egress process listens (agent/egress): the transparent
// listener proxied guests' TCP is TPROXYed to, and the DNS socket Resolver
// guests' DNS is DNATed to, on the node's service address.
const (
	EgressTCPPort = 7473
	EgressDNSPort = 5300
)

// EgressDNS is the DNS socket of the egress process.
var EgressDNS = netip.AddrPortFrom(netpol.ServiceAddr, EgressDNSPort)

// EgressRouter keeps the node's egress process running with the routes of
// the Instances whose policy names an Egress or a Resolver (and none when
// no policy does): egress.Supervisor.
type EgressRouter interface {
	Apply(ctx context.Context, cfg egress.Config) error
}

// egressCounter is an EgressRouter that also sums the egress process's
// counters over its generations (egress.Supervisor does).
type egressCounter interface {
	Totals(ctx context.Context) egress.Stats
}

// EgressTotals are the egress process's counters summed over its
// generations; ok is false when this node runs no egress process.
func (rt *Runtime) EgressTotals(ctx context.Context) (egress.Stats, bool) {
	c, ok := rt.cfg.Egress.(egressCounter)
	if !ok {
		return egress.Stats{}, false
	}
	return c.Totals(ctx), true
}

// NamesStats are the counters of the node's resolver for domain rules;
// ok is false when it does not run.
func (rt *Runtime) NamesStats() (dnsfilter.Stats, bool) {
	if rt.net == nil || rt.net.names == nil {
		return dnsfilter.Stats{}, false
	}
	return rt.net.names.Stats(), true
}

// EgressProxy is the Egress revision a policy names: the SOCKS5 server
// every guest TCP connection goes through. Its credentials are never in a
// launch record: they are in the node's credential files.
type EgressProxy struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	SOCKS5   string `json:"socks5"`
	// Credentials: the revision has a username and password, which
	// StoreEgressCredentials put on this node before the start.
	Credentials bool `json:"credentials,omitempty"`
}

// ResolverRoute is the Resolver a policy names.
type ResolverRoute struct {
	Name      string   `json:"name"`
	Upstreams []string `json:"upstreams"`
}

// EgressProxyMode is NetworkPolicy.Egress of a policy naming an Egress.
const EgressProxyMode = netpol.EgressProxy

var egressNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// credentialsDir holds one file per Egress revision a policy on this node
// uses (dir 0700, files 0600): what the node restores egress from after a
// restart, without ctrl.
func (rt *Runtime) credentialsDir() string {
	return filepath.Join(rt.cfg.StorageRoot, "state", "egress-credentials")
}

func (rt *Runtime) credentialsFile(name string, rev uint64) string {
	return filepath.Join(rt.credentialsDir(), name+"-"+strconv.FormatUint(rev, 10)+".json")
}

// EgressCredentials are what a credential file holds.
type EgressCredentials struct {
	Name     string `json:"name"`
	Revision uint64 `json:"revision"`
	SOCKS5   string `json:"socks5"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// StoreEgressCredentials keeps the credentials of one Egress revision
// (fetched from ctrl by the node with its own identity) for the Instances
// that will use it.
func (rt *Runtime) StoreEgressCredentials(c EgressCredentials) error {
	if !egressNameRE.MatchString(c.Name) || c.Revision == 0 || len(c.Username) > 255 || len(c.Password) > 255 {
		return fmt.Errorf("runtime: egress credentials of %q revision %d: not a valid Egress revision", c.Name, c.Revision)
	}
	if err := os.MkdirAll(rt.credentialsDir(), 0o700); err != nil {
		return fmt.Errorf("runtime: egress credentials: %w", err)
	}
	if err := os.Chmod(rt.credentialsDir(), 0o700); err != nil {
		return fmt.Errorf("runtime: egress credentials: %w", err)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(rt.credentialsFile(c.Name, c.Revision), b); err != nil { // 0600
		return fmt.Errorf("runtime: egress credentials of %s revision %d: %w", c.Name, c.Revision, err)
	}
	return nil
}

func (rt *Runtime) loadEgressCredentials(name string, rev uint64) (EgressCredentials, error) {
	var c EgressCredentials
	path := rt.credentialsFile(name, rev)
	f, err := os.Open(path)
	if err != nil {
		return c, fmt.Errorf("egress %s revision %d: no credentials on this node (%v)", name, rev, err)
	}
	defer f.Close()
	dec := json.NewDecoder(&limitedReader{r: f, n: 4096})
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || c.Name != name || c.Revision != rev {
		return c, fmt.Errorf("egress %s revision %d: credential file %s is not readable (%v): the node fetches it again at the next start", name, rev, path, err)
	}
	return c, nil
}

// limitedReader fails instead of truncating, so an oversized file is an
// error, not half a record.
type limitedReader struct {
	r interface{ Read([]byte) (int, error) }
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("file too large")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// usesEgressProcess says whether a policy needs the egress process.
func usesEgressProcess(p NetworkPolicy) bool { return p.Proxy != nil || p.Resolver != nil }

// checkEgressPolicy refuses a policy this node cannot carry out.
func (rt *Runtime) checkEgressPolicy(id string, p NetworkPolicy) error {
	if p.Egress == EgressProxyMode && p.Proxy == nil {
		return fmt.Errorf("runtime: instance %s: egress through an Egress without its address and revision", id)
	}
	if !usesEgressProcess(p) {
		return nil
	}
	if rt.cfg.Egress == nil {
		why := "no service manager for it"
		if rt.cfg.EgressUnavailable != nil {
			why = rt.cfg.EgressUnavailable.Error()
		}
		return fmt.Errorf("runtime: instance %s: its policy needs the egress process, which this node cannot run: %s", id, why)
	}
	if p.Proxy != nil && p.Proxy.Credentials {
		if _, err := rt.loadEgressCredentials(p.Proxy.Name, p.Proxy.Revision); err != nil {
			return fmt.Errorf("runtime: instance %s: %w", id, err)
		}
	}
	return nil
}

// egressInstance is an Instance the egress process routes.
type egressInstance struct {
	id  string
	rec *LaunchRecord
}

// egressInstances are the running or starting Instances whose policy
// needs the egress process.
func (rt *Runtime) egressInstances() []egressInstance {
	var out []egressInstance
	for _, in := range rt.all() {
		in.mu.Lock()
		rec, state := in.rec, in.state
		in.mu.Unlock()
		if rec == nil || rec.Network == nil || (state != StateRunning && state != StateStarting) || !usesEgressProcess(rec.Network.Policy) {
			continue
		}
		out = append(out, egressInstance{in.id, rec})
	}
	return out
}

// egressGuestCounter is an EgressRouter that also counts connections by
// guest (egress.Supervisor does).
type egressGuestCounter interface {
	GuestTotals(ctx context.Context) map[netip.Addr]egress.GuestStats
}

// EgressByInstance are the egress process's connection counters of each
// Instance it routes, by Instance id: an Instance that ended is not in
// it; ok is false when this node runs no egress process.
func (rt *Runtime) EgressByInstance(ctx context.Context) (map[string]egress.GuestStats, bool) {
	c, ok := rt.cfg.Egress.(egressGuestCounter)
	if !ok {
		return nil, false
	}
	byGuest := c.GuestTotals(ctx)
	out := map[string]egress.GuestStats{}
	for _, in := range rt.egressInstances() {
		if st, ok := byGuest[in.rec.Network.Guest]; ok {
			out[in.id] = st
		}
	}
	return out, true
}

// syncEgress gives the egress process the routes of every running or
// starting Instance that needs it, puts the node's table (which TPROXYs
// proxied guests) in step, and removes credential files no Instance uses.
// Callers hold no instance lock.
func (rt *Runtime) syncEgress(ctx context.Context) error {
	if rt.net.cfg == nil {
		return nil
	}
	rt.net.egressMu.Lock()
	defer rt.net.egressMu.Unlock()
	var routes []egress.Route
	var proxied []netip.Addr
	keep := map[string]bool{}
	var errs []error
	for _, in := range rt.egressInstances() {
		rec, p := in.rec, in.rec.Network.Policy
		r := egress.Route{Guest: rec.Network.Guest}
		if x := p.Proxy; x != nil {
			proxied = append(proxied, rec.Network.Guest)
			px := &egress.Proxy{Name: x.Name, Revision: x.Revision, Address: x.SOCKS5}
			if x.Credentials {
				keep[filepath.Base(rt.credentialsFile(x.Name, x.Revision))] = true
				c, err := rt.loadEgressCredentials(x.Name, x.Revision)
				if err != nil {
					// Without them the proxy refuses the guest: never a
					// direct connection instead.
					errs = append(errs, fmt.Errorf("instance %s: %w", in.id, err))
				}
				px.Username, px.Password = c.Username, c.Password
			}
			r.Egress = px
		}
		if x := p.Resolver; x != nil {
			r.Resolver = &egress.Resolver{Name: x.Name, Upstreams: slices.Clone(x.Upstreams)}
		}
		routes = append(routes, r)
	}
	slices.SortFunc(routes, func(a, b egress.Route) int { return a.Guest.Compare(b.Guest) })
	slices.SortFunc(proxied, func(a, b netip.Addr) int { return a.Compare(b) })
	var deployment []string
	for _, r := range rt.net.cfg.Resolvers {
		deployment = append(deployment, r.String())
	}
	if rt.cfg.Egress != nil {
		if err := rt.cfg.Egress.Apply(ctx, egress.Config{Routes: routes, Resolvers: deployment}); err != nil {
			errs = append(errs, fmt.Errorf("runtime: egress process: %w", err))
		}
	}
	if err := rt.net.replaceHostTable(ctx, proxied); err != nil {
		errs = append(errs, err)
	}
	entries, _ := os.ReadDir(rt.credentialsDir())
	for _, e := range entries {
		if !keep[e.Name()] && strings.HasSuffix(e.Name(), ".json") {
			if err := os.Remove(filepath.Join(rt.credentialsDir(), e.Name())); err == nil {
				rt.log.Info("egress credentials no Instance uses removed", "file", e.Name())
			}
		}
	}
	return errors.Join(errs...)
}

// HasEgressCredentials says whether this node holds the credentials of an
// Egress revision.
func (rt *Runtime) HasEgressCredentials(name string, rev uint64) bool {
	_, err := rt.loadEgressCredentials(name, rev)
	return err == nil
}
