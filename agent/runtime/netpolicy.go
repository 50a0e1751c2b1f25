package runtime

import (
	"context"
	"fmt"
	"net/netip"
)

// NetworkPolicy is what an Instance's guest may reach, as the node was
// told by ctrl and records with the Instance.
type NetworkPolicy struct {
	// Egress is "none" (only DNS), "public" (forwarded and masqueraded
	// through the uplink) or "egress:<name>@<revision>" for an Egress object.
	Egress string `json:"egress"`
	// Allow and Deny narrow public egress (CIDRs).
	Allow []netip.Prefix `json:"allow,omitempty"`
	Deny  []netip.Prefix `json:"deny,omitempty"`
}

// UpdateNetwork applies a changed policy to a running Instance without a
// restart: its rule table is replaced in one transaction and the new
// policy recorded.
func (rt *Runtime) UpdateNetwork(ctx context.Context, id string, p NetworkPolicy) error {
	return fmt.Errorf("runtime: instance %s: changing the network policy of a running Instance is not built yet", id)
}
