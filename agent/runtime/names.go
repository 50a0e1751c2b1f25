package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/kibotos/kibotos/agent/dnsfilter"
	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/netpol"
)

// NamesDNSPort is where the node's own resolver for guests with domain
// rules (agent/dnsfilter) listens, on the node's service address.
const NamesDNSPort = 5301

// NamesDNS is the address guest DNS is DNATed to when the policy has
// domain rules.
var NamesDNS = netip.AddrPortFrom(netpol.ServiceAddr, NamesDNSPort)

// hasNames says whether a policy has domain rules.
func hasNames(p NetworkPolicy) bool { return len(p.AllowNames) > 0 || len(p.DenyNames) > 0 }

// checkNames validates a policy's domain rules as recorded: only
// canonical rules, as ctrl stores them, within ctrl's bound.
func checkNames(p NetworkPolicy) error {
	for list, rules := range map[string][]string{"allow": p.AllowNames, "deny": p.DenyNames} {
		if len(rules) > api.MaxNetworkRules {
			return fmt.Errorf("%d %s domain rules: at most %d", len(rules), list, api.MaxNetworkRules)
		}
		for _, r := range rules {
			if c, ok := api.CanonicalDomainRule(r); !ok || c != r {
				return fmt.Errorf("%s domain rule %q is not one this build can enforce", list, r)
			}
		}
	}
	return nil
}

// openNames starts the node's domain filter in the node's namespace, on
// NamesDNS (the service address is on lo by then), asking the
// deployment resolvers.
func (n *nodeNetwork) openNames(ctx context.Context, log *slog.Logger) error {
	var pc net.PacketConn
	var ln net.Listener
	err := netpol.InNamespace(n.hostNS, func() error {
		var err error
		if pc, err = net.ListenPacket("udp4", NamesDNS.String()); err != nil {
			return err
		}
		if ln, err = net.Listen("tcp4", NamesDNS.String()); err != nil {
			pc.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("runtime: the node's resolver for domain rules on %s: %w", NamesDNS, err)
	}
	// Upstreams are asked from the node's namespace, whatever thread asks.
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = netpol.InNamespace(n.hostNS, func() error {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	n.names, err = dnsfilter.Serve(ctx, pc, ln, n.cfg.Resolvers, dial, log)
	if err != nil {
		pc.Close()
		ln.Close()
		return fmt.Errorf("runtime: the node's resolver for domain rules: %w", err)
	}
	return nil
}

// registerNames tells the domain filter about an Instance whose table was
// just put in place (or found right at takeover): a policy with domain
// rules is answered and learned for, any other is forgotten.
func (n *nodeNetwork) registerNames(ctx context.Context, id string, nr *NetworkRecord) {
	if n.names == nil {
		return
	}
	p := nr.Policy
	if !hasNames(p) {
		n.names.Remove(nr.Guest)
		return
	}
	namespace := nr.Namespace
	n.names.Set(ctx, nr.Guest, dnsfilter.Policy{
		Instance: id, AllowNames: p.AllowNames, DenyNames: p.DenyNames, AllowCIDRs: p.Allow, IPv6: nr.Guest6.IsValid(),
		Learn: func(ctx context.Context, set string, addrs []netip.Addr, ttl time.Duration) error {
			ns, err := n.ns.Open(namespace)
			if err != nil {
				return err
			}
			defer ns.Close()
			return netpol.Learn(ctx, int(ns), set, addrs, ttl)
		},
	})
}

// forgetNames makes the domain filter refuse a guest address from now on.
func (n *nodeNetwork) forgetNames(guest netip.Addr) {
	if n.names != nil {
		n.names.Remove(guest)
	}
}
