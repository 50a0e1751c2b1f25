package fsm

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// A Workspace's network policy is stored normalized, so every replica and
// every node sees the same rules however the caller wrote them. Changing
// it while the Workspace runs is a command for its node like start and
// stop: the policy in the record is what the node applied, never what was
// only asked for.

// WorkspaceNetworkArgs changes the given items of a Workspace's policy.
type WorkspaceNetworkArgs struct {
	WorkspaceID string `json:"workspace_id"`
	api.NetworkChange
}

// normalizeNetwork checks the policy p asked for Workspace ws and returns
// it as stored. Errors name the Workspace and are decided from p and the
// state only (rules in the order given), so replicas agree. stored says p
// is a change over the Workspace's stored policy (set-network), whose
// lists the caller may not have given in this request.
func normalizeNetwork(tx *bolt.Tx, ws, ns string, p api.NetworkPolicy, stored bool) (api.NetworkPolicy, error) {
	// EgressRevision is ctrl's to set: whatever the caller sent is dropped.
	out := api.NetworkPolicy{Egress: p.Egress, Resolver: p.Resolver}
	if out.Egress == "" {
		out.Egress = api.EgressNone
	}
	if out.Egress != api.EgressNone && out.Egress != api.EgressPublic && ValidObjectName(kindEgress, out.Egress) != nil {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: egress %q is not valid: use none, public or the name of an Egress object (1-63 lowercase letters, digits or '-')", ws, clip(out.Egress))
	}
	if out.Resolver != "" && ValidObjectName(kindResolver, out.Resolver) != nil {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: resolver %q is not valid: give the name of a Resolver object (1-63 lowercase letters, digits or '-'), or leave it empty (--resolver default) for the deployment resolver", ws, clip(out.Resolver))
	}
	var err error
	if out.Allow, err = normalizeRules(ws, "allow", p.Allow); err != nil {
		return out, err
	}
	if out.Deny, err = normalizeRules(ws, "deny", p.Deny); err != nil {
		return out, err
	}
	if out.Resolver != "" && (slices.ContainsFunc(out.Allow, api.IsDomainRule) || slices.ContainsFunc(out.Deny, api.IsDomainRule)) {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: domain rules are enforced by the deployment resolver, not by resolver %s: drop --resolver, or use CIDRs", ws, out.Resolver)
	}
	if out.Egress != api.EgressPublic && (len(out.Allow) > 0 || len(out.Deny) > 0) {
		fix := "leave out --allow and --deny"
		if stored {
			fix = fmt.Sprintf("empty the lists (kibo workspace set-network %s --egress %s --clear-allow --clear-deny)", ws, out.Egress)
		}
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: allow/deny lists apply to public egress only, not to egress %s: give --egress public, or %s", ws, out.Egress, fix)
	}
	if out.Egress != api.EgressNone && out.Egress != api.EgressPublic {
		if out.Egress, err = qualifyPolicyName(kindEgress, ws, ns, out.Egress); err != nil {
			return out, err
		}
		r, err := getRecord[egressRecord](tx, bucketEgress, []byte(out.Egress))
		if err != nil || r == nil {
			return out, orNotFound(err, "egress %s does not exist: create it with kibo egress create %s --socks5 HOST:PORT", out.Egress, out.Egress)
		}
		out.EgressRevision = r.Revision
	}
	if out.Resolver != "" {
		if out.Resolver, err = qualifyPolicyName(kindResolver, ws, ns, out.Resolver); err != nil {
			return out, err
		}
		if r, err := getRecord[resolverRecord](tx, bucketResolvers, []byte(out.Resolver)); err != nil || r == nil {
			return out, orNotFound(err, "resolver %s does not exist: create it with kibo resolver create %s --upstream ADDR", out.Resolver, out.Resolver)
		}
	}
	return out, nil
}

// clip bounds a caller's value quoted in an error.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// latestEgressRevision moves w's policy to the latest revision of the
// Egress it names (a start: no node uses the old one for w). The policy
// is replaced, not edited, so a clone of w taken before keeps the old.
func latestEgressRevision(tx *bolt.Tx, w *api.Workspace) error {
	if !usesEgressObject(w.Network) {
		return nil
	}
	r, err := getRecord[egressRecord](tx, bucketEgress, []byte(w.Network.Egress))
	if err != nil {
		return err
	}
	if r == nil {
		return api.Errorf(api.CodeFailedPrecondition,
			"workspace %s: its egress %s no longer exists: give it another with kibo workspace set-network %s --egress none|public|NAME", w.WorkspaceID, w.Network.Egress, w.WorkspaceID)
	}
	if r.Revision != w.Network.EgressRevision {
		n := *w.Network
		n.EgressRevision = r.Revision
		w.Network = &n
	}
	return nil
}

func orNotFound(err error, format string, args ...any) error {
	if err != nil {
		return err
	}
	return api.Errorf(api.CodeNotFound, format, args...)
}

