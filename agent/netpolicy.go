package agent

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
)

// runtimePolicy is the policy ctrl sent in the form the runtime enforces,
// with the Egress and Resolver objects the task carries. ctrl validated it,
// but the node checks again what it would otherwise enforce wrongly: a rule
// it cannot read, an object the task does not carry.
func runtimePolicy(p api.NetworkPolicy, eg *api.TaskEgress, res *api.TaskResolver) (runtime.NetworkPolicy, error) {
	var out runtime.NetworkPolicy
	switch p.Egress {
	case "", api.EgressNone:
		out.Egress = api.EgressNone
	case api.EgressPublic:
		out.Egress = api.EgressPublic
	default:
		if eg == nil || eg.Name != p.Egress || eg.Revision == 0 || eg.SOCKS5 == "" {
			return out, fmt.Errorf("egress %s: the task does not carry it (ctrl and node disagree on the protocol; upgrade them to one release)", p.Egress)
		}
		out.Egress = runtime.EgressProxyMode
		out.Proxy = &runtime.EgressProxy{Name: eg.Name, Revision: eg.Revision, SOCKS5: eg.SOCKS5, Credentials: eg.Credentials}
	}
	if p.Resolver != "" {
		if res == nil || res.Name != p.Resolver || len(res.Upstreams) == 0 {
			return out, fmt.Errorf("resolver %s: the task does not carry it (ctrl and node disagree on the protocol; upgrade them to one release)", p.Resolver)
		}
		out.Resolver = &runtime.ResolverRoute{Name: res.Name, Upstreams: append([]string(nil), res.Upstreams...)}
	}
	var err error
	if out.Allow, out.AllowNames, err = splitRules("allow", p.Allow); err != nil {
		return out, err
	}
	if out.Deny, out.DenyNames, err = splitRules("deny", p.Deny); err != nil {
		return out, err
	}
	return out, nil
}

// splitRules sorts a list into its CIDRs and its domain rules.
func splitRules(list string, rules []string) ([]netip.Prefix, []string, error) {
	var cidrs []netip.Prefix
	var names []string
	for _, r := range rules {
		if name, ok := api.CanonicalDomainRule(r); ok {
			names = append(names, name)
			continue
		}
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, nil, fmt.Errorf("%s rule %q is neither a CIDR nor a domain: %w", list, r, err)
		}
		cidrs = append(cidrs, p)
	}
	return cidrs, names, nil
}

// updateNetwork applies a network command's policy to the running
// Instance; on an error the Instance keeps the policy it had.
func (a *Agent) updateNetwork(ctx context.Context, t api.WorkspaceTask) error {
	rt := a.cfg.Runtime
	if rt == nil {
		return fmt.Errorf("node %s runs no VMs: it has no service manager for VMM units", a.cfg.NodeID)
	}
	requested := t.Network
	if requested == nil {
		requested = t.Command.Network
	}
	if requested == nil {
		return fmt.Errorf("network command %s for instance %s carries no policy: ctrl and node %s disagree on the protocol; upgrade them to one release", t.Command.CommandID, t.Command.InstanceID, a.cfg.NodeID)
	}
	p, err := runtimePolicy(*requested, t.Egress, t.Resolver)
	if err != nil {
		return fmt.Errorf("instance %s: %w", t.Command.InstanceID, err)
	}
	if err := a.fetchEgressCredentials(ctx, p); err != nil {
		return err
	}
	if err := rt.UpdateNetwork(ctx, t.Command.InstanceID, p); err != nil {
		return fmt.Errorf("node %s: %w", a.cfg.NodeID, err)
	}
	return nil
}

// fetchEgressCredentials puts the credentials of the Egress revision a
// policy uses on this node (asked from ctrl with the node's own identity),
// unless they are there already.
func (a *Agent) fetchEgressCredentials(ctx context.Context, p runtime.NetworkPolicy) error {
	x := p.Proxy
	if x == nil || !x.Credentials {
		return nil
	}
	if a.cfg.Runtime.HasEgressCredentials(x.Name, x.Revision) {
		return nil
	}
	if a.cfg.FetchEgressCredentials == nil {
		return fmt.Errorf("egress %s revision %d: node %s cannot ask ctrl for its credentials", x.Name, x.Revision, a.cfg.NodeID)
	}
	c, err := a.cfg.FetchEgressCredentials(ctx, x.Name, x.Revision)
	if err != nil {
		return fmt.Errorf("egress %s revision %d: fetch its credentials from ctrl: %w", x.Name, x.Revision, err)
	}
	if c.Name != x.Name || c.Revision != x.Revision {
		return fmt.Errorf("egress %s revision %d: ctrl answered with %s revision %d", x.Name, x.Revision, c.Name, c.Revision)
	}
	return a.cfg.Runtime.StoreEgressCredentials(runtime.EgressCredentials{Name: c.Name, Revision: c.Revision, SOCKS5: c.SOCKS5, Username: c.Username, Password: c.Password})
}
