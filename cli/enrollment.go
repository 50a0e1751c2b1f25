package cli

import (
	"strings"

	"github.com/kibotos/kibotos/api"
)

// EnrollmentCmd groups the grant commands.
type EnrollmentCmd struct {
	Grant  EnrollmentGrantCmd  `cmd:"" help:"Print a single-use, expiring grant that admits one host as NODE_ID."`
	Revoke EnrollmentRevokeCmd `cmd:"" help:"Revoke the pending grant of NODE_ID and, if it joined, its admission."`
	List   EnrollmentListCmd   `cmd:"" help:"List enrollment grants."`
}

// EnrollmentGrantCmd issues a grant.
type EnrollmentGrantCmd struct {
	NodeID    string   `arg:"" name:"node-id" help:"Node id the grant admits."`
	Roles     []string `name:"roles" default:"node" help:"Roles of the new member: node, ctrl or ctrl,node; node,operator also gives its host an operator credential (logged)."`
	TTL       string   `name:"ttl" default:"1h" help:"How long the grant stays valid."`
	CommandID string   `name:"command-id" help:"Idempotency key."`
}

func (c *EnrollmentGrantCmd) Run(g *Globals) error {
	var out api.GrantResponse
	raw, err := g.call("POST", "/v1/enrollment/grants", api.GrantRequest{WriteMeta: writeMeta(c.CommandID, nil), NodeID: c.NodeID, Roles: c.Roles, TTL: c.TTL}, &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	if out.Token == "" { // a ctrl of an earlier release, which kept no way to show it again
		g.note("grant for node %s was already issued with command id %s; its token is shown only once\n", c.NodeID, c.CommandID)
		return nil
	}
	g.printf("%s\n", out.Token)
	g.note("Grant for node %s (roles %s) expires at %s. On the new host run:\n  kibotos join --data-dir /var/lib/kibotos --advertise HOST:PORT --grant <grant> MEMBER_ADDR\n",
		c.NodeID, strings.Join(out.Grant.Roles, ","), stamp(out.Grant.ExpiresAt))
	return nil
}

// EnrollmentRevokeCmd revokes a grant or an admission.
type EnrollmentRevokeCmd struct {
	NodeID    string `arg:"" name:"node-id"`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *EnrollmentRevokeCmd) Run(g *Globals) error {
	var out struct {
		GrantRevoked bool `json:"grant_revoked"`
		NodeRevoked  bool `json:"node_revoked"`
	}
	raw, err := g.call("POST", "/v1/enrollment/grants/"+c.NodeID+"/revoke", writeMeta(c.CommandID, nil), &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("node %s: pending grant revoked: %s; admission revoked: %s\n", c.NodeID, yesNo(out.GrantRevoked), yesNo(out.NodeRevoked))
	return nil
}

// EnrollmentListCmd lists grants.
type EnrollmentListCmd struct {
	Quiet bool `short:"q" name:"quiet" help:"Print only the node ids of the grants."`
}

func (c *EnrollmentListCmd) Run(g *Globals) error {
	var out []api.Grant
	raw, err := g.call("GET", "/v1/enrollment/grants", nil, &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	if c.Quiet {
		for _, gr := range out {
			g.printf("%s\n", gr.NodeID)
		}
		return nil
	}
	t := newTable(g.stdout, "NODE_ID", "ROLES", "STATE", "ISSUED", "EXPIRES")
	for _, gr := range out {
		t.row(gr.NodeID, strings.Join(gr.Roles, ","), gr.State, stamp(gr.IssuedAt), stamp(gr.ExpiresAt))
	}
	t.flush()
	return nil
}