// normalizeRules returns the canonical CIDRs and domain rules of one list,
// each once, in the order given; nil for an empty list.
func normalizeRules(ws, list string, rules []string) ([]string, error) {
	if len(rules) > api.MaxNetworkRules {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace %s: %d %s rules given: at most %d", ws, len(rules), list, api.MaxNetworkRules)
	}
	var out []string
	for _, r := range rules {
		c, ok := canonicalCIDR(r)
		if !ok {
			c, ok = api.CanonicalDomainRule(r)
		}
		if !ok {
			return nil, api.Errorf(api.CodeInvalidArgument,
				"workspace %s: %s rule %q is not a CIDR, an IP address or a domain: write it as 10.0.0.0/8, 192.0.2.7, 2001:db8::/32, example.com or *.example.com", ws, list, clip(r))
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// canonicalCIDR reads an IPv4 or IPv6 prefix or address: an address is a
// one-address prefix, host bits are cleared, an IPv4-mapped IPv6 prefix is
// written as the IPv4 one. Zones are refused: a rule names addresses, not
// interfaces.
func canonicalCIDR(s string) (string, bool) {
	var p netip.Prefix
	if pp, err := netip.ParsePrefix(s); err == nil {
		p = pp
	} else if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		p = netip.PrefixFrom(a, a.BitLen())
	} else {
		return "", false
	}
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked().String(), true
}

func samePolicy(a, b api.NetworkPolicy) bool {
	return a.Egress == b.Egress && a.EgressRevision == b.EgressRevision && a.Resolver == b.Resolver && slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny)
}

// applyWorkspaceSetNetwork changes a Workspace's policy: at once when it
// is STOPPED; through its node when it runs, the record keeping the old
// policy until the node answered ok (applyNetworkResult).
// LevelKeyNetwork is the level of a set-network written for an API key:
// an older voter would refuse the key's entry that a newer one applies.
const LevelKeyNetwork = 17

func applyWorkspaceSetNetwork(ac *applyCtx) (any, error) {
	var a WorkspaceNetworkArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if a.WorkspaceID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "%s: no workspace_id given", ac.e.Op)
	}
	w, err := mustWorkspace(ac.tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := ac.scope.permits(w.Namespace, "workspace "+a.WorkspaceID); err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, err
	}
	cur := w.Network.Effective()
	want, err := normalizeNetwork(ac.tx, w.WorkspaceID, w.Namespace, a.Apply(cur), true)
	if err != nil {
		return nil, err
	}
	if p := w.Pending; p != nil && p.Kind == api.WSCmdNetwork {
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s with a network change pending on node %s since %s: wait for its answer (kibo workspace get %s), then retry",
			w.WorkspaceID, w.State, p.NodeID, p.IssuedAt.UTC().Format(time.RFC3339), w.WorkspaceID)
	}
	old := cloneWorkspace(w)
	switch {
	case w.Pending != nil:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s with a %s command pending on node %s: set-network needs STOPPED or AVAILABLE; wait for it to settle", w.WorkspaceID, w.State, w.Pending.Kind, w.Pending.NodeID)
	case w.State == api.WorkspaceStopped:
		if w.Network != nil && samePolicy(cur, want) {
			return w, nil
		}
		w.Network, w.NetworkChange = &want, nil
	case w.State == api.WorkspaceAvailable && w.InstanceID != "":
		if samePolicy(cur, want) {
			return w, nil // what its node enforces already
		}
		setPending(ac.e, w, api.WSCmdNetwork, nil)
		w.Pending.Network = &want
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s: set-network needs STOPPED (stored at once) or AVAILABLE (applied by its node); wait for it, or stop it first", w.WorkspaceID, w.State)
	}
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return w, nil
}

// applyNetworkResult takes the node's answer to a network command p: ok
// commits the requested policy; anything else leaves the old one, and the
// Workspace runs on as it was. Either way the answer is kept for the caller.
func applyNetworkResult(e *Entry, w *api.Workspace, p *api.WorkspaceCommand, a *WorkspaceResultArgs) {
	res := &api.NetworkChangeResult{CommandID: p.CommandID, NodeID: a.NodeID, Outcome: OutcomeOK, At: *at(e)}
	if a.Outcome == OutcomeOK && p.Network != nil {
		n := *p.Network
		w.Network = &n
	} else {
		res.Outcome, res.Error, res.Requested = OutcomeFailed, a.Error, p.Network
		if res.Error == "" {
			res.Error = "node answered " + a.Outcome
		}
	}
	w.NetworkChange = res
}

// dropNetworkChange ends a pending network command whose Instance ended
// before its node answered: the policy stays, the caller is told why.
func dropNetworkChange(e *Entry, w *api.Workspace, why string) {
	p := w.Pending
	if p == nil || p.Kind != api.WSCmdNetwork {
		return
	}
	w.Pending = nil
	w.NetworkChange = &api.NetworkChangeResult{CommandID: p.CommandID, NodeID: p.NodeID, Outcome: OutcomeFailed, Error: why, At: *at(e), Requested: p.Network}
}
