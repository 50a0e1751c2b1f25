package agent

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kibotos/kibotos/agent/runtime"
	"github.com/kibotos/kibotos/api"
)

// runtimePolicy is the policy ctrl sent in the form the runtime enforces.
// ctrl validated it, but the node checks again what it would otherwise
// enforce wrongly: a rule it cannot read, or a Resolver it cannot use yet.
func runtimePolicy(p api.NetworkPolicy) (runtime.NetworkPolicy, error) {
	var out runtime.NetworkPolicy
	switch p.Egress {
	case "", api.EgressNone:
		out.Egress = api.EgressNone
	case api.EgressPublic:
		out.Egress = api.EgressPublic
	default:
		// An Egress object; its revision comes with the objects themselves.
		out.Egress = "egress:" + p.Egress
	}
	if p.Resolver != "" {
		return out, fmt.Errorf("resolver %s: this node cannot forward DNS to a Resolver object yet; upgrade it", p.Resolver)
	}
	var err error
	if out.Allow, err = prefixes("allow", p.Allow); err != nil {
		return out, err
	}
	if out.Deny, err = prefixes("deny", p.Deny); err != nil {
		return out, err
	}
	return out, nil
}

func prefixes(list string, rules []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, r := range rules {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, fmt.Errorf("%s rule %q is not a CIDR: %w", list, r, err)
		}
		out = append(out, p)
	}
	return out, nil
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
	p, err := runtimePolicy(*requested)
	if err != nil {
		return fmt.Errorf("instance %s: %w", t.Command.InstanceID, err)
	}
	if err := rt.UpdateNetwork(ctx, t.Command.InstanceID, p); err != nil {
		return fmt.Errorf("node %s: %w", a.cfg.NodeID, err)
	}
	return nil
}
