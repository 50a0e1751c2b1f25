package runtime

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/kibotos/kibotos/netpol"
)

// NetworkPolicy is what an Instance's guest may reach, as the node was
// told by ctrl and records with the Instance.
type NetworkPolicy struct {
	// Egress is "none" (only DNS), "public" (forwarded and masqueraded
	// through the uplink) or "proxy" (every TCP connection through Proxy,
	// the Egress object the policy names).
	Egress string       `json:"egress"`
	Proxy  *EgressProxy `json:"proxy,omitempty"`
	// Resolver, when set, answers the guest's DNS instead of the
	// deployment resolver (through the egress process).
	Resolver *ResolverRoute `json:"resolver,omitempty"`
	// Allow and Deny narrow public egress (CIDRs).
	Allow []netip.Prefix `json:"allow,omitempty"`
	Deny  []netip.Prefix `json:"deny,omitempty"`
	// AllowNames and DenyNames are its domain rules (example.com,
	// *.example.com), canonical: the node's resolver answers the guest
	// and learns the addresses into the Instance's table.
	AllowNames []string `json:"allow_names,omitempty"`
	DenyNames  []string `json:"deny_names,omitempty"`
}

// UpdateNetwork applies a changed policy to a running Instance without a
// restart: its rule table is replaced in one transaction (established
// connections stay) and the new policy recorded. On error the old table
// and record stay.
func (rt *Runtime) UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) error {
	in, err := rt.get(id)
	if err != nil {
		return err
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != StateRunning {
		return fmt.Errorf("runtime: instance %s is %s: its network policy changes only while it runs", id, in.state)
	}
	if in.rec.Network == nil {
		return fmt.Errorf("runtime: instance %s has no network", id)
	}
	if err := rt.checkEgressPolicy(id, p); err != nil {
		return err
	}
	wasEgress := usesEgressProcess(in.rec.Network.Policy)
	rec := *in.rec
	nr := *rec.Network
	nr.Policy = p
	rec.Network = &nr
	// Record first: a node that dies between the two finds table and
	// record disagreeing at takeover and isolates rather than guesses.
	if err := WriteLaunchRecord(in.paths.Dir, &rec); err != nil {
		return err
	}
	if err := rt.replaceTable(ctx, &nr); err != nil {
		if werr := WriteLaunchRecord(in.paths.Dir, in.rec); werr != nil {
			rt.log.Error("instance launch record not restored after a failed policy change", "instance_id", id, "err", werr)
		}
		return fmt.Errorf("runtime: instance %s: %w", id, err)
	}
	in.rec = &rec
	rt.net.registerNames(ctx, id, &nr)
	rt.log.Info("instance network policy changed", "instance_id", id, "egress", p.Egress,
		"allow", len(p.Allow)+len(p.AllowNames), "deny", len(p.Deny)+len(p.DenyNames))
	if wasEgress || usesEgressProcess(p) {
		// Unlocked: syncEgress reads every Instance's record.
		in.mu.Unlock()
		err := rt.syncEgress(ctx)
		in.mu.Lock()
		if err != nil {
			return fmt.Errorf("runtime: instance %s: policy applied, but %w", id, err)
		}
	}
	return nil
}

// replaceTable puts the rule table of a recorded network in place, in one
// transaction.
func (rt *Runtime) replaceTable(ctx context.Context, nr *NetworkRecord) error {
	spec, err := rt.net.tableSpec(nr)
	if err != nil {
		return err
	}
	table, err := netpol.Build(spec)
	if err != nil {
		return err
	}
	ns, err := rt.net.ns.Open(nr.Namespace)
	if err != nil {
		return err
	}
	defer ns.Close()
	return netpol.Replace(ctx, int(ns), table)
}
