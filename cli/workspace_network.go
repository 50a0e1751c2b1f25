package cli

import (
	"fmt"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// WorkspaceSetNetworkCmd is `workspace set-network`.
type WorkspaceSetNetworkCmd struct {
	WaitFlags
	ID              string   `arg:"" name:"workspace"`
	Egress          *string  `name:"egress" placeholder:"none|public|NAME" help:"Outbound traffic: none, public, or the name of an Egress object."`
	Resolver        *string  `name:"resolver" placeholder:"NAME|default" help:"Resolver object DNS queries go to; default: the deployment resolver."`
	Allow           []string `name:"allow" placeholder:"CIDR|DOMAIN" help:"Replace the allow list of public egress: CIDRs and domains (example.com, *.example.com); repeat or comma-separate."`
	Deny            []string `name:"deny" placeholder:"CIDR|DOMAIN" help:"Replace the deny list of public egress: CIDRs and domains; repeat or comma-separate."`
	ClearAllow      bool     `name:"clear-allow" help:"Empty the allow list."`
	ClearDeny       bool     `name:"clear-deny" help:"Empty the deny list."`
	CommandID       string   `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64  `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool     `name:"no-wait" help:"Return once ctrl accepted the change instead of when the node applied it."`
}

func (c *WorkspaceSetNetworkCmd) Run(g *Globals) error {
	if len(c.Allow) > 0 && c.ClearAllow {
		return usagef("--allow and --clear-allow are exclusive: --allow replaces the list, --clear-allow empties it")
	}
	if len(c.Deny) > 0 && c.ClearDeny {
		return usagef("--deny and --clear-deny are exclusive: --deny replaces the list, --clear-deny empties it")
	}
	var ch api.NetworkChange
	if c.Egress != nil {
		ch.Egress = c.Egress
	}
	if c.Resolver != nil {
		r := resolverFlag(*c.Resolver)
		ch.Resolver = &r
	}
	switch {
	case c.ClearAllow:
		ch.Allow = &[]string{} // [] on the wire: empty, not unchanged
	case len(c.Allow) > 0:
		l := ruleFlags(c.Allow)
		ch.Allow = &l
	}
	switch {
	case c.ClearDeny:
		ch.Deny = &[]string{}
	case len(c.Deny) > 0:
		l := ruleFlags(c.Deny)
		ch.Deny = &l
	}
	if ch == (api.NetworkChange{}) {
		return usagef("give what to change: --egress, --resolver, --allow, --deny, --clear-allow or --clear-deny")
	}
	req := api.WorkspaceNetworkRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), NetworkChange: ch}
	var ws api.Workspace
	raw, err := g.call("POST", workspacePath(c.ID, "network"), req, &ws)
	if err != nil {
		return err
	}
	how := "stored; its node applies it at the next start"
	policy := policySummary(ws.Network.Effective())
	if p := ws.Pending; p != nil && p.Kind == api.WSCmdNetwork {
		policy = policySummary(p.Network.Effective()) + " requested"
		how = "sent to node " + p.NodeID + "; kibo workspace get " + c.ID + " shows its answer"
		if !c.NoWait {
			final, err := pollWorkspace(g, c.ID, networkSettled(c.ID, p.CommandID))
			if err != nil {
				return err
			}
			ws, raw, how = *final, nil, "applied by node "+p.NodeID
			policy = policySummary(ws.Network.Effective())
		}
	} else if ws.State == api.WorkspaceAvailable {
		how = "in force on node " + ws.NodeID // it had that policy already
	}
	switch {
	case g.JSON && raw != nil:
		return g.printJSON(raw)
	case g.JSON:
		return printResult(g, &ws)
	}
	g.printf("workspace %s network policy: %s (%s; version %d)\n", ws.WorkspaceID, policy, how, ws.Version)
	return nil
}

// networkSettled waits for the node's answer to network command cmd of
// Workspace id: ok ends the wait; a failure on the node, or anything that
// ended the command without an answer (a stop, the Instance ending), is
// an error that says the policy did not change.
func networkSettled(id, cmd string) func(ws *api.Workspace) (bool, error) {
	return func(ws *api.Workspace) (bool, error) {
		if ws == nil {
			return false, exitError{api.ExitNotFound, fmt.Sprintf("workspace %s was deleted before its node answered the network change", id)}
		}
		if p := ws.Pending; p != nil && p.CommandID == cmd {
			return false, nil
		}
		in := policySummary(ws.Network.Effective())
		if c := ws.NetworkChange; c != nil && c.CommandID == cmd {
			if c.Outcome == "ok" {
				return true, nil
			}
			return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s: node %s did not apply the network policy: %s; the Workspace keeps %s", id, c.NodeID, c.Error, in)}
		}
		if ws.State == api.WorkspaceFailed {
			return false, failedError(ws)
		}
		return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("workspace %s is %s: its network change was not applied (a later command replaced it); the Workspace keeps %s", id, ws.State, in)}
	}
}

// resolverFlag reads --resolver: "default" is the deployment resolver.
func resolverFlag(s string) string {
	if s == "default" {
		return ""
	}
	return s
}

// ruleFlags trims the rules of --allow and --deny ("10.0.0.0/8, 10.1.0.0/16"
// splits with a space).
func ruleFlags(in []string) []string {
	out := make([]string, len(in))
	for i, r := range in {
		out[i] = strings.TrimSpace(r)
	}
	return out
}

// createPolicy is the policy of create's flags; nil when none is given
// (egress none).
func createPolicy(egress, resolver string, allow, deny []string) *api.NetworkPolicy {
	if egress == "" && resolver == "" && len(allow) == 0 && len(deny) == 0 {
		return nil
	}
	return &api.NetworkPolicy{Egress: egress, Resolver: resolverFlag(resolver), Allow: ruleFlags(allow), Deny: ruleFlags(deny)}
}

// policySummary is one line: "egress public, allow 10.0.0.0/8".
func policySummary(p api.NetworkPolicy) string {
	s := "egress " + egressColumn(p)
	if p.Resolver != "" {
		s += ", resolver " + p.Resolver
	}
	if len(p.Allow) > 0 {
		s += ", allow " + strings.Join(p.Allow, ",")
	}
	if len(p.Deny) > 0 {
		s += ", deny " + strings.Join(p.Deny, ",")
	}
	return s
}

// egressColumn is the egress of a policy, with the revision of an Egress
// object: "corp (revision 2)".
func egressColumn(p api.NetworkPolicy) string {
	if p.EgressRevision == 0 {
		return p.Egress
	}
	return fmt.Sprintf("%s (revision %d)", p.Egress, p.EgressRevision)
}
