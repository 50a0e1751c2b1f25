package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Bounds of a Config beyond MaxFrame: what one list may hold.
const (
	maxUpstreams = 8
	maxResolvers = 8
	maxNameLen   = 253
)

// endpoint is a HOST:PORT whose host may still need resolving.
type endpoint struct {
	host string     // a hostname when addr is not valid
	addr netip.Addr // the host when it is an IP address
	port uint16
}

func (e endpoint) String() string {
	if e.addr.IsValid() {
		return netip.AddrPortFrom(e.addr, e.port).String()
	}
	return net.JoinHostPort(e.host, strconv.Itoa(int(e.port)))
}

// proxyRoute and resolverRoute are a checked Proxy and Resolver.
type proxyRoute struct {
	name               string
	revision           uint64
	server             endpoint
	username, password string
	warm               *warmPool // set by the server; nil: none
}

// key tells proxy routes apart: guests naming the same Egress revision
// share one, and so one warm pool, also across Config pushes.
func (p *proxyRoute) key() string {
	return fmt.Sprintf("%s\x00%d\x00%s\x00%s\x00%s", p.name, p.revision, p.server, p.username, p.password)
}

type resolverRoute struct {
	name      string
	upstreams []endpoint
}

// route is one guest's checked Route.
type route struct {
	proxy    *proxyRoute
	resolver *resolverRoute
	count    *guestCount // set by the server (guests.go)
}

// table is a checked Config. It is never changed once built: a new Config
// makes a new table, swapped in atomically.
type table struct {
	routes    map[netip.Addr]route
	resolvers []netip.AddrPort
	proxies   map[string]*proxyRoute // by key
}

var emptyTable = &table{routes: map[netip.Addr]route{}}

// compile checks c and builds its table; the error names the first bad
// entry.
func compile(c Config) (*table, error) {
	t := &table{routes: make(map[netip.Addr]route, len(c.Routes)), proxies: map[string]*proxyRoute{}}
	if len(c.Resolvers) > maxResolvers {
		return nil, fmt.Errorf("egress: config: %d deployment resolvers, at most %d", len(c.Resolvers), maxResolvers)
	}
	for _, r := range c.Resolvers {
		ep, err := parseEndpoint(r, 53)
		if err != nil || !ep.addr.IsValid() {
			return nil, fmt.Errorf("egress: config: deployment resolver %q: want IP or IP:PORT", r)
		}
		t.resolvers = append(t.resolvers, netip.AddrPortFrom(ep.addr, ep.port))
	}
	for _, r := range c.Routes {
		if !r.Guest.Is4() || r.Guest.IsUnspecified() {
			return nil, fmt.Errorf("egress: config: route guest %q: want a guest IPv4 address", r.Guest)
		}
		if _, dup := t.routes[r.Guest]; dup {
			return nil, fmt.Errorf("egress: config: guest %s has two routes: send one per guest", r.Guest)
		}
		if r.Egress == nil && r.Resolver == nil {
			return nil, fmt.Errorf("egress: config: route of guest %s has neither egress nor resolver", r.Guest)
		}
		var rt route
		if r.Egress != nil {
			p, err := checkProxy(*r.Egress)
			if err != nil {
				return nil, fmt.Errorf("egress: config: guest %s: %w", r.Guest, err)
			}
			if same, ok := t.proxies[p.key()]; ok {
				p = same
			}
			t.proxies[p.key()] = p
			rt.proxy = p
		}
		if r.Resolver != nil {
			res, err := checkResolver(*r.Resolver)
			if err != nil {
				return nil, fmt.Errorf("egress: config: guest %s: %w", r.Guest, err)
			}
			rt.resolver = res
		}
		t.routes[r.Guest] = rt
	}
	if len(t.resolvers) == 0 && needsLookup(t) {
		return nil, errors.New("egress: config: a proxy or upstream is a hostname but there are no deployment resolvers to resolve it with")
	}
	return t, nil
}

func needsLookup(t *table) bool {
	for _, r := range t.routes {
		if r.proxy != nil && !r.proxy.server.addr.IsValid() {
			return true
		}
		if r.resolver != nil {
			for _, u := range r.resolver.upstreams {
				if !u.addr.IsValid() {
					return true
				}
			}
		}
	}
	return false
}

func checkProxy(p Proxy) (*proxyRoute, error) {
	if p.Name == "" {
		return nil, errors.New("egress without a name")
	}
	ep, err := parseEndpoint(p.Address, 0)
	if err != nil {
		return nil, fmt.Errorf("egress %s: address %q: %v", p.Name, p.Address, err)
	}
	// RFC 1929 carries each in one length byte, and an empty username is
	// not a credential.
	if len(p.Username) > 255 || len(p.Password) > 255 {
		return nil, fmt.Errorf("egress %s: username and password are at most 255 bytes each (RFC 1929)", p.Name)
	}
	if p.Username == "" && p.Password != "" {
		return nil, fmt.Errorf("egress %s: a password without a username", p.Name)
	}
	return &proxyRoute{name: p.Name, revision: p.Revision, server: ep, username: p.Username, password: p.Password}, nil
}

func checkResolver(r Resolver) (*resolverRoute, error) {
	if r.Name == "" {
		return nil, errors.New("resolver without a name")
	}
	if len(r.Upstreams) == 0 || len(r.Upstreams) > maxUpstreams {
		return nil, fmt.Errorf("resolver %s: %d upstreams, want 1 to %d", r.Name, len(r.Upstreams), maxUpstreams)
	}
	out := &resolverRoute{name: r.Name}
	for _, u := range r.Upstreams {
		ep, err := parseEndpoint(u, 53)
		if err != nil {
			return nil, fmt.Errorf("resolver %s: upstream %q: %v", r.Name, u, err)
		}
		out.upstreams = append(out.upstreams, ep)
	}
	return out, nil
}

// parseEndpoint reads IP, IP:PORT, [IPv6]:PORT, HOST:PORT; a missing port
// is defPort, or an error when defPort is 0.
func parseEndpoint(s string, defPort uint16) (endpoint, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return endpoint{}, errors.New("port 0")
		}
		return endpoint{addr: ap.Addr().Unmap(), port: ap.Port()}, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if defPort == 0 {
			return endpoint{}, errors.New("want HOST:PORT")
		}
		return endpoint{addr: a.Unmap(), port: defPort}, nil
	}
	host, port := s, defPort
	if h, p, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return endpoint{}, fmt.Errorf("port %q", p)
		}
		host, port = h, uint16(n)
	} else if defPort == 0 {
		return endpoint{}, errors.New("want HOST:PORT")
	}
	if len(host) > maxNameLen {
		return endpoint{}, fmt.Errorf("hostname longer than %d", maxNameLen)
	}
	if !validHostname(host) {
		return endpoint{}, fmt.Errorf("%q is neither an IP address nor a hostname", host)
	}
	return endpoint{host: strings.TrimSuffix(host, "."), port: port}, nil
}

// validHostname accepts dot-separated labels of letters, digits, '-' and
// '_' (not at a label's ends for '-'), one trailing dot allowed.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
