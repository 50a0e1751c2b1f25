package e2b

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// A sandbox's egress in E2B's terms, and as a Kibotos network policy.
//
// E2B reaches a destination when allowOut names it, or when the internet
// is on and denyOut does not name it: an allowed entry wins over a
// denied one, and allow_internet_access: false is denyOut 0.0.0.0/0.
// Kibotos's public egress reaches what its allow list names (everything
// when it is empty) that its deny list does not: a denied entry wins. So
// an allow list with everything else denied becomes the Kibotos allow
// list; a deny list with nothing allowed becomes the Kibotos deny list;
// an allow list beside a deny list that does not cover everything is
// redundant unless the two overlap, which Kibotos cannot express and
// refuses.

// allTraffic is E2B's ALL_TRAFFIC, the deny entry that turns the
// internet off.
var allTraffic = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// egressPolicy is the Kibotos policy of E2B's allow_internet_access
// (nil: on) with allowOut and denyOut.
func egressPolicy(internet *bool, allowOut, denyOut []string) (*api.NetworkPolicy, error) {
	allow, err := rules("allowOut", allowOut)
	if err != nil {
		return nil, err
	}
	deny, err := rules("denyOut", denyOut)
	if err != nil {
		return nil, err
	}
	if (internet != nil && !*internet) || coversAll(deny) {
		if len(allow) == 0 {
			return &api.NetworkPolicy{Egress: api.EgressNone}, nil
		}
		return &api.NetworkPolicy{Egress: api.EgressPublic, Allow: allow}, nil // what is not allowed is denied
	}
	if len(allow) > 0 && len(deny) > 0 {
		if a, d, ok := overlap(allow, deny); ok {
			return nil, api.Errorf(api.CodeInvalidArgument, "network: allowOut %s lies in denyOut %s: Kibotos lists either the only destinations allowed (give denyOut %s with allowOut) or those denied, not exceptions to a denied range", a, d, allTraffic[0])
		}
	}
	// With the internet on and a deny list not covering it, an allowed
	// entry outside the denied ones is reachable anyway.
	return &api.NetworkPolicy{Egress: api.EgressPublic, Deny: deny}, nil
}

// coversAll says whether a deny list holds E2B's ALL_TRAFFIC.
func coversAll(deny []string) bool {
	for _, r := range deny {
		if p, err := netip.ParsePrefix(r); err == nil && p.Bits() == 0 {
			return true
		}
	}
	return false
}

// overlap finds an allowed CIDR inside a denied one, or a denied one
// inside an allowed one. A domain's addresses are not known here: an
// allowed domain whose address lies in a denied CIDR stays denied.
func overlap(allow, deny []string) (string, string, bool) {
	for _, a := range allow {
		ap, err := netip.ParsePrefix(a)
		if err != nil {
			continue
		}
		for _, d := range deny {
			if dp, err := netip.ParsePrefix(d); err == nil && ap.Overlaps(dp) {
				return a, d, true
			}
		}
	}
	return "", "", false
}

// rules are E2B's destinations as Kibotos rules: an address becomes its
// one-address CIDR; CIDRs and domains stay (the API checks them).
func rules(what string, in []string) ([]string, error) {
	out := make([]string, 0, len(in))
	for _, r := range in {
		r = strings.TrimSpace(r)
		if r == "" {
			return nil, api.Errorf(api.CodeInvalidArgument, "network.%s has an empty destination", what)
		}
		if ip := net.ParseIP(r); ip != nil {
			bits := 32
			if ip.To4() == nil {
				bits = 128
			}
			r += "/" + strconv.Itoa(bits)
		}
		out = append(out, r)
	}
	return out, nil
}

// notServedNetwork refuses the parts of E2B's network configuration that
// Kibotos does not serve, saying what does.
func notServedNetwork(egressProxy, rules any) error {
	switch {
	case egressProxy != nil:
		return api.Errorf(api.CodeInvalidArgument, "network.egressProxy is not served by Kibotos's E2B API: a Kibotos Egress object does it (kibo egress create, then kibo workspace set-network --egress NAME)")
	case rules != nil:
		return api.Errorf(api.CodeInvalidArgument, "network.rules (header transforms) are not served by Kibotos: leave them out")
	}
	return nil
}

// networkOf is a sandbox's egress in E2B's terms: with an allow list
// only what it names is reached, which E2B says with the internet off.
// An Egress object of Kibotos's is the internet, through its exit.
func networkOf(ws *api.Workspace) (internet bool, info *networkInfo) {
	p := ws.Network.Effective()
	info = &networkInfo{AllowOut: p.Allow, DenyOut: p.Deny, AllowPublicTraffic: ws.Labels[TrafficLabel] != TrafficToken}
	return p.Egress != api.EgressNone && len(p.Allow) == 0, info
}

// networkUpdate is PUT /sandboxes/{id}/network's body: the whole egress
// configuration, as a create's (what it leaves out is not kept).
type networkUpdate struct {
	AllowInternetAccess *bool    `json:"allow_internet_access,omitempty"`
	AllowOut            []string `json:"allowOut,omitempty"`
	DenyOut             []string `json:"denyOut,omitempty"`
	EgressProxy         any      `json:"egressProxy,omitempty"`
	Rules               any      `json:"rules,omitempty"`
}

// updateNetwork is PUT /sandboxes/{id}/network: the sandbox's egress is
// replaced, answered once its node applied it (a paused sandbox's at its
// resume).
func (h *handler) updateNetwork(c *call) error {
	id := c.r.PathValue("id")
	var body networkUpdate
	if err := c.decode(&body); err != nil {
		return err
	}
	if err := notServedNetwork(body.EgressProxy, body.Rules); err != nil {
		return err
	}
	policy, err := egressPolicy(body.AllowInternetAccess, body.AllowOut, body.DenyOut)
	if err != nil {
		return err
	}
	if _, _, err := sandboxWorkspace(c, id); err != nil {
		return err
	}
	allow, deny := policy.Allow, policy.Deny
	if allow == nil {
		allow = []string{}
	}
	if deny == nil {
		deny = []string{}
	}
	req := api.WorkspaceNetworkRequest{NetworkChange: api.NetworkChange{Egress: &policy.Egress, Allow: &allow, Deny: &deny}}
	var ws api.Workspace
	if _, err := c.cl.Do(c.r.Context(), http.MethodPost, workspacePath(id, "network"), req, &ws); err != nil {
		return err
	}
	if p := ws.Pending; p != nil && p.Kind == api.WSCmdNetwork {
		if err := waitNetwork(c, id, p.CommandID); err != nil {
			return err
		}
	}
	return c.noContent()
}

// waitNetwork reads the Workspace until its node answered network change
// cmd: ok, or an error saying the sandbox keeps its egress.
func waitNetwork(c *call, id, cmd string) error {
	_, err := poll(c.r.Context(), c.cl, id, func(ws *api.Workspace) (bool, error) {
		if p := ws.Pending; p != nil && p.CommandID == cmd {
			return false, nil
		}
		if r := ws.NetworkChange; r != nil && r.CommandID == cmd {
			if r.Outcome == "ok" {
				return true, nil
			}
			return false, api.Errorf(api.CodeFailedPrecondition, "sandbox %s: its node did not apply the network change: %s; the sandbox keeps its egress", id, r.Error)
		}
		return false, api.Errorf(api.CodeFailedPrecondition, "sandbox %s is %s: its network change was not applied; the sandbox keeps its egress", id, strings.ToLower(ws.State))
	})
	return err
}
