package api

import (
	"regexp"
	"strings"
	"time"
)

// Egress values of a network policy besides the name of an Egress object.
const (
	EgressNone   = "none"   // no outbound traffic; DNS through the deployment resolver only
	EgressPublic = "public" // out through the node's uplink, narrowed by Allow and Deny
)

// MaxNetworkRules bounds each of a policy's Allow and Deny lists.
const MaxNetworkRules = 256

// NetworkPolicy is what a Workspace's guest may reach. ctrl stores it in
// normalized form: Egress never empty, CIDRs canonical (10.1.2.3 is
// stored as 10.1.2.3/32), each rule once.
type NetworkPolicy struct {
	// Egress is none (the default), public, or the name of an Egress
	// object (a SOCKS5 exit of the caller's).
	Egress string `json:"egress"`
	// EgressRevision is the revision of the Egress object the policy
	// uses; 0 for none and public. ctrl sets it (from the latest
	// revision) when it accepts the policy at create, set-network and
	// start; a value in a request is ignored. An update of the Egress
	// moves no Workspace: a later set-network naming the Egress, or the
	// next start, picks up the new revision.
	EgressRevision uint64 `json:"egress_revision,omitempty"`
	// Resolver is "" for the deployment resolver, else the name of a
	// Resolver object DNS queries go to.
	Resolver string `json:"resolver,omitempty"`
	// Allow and Deny narrow public egress; they apply to public only.
	// A rule is a CIDR or a domain rule (example.com, *.example.com):
	// domains are enforced by the node's resolver, which lets through
	// only the addresses it answered for an allowed name, and refuses to
	// resolve a denied one (and drops its addresses, once answered).
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// Effective is the policy in force: records written before Workspaces had
// a policy (and requests without one) mean egress none. p may be nil.
func (p *NetworkPolicy) Effective() NetworkPolicy {
	if p == nil {
		return NetworkPolicy{Egress: EgressNone}
	}
	out := *p
	if out.Egress == "" {
		out.Egress = EgressNone
	}
	return out
}

// NetworkChange is set-network: every item given replaces the
// Workspace's; an absent (or null) one is kept. An empty list ([]) clears
// Allow or Deny; an empty Resolver goes back to the deployment one.
type NetworkChange struct {
	Egress   *string   `json:"egress,omitempty"`
	Resolver *string   `json:"resolver,omitempty"`
	Allow    *[]string `json:"allow,omitempty"`
	Deny     *[]string `json:"deny,omitempty"`
}

// Apply returns p with the change made (before validation).
func (c NetworkChange) Apply(p NetworkPolicy) NetworkPolicy {
	if c.Egress != nil {
		p.Egress = *c.Egress
	}
	if c.Resolver != nil {
		p.Resolver = *c.Resolver
	}
	if c.Allow != nil {
		p.Allow = *c.Allow
	}
	if c.Deny != nil {
		p.Deny = *c.Deny
	}
	return p
}

// WorkspaceNetworkRequest is `workspace set-network`.
type WorkspaceNetworkRequest struct {
	WriteMeta
	NetworkChange
}

// NetworkChangeResult is the node's answer to the latest policy change of
// a running Workspace. A change leaves the Workspace's state as it was, so
// this is where a caller that waited for it learns how it went.
type NetworkChangeResult struct {
	CommandID string    `json:"command_id"`
	NodeID    string    `json:"node_id"`
	Outcome   string    `json:"outcome"` // ok, failed
	Error     string    `json:"error,omitempty"`
	At        time.Time `json:"at"`
	// Requested is the policy that was not applied (failed only).
	Requested *NetworkPolicy `json:"requested,omitempty"`
}

// domainRulePattern is a DNS name of at least two labels (example.com),
// or one of at least two labels under "*." (*.example.com: any name below
// example.com, at any depth, but not example.com itself). A wildcard over
// a whole top-level domain is refused as the mistake it would be.
var domainRulePattern = regexp.MustCompile(`^(\*\.)?([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}$`)

// CanonicalDomainRule reads an allow/deny rule that names domains and
// returns it lowercase without a trailing dot; ok is false when s is not
// a domain rule.
func CanonicalDomainRule(s string) (rule string, ok bool) {
	c := strings.TrimSuffix(strings.ToLower(s), ".")
	if len(c) > 253 || !domainRulePattern.MatchString(c) {
		return "", false
	}
	return c, true
}

// IsDomainRule says whether a stored rule names domains rather than
// addresses.
func IsDomainRule(rule string) bool {
	_, ok := CanonicalDomainRule(rule)
	return ok
}

// DomainRuleMatches says whether a queried name (any case, trailing dot or
// not) falls under a canonical domain rule.
func DomainRuleMatches(rule, name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if suffix, ok := strings.CutPrefix(rule, "*"); ok {
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return name == rule
}
