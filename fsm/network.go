package fsm

import (
	"net/netip"
	"regexp"
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

var (
	// Names of Egress and Resolver objects, as other object names.
	networkObjectPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	// A rule that reads as a DNS name (example.com, *.example.com): a
	// kind of rule that will exist, not a typo of a CIDR.
	domainRulePattern = regexp.MustCompile(`^(\*\.)?([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z][A-Za-z0-9-]{0,62}\.?$`)
)

// normalizeNetwork checks the policy p asked for Workspace ws and returns
// it as stored. Errors name the Workspace and are decided from p and the
// state only (rules in the order given), so replicas agree.
func normalizeNetwork(tx *bolt.Tx, ws string, p api.NetworkPolicy) (api.NetworkPolicy, error) {
	out := api.NetworkPolicy{Egress: p.Egress, Resolver: p.Resolver}
	if out.Egress == "" {
		out.Egress = api.EgressNone
	}
	if out.Egress != api.EgressNone && out.Egress != api.EgressPublic && !networkObjectPattern.MatchString(out.Egress) {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: egress %q is not valid: use none, public or the name of an Egress object (1-63 lowercase letters, digits, '.' or '-')", ws, out.Egress)
	}
	if out.Resolver != "" && !networkObjectPattern.MatchString(out.Resolver) {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: resolver %q is not valid: give the name of a Resolver object (1-63 lowercase letters, digits, '.' or '-'), or none for the deployment resolver", ws, out.Resolver)
	}
	var err error
	if out.Allow, err = normalizeRules(ws, "allow", p.Allow); err != nil {
		return out, err
	}
	if out.Deny, err = normalizeRules(ws, "deny", p.Deny); err != nil {
		return out, err
	}
	if out.Egress != api.EgressPublic && (len(out.Allow) > 0 || len(out.Deny) > 0) {
		return out, api.Errorf(api.CodeInvalidArgument,
			"workspace %s: allow/deny lists apply to public egress only, not to egress %s: give --egress public, or drop the lists", ws, out.Egress)
	}
	if out.Egress != api.EgressNone && out.Egress != api.EgressPublic {
		if ok, err := egressExists(tx, out.Egress); err != nil || !ok {
			return out, orNotFound(err, "egress %s does not exist: create it with kibo egress create %s --socks5 HOST:PORT", out.Egress, out.Egress)
		}
	}
	if out.Resolver != "" {
		if ok, err := resolverExists(tx, out.Resolver); err != nil || !ok {
			return out, orNotFound(err, "resolver %s does not exist: create it with kibo resolver create %s --upstream ADDR", out.Resolver, out.Resolver)
		}
	}
	return out, nil
}

func orNotFound(err error, format string, args ...any) error {
	if err != nil {
		return err
	}
	return api.Errorf(api.CodeNotFound, format, args...)
}

// egressExists and resolverExists look up the objects a policy may name.
// Neither kind exists yet (a later change adds them with their own
// buckets), so every name is unknown and refused before anything is
// stored that a node could not enforce.
func egressExists(tx *bolt.Tx, name string) (bool, error)   { return false, nil }
func resolverExists(tx *bolt.Tx, name string) (bool, error) { return false, nil }

// normalizeRules returns the canonical CIDRs of one list, each once, in
// the order given; nil for an empty list.
func normalizeRules(ws, list string, rules []string) ([]string, error) {
	if len(rules) > api.MaxNetworkRules {
		return nil, api.Errorf(api.CodeInvalidArgument, "workspace %s: %d %s rules given: at most %d", ws, len(rules), list, api.MaxNetworkRules)
	}
	var out []string
	for _, r := range rules {
		c, ok := canonicalCIDR(r)
		switch {
		case !ok && domainRulePattern.MatchString(r):
			return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s: domain rules (%s) are not supported yet; use CIDRs", ws, r)
		case !ok:
			return nil, api.Errorf(api.CodeInvalidArgument,
				"workspace %s: %s rule %q is not a CIDR or an IP address: write it as 10.0.0.0/8, 192.0.2.7 or 2001:db8::/32", ws, list, r)
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
	return a.Egress == b.Egress && a.Resolver == b.Resolver && slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny)
}

// applyWorkspaceSetNetwork changes a Workspace's policy: at once when it
// is STOPPED; through its node when it runs, the record keeping the old
// policy until the node answered ok (applyNetworkResult).
func applyWorkspaceSetNetwork(tx *bolt.Tx, e *Entry) (any, error) {
	var a WorkspaceNetworkArgs
	if err := decodeArgs(e, &a); err != nil {
		return nil, err
	}
	if a.WorkspaceID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "%s: no workspace_id given", e.Op)
	}
	w, err := mustWorkspace(tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, err
	}
	cur := w.Network.Effective()
	want, err := normalizeNetwork(tx, w.WorkspaceID, a.Apply(cur))
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
		setPending(e, w, api.WSCmdNetwork, nil)
		w.Pending.Network = &want
	default:
		return nil, api.Errorf(api.CodeFailedPrecondition,
			"workspace %s is %s: set-network needs STOPPED (stored at once) or AVAILABLE (applied by its node); wait for it, or stop it first", w.WorkspaceID, w.State)
	}
	if err := putWorkspace(tx, e, old, w); err != nil {
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
