package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/kibotos/kibotos/internal/dnsx"
)

// Bounds of the hostname cache: names of proxies and upstreams are few,
// so a full cache means something is wrong and is simply emptied.
const (
	maxCachedNames = 1024
	minNameTTL     = 5 * time.Second
	maxNameTTL     = 5 * time.Minute
	lookupTimeout  = 2 * time.Second // per resolver and query
)

// nameCache holds the addresses of proxy and upstream hostnames as the
// deployment resolvers gave them, for their TTL.
type nameCache struct {
	mu      sync.Mutex
	entries map[string]nameEntry
}

type nameEntry struct {
	addrs   []netip.Addr
	expires time.Time
}

func (n *nameCache) reset() {
	n.mu.Lock()
	n.entries = nil
	n.mu.Unlock()
}

func (n *nameCache) get(host string, now time.Time) ([]netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.entries[host]
	if !ok || now.After(e.expires) {
		return nil, false
	}
	return e.addrs, true
}

func (n *nameCache) put(host string, addrs []netip.Addr, ttl time.Duration, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.entries == nil || len(n.entries) >= maxCachedNames {
		n.entries = map[string]nameEntry{}
	}
	n.entries[host] = nameEntry{addrs: addrs, expires: now.Add(min(max(ttl, minNameTTL), maxNameTTL))}
}

// resolve gives the addresses of an endpoint: its IP, or its hostname's
// A records (AAAA when there are none) from the deployment resolvers.
func (s *Server) resolve(ctx context.Context, ep endpoint) ([]netip.Addr, error) {
	if ep.addr.IsValid() {
		return []netip.Addr{ep.addr}, nil
	}
	now := time.Now()
	if addrs, ok := s.names.get(ep.host, now); ok {
		return addrs, nil
	}
	servers := s.table.Load().resolvers
	var addrs []netip.Addr
	var ttl time.Duration
	var err error
	for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
		addrs, ttl, err = lookup(ctx, servers, ep.host, qtype)
		if err != nil || len(addrs) > 0 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s with the deployment resolvers: %w", ep.host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s with the deployment resolvers: no address", ep.host)
	}
	s.names.put(ep.host, addrs, ttl, now)
	return addrs, nil
}

var errNoSuchHost = errors.New("no such host")

// lookup asks servers in order for host's records of qtype; the first
// server that answers decides (a name error is an answer).
func lookup(ctx context.Context, servers []netip.AddrPort, host string, qtype uint16) ([]netip.Addr, time.Duration, error) {
	if len(servers) == 0 {
		return nil, 0, errors.New("no deployment resolvers configured")
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(host), qtype)
	var last error
	for _, srv := range servers {
		r, err := dnsx.Exchange(ctx, nil, q, srv, lookupTimeout)
		if err != nil {
			last = fmt.Errorf("%s: %w", srv, err)
			continue
		}
		switch r.Rcode {
		case dns.RcodeSuccess:
		case dns.RcodeNameError:
			return nil, 0, errNoSuchHost
		default:
			last = fmt.Errorf("%s: %s", srv, dns.RcodeToString[r.Rcode])
			continue
		}
		var addrs []netip.Addr
		ttl := maxNameTTL
		for _, rr := range r.Answer {
			var a netip.Addr
			switch v := rr.(type) {
			case *dns.A:
				a, _ = netip.AddrFromSlice(v.A.To4())
			case *dns.AAAA:
				a, _ = netip.AddrFromSlice(v.AAAA)
			default:
				continue
			}
			if a.IsValid() {
				addrs = append(addrs, a)
				ttl = min(ttl, time.Duration(rr.Header().Ttl)*time.Second)
			}
		}
		return addrs, ttl, nil
	}
	return nil, 0, last
}
