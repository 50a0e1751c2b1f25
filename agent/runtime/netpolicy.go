package runtime

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

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
	from := in.rec.Network.Policy
	wasEgress := usesEgressProcess(from)
	rec := *in.rec
	nr := *rec.Network
	nr.Policy, nr.Switch = p, nil
	rec.Network = &nr
	// Record first, marked as begun: the next node's takeover puts the
	// table in step with the record (or isolates the guest when it
	// cannot vouch for the table), and until a node finished the switch
	// check-maintenance names it.
	begun, bnr := rec, nr
	bnr.Switch = &NetworkSwitch{Rotation: isRotation(from, p), From: from, Started: time.Now().UTC()}
	begun.Network = &bnr
	if err := WriteLaunchRecord(in.paths.Dir, &begun); err != nil {
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
	var syncErr error
	if wasEgress || usesEgressProcess(p) {
		// Unlocked: syncEgress reads every Instance's record.
		in.mu.Unlock()
		syncErr = rt.syncEgress(ctx)
		in.mu.Lock()
	}
	// Done: the record without the mark. A stop or delete meanwhile
	// wrote its own record (from in.rec, unmarked) or removed it.
	if in.rec == &rec {
		if err := WriteLaunchRecord(in.paths.Dir, &rec); err != nil {
			rt.log.Warn("instance network switch not recorded as finished", "instance_id", id, "err", err)
		}
	}
	if syncErr != nil {
		return fmt.Errorf("runtime: instance %s: policy applied, but %w", id, syncErr)
	}
	return nil
}

// finishNetworkSwitches unmarks the policy changes an earlier node left
// half done: takeover has put each table in step with its recorded
// policy (or isolated it) and the egress routes followed.
func (rt *Runtime) finishNetworkSwitches() {
	for _, in := range rt.all() {
		in.mu.Lock()
		if nr := in.rec.Network; nr != nil && nr.Switch != nil {
			done, dnr := *in.rec, *nr
			dnr.Switch = nil
			done.Network = &dnr
			if err := WriteLaunchRecord(in.paths.Dir, &done); err != nil {
				rt.log.Error("instance network switch not recorded as finished", "instance_id", in.id, "err", err)
			} else {
				in.rec = &done
				rt.log.Info("instance network switch finished at takeover", "instance_id", in.id, "kind", nr.Switch.what(),
					"started", nr.Switch.Started.Format(time.RFC3339))
			}
		}
		in.mu.Unlock()
	}
}

// NetworkSwitch is a policy change under way (NetworkRecord.Switch).
type NetworkSwitch struct {
	// Rotation: only the targets of the Egress or Resolver the policy
	// names change (a new revision of the Egress, other upstreams).
	Rotation bool          `json:"rotation,omitempty"`
	From     NetworkPolicy `json:"from"`
	Started  time.Time     `json:"started"`
}

// what is the switch as check-maintenance and the log name it.
func (s *NetworkSwitch) what() string {
	if s.Rotation {
		return "target rotation"
	}
	return "network switch"
}

// isRotation says whether to differs from from only in the targets of
// the Egress and Resolver they both name.
func isRotation(from, to NetworkPolicy) bool {
	same := from.Egress == to.Egress && slices.Equal(from.Allow, to.Allow) && slices.Equal(from.Deny, to.Deny) &&
		slices.Equal(from.AllowNames, to.AllowNames) && slices.Equal(from.DenyNames, to.DenyNames) &&
		(from.Proxy == nil) == (to.Proxy == nil) && (from.Resolver == nil) == (to.Resolver == nil)
	if !same || (from.Proxy == nil && from.Resolver == nil) {
		return false
	}
	if (from.Proxy != nil && from.Proxy.Name != to.Proxy.Name) || (from.Resolver != nil && from.Resolver.Name != to.Resolver.Name) {
		return false
	}
	return (from.Proxy != nil && *from.Proxy != *to.Proxy) ||
		(from.Resolver != nil && !slices.Equal(from.Resolver.Upstreams, to.Resolver.Upstreams))
}

// describe is the policy in a few words, for messages.
func (p NetworkPolicy) describe() string {
	s := "egress " + cmp.Or(p.Egress, netpol.EgressNone)
	if x := p.Proxy; x != nil {
		s += fmt.Sprintf(" through %s revision %d (%s)", x.Name, x.Revision, x.SOCKS5)
	}
	if r := p.Resolver; r != nil {
		s += fmt.Sprintf(", resolver %s (%s)", r.Name, strings.Join(r.Upstreams, " "))
	}
	if n := len(p.Allow) + len(p.AllowNames) + len(p.Deny) + len(p.DenyNames); n > 0 {
		s += fmt.Sprintf(", %d allow and deny rules", n)
	}
	return s
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
