package cli

import (
	"net/url"
	"path/filepath"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/trust"
)

// OperatorCmd groups the personal operator credential commands.
type OperatorCmd struct {
	Issue  OperatorIssueCmd  `cmd:"" help:"Issue an operator credential for a person: a key made here and a certificate ctrl signs, written to --out."`
	List   OperatorListCmd   `cmd:"" help:"List the operator credentials ctrl issued."`
	Revoke OperatorRevokeCmd `cmd:"" help:"Revoke NAME's operator credential on every member."`
}

// OperatorIssueCmd issues a personal operator credential.
type OperatorIssueCmd struct {
	Name      string `arg:"" name:"name" help:"Name of the operator (1-63 letters, digits, '.', '_' or '-'); issuing it again replaces the earlier credential."`
	TTL       string `name:"ttl" help:"How long the credential is valid, e.g. 72h or 30d: at least 1h, at most 30d (the default)."`
	Out       string `name:"out" required:"" help:"Directory to write ca.crt, operator.crt and operator.key to (made 0700; files 0600)."`
	Force     bool   `name:"force" help:"Replace the files of an existing credential in --out."`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *OperatorIssueCmd) Run(g *Globals) error {
	// Checked before ctrl signs anything: a refused --out issues nothing.
	if !c.Force {
		if err := credentialsFree(c.Out); err != nil {
			return err
		}
	}
	// The key is made here and never leaves this host: ctrl gets the
	// public half.
	key, err := trust.NewKey()
	if err != nil {
		return err
	}
	keyPEM, err := trust.EncodeKey(key)
	if err != nil {
		return err
	}
	var out api.OperatorIssueResponse
	raw, err := g.call("POST", "/v1/operators", api.OperatorIssueRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name, PublicKey: trust.PublicKeyPEM(&key.PublicKey), TTL: c.TTL}, &out)
	if err != nil {
		return err
	}
	if err := writeCredentials(c.Out, []byte(out.CACert), []byte(out.Cert), keyPEM, c.Force); err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	dir, _ := filepath.Abs(c.Out)
	g.printf("operator %s: credential written to %s, valid until %s\n", out.Operator.Name, dir, stamp(out.Operator.ExpiresAt))
	g.note("Hand %s to %s (it holds the private key). Use it with --credentials %s, KIBOTOS_CREDENTIALS=%s, or as %s; revoke it with kibo operator revoke %s\n",
		dir, out.Operator.Name, dir, dir, dashIfEmpty(userCredentialsDir()), out.Operator.Name)
	return nil
}

// OperatorListCmd lists personal operator credentials.
type OperatorListCmd struct {
	Quiet bool `short:"q" name:"quiet" help:"Print only the names."`
}

func (c *OperatorListCmd) Run(g *Globals) error {
	var out []api.Operator
	raw, err := g.call("GET", "/v1/operators", nil, &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	if c.Quiet {
		for _, o := range out {
			g.printf("%s\n", o.Name)
		}
		return nil
	}
	t := newTable(g.stdout, "NAME", "ISSUED", "EXPIRES", "ISSUED BY", "STATE")
	for _, o := range out {
		t.row(o.Name, stamp(o.IssuedAt), stamp(o.ExpiresAt), o.IssuedBy, o.State)
	}
	t.flush()
	return nil
}

// OperatorRevokeCmd revokes a personal operator credential.
type OperatorRevokeCmd struct {
	Name      string `arg:"" name:"name"`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *OperatorRevokeCmd) Run(g *Globals) error {
	var out api.Operator
	raw, err := g.call("POST", "/v1/operators/"+url.PathEscape(c.Name)+"/revoke", writeMeta(c.CommandID, nil), &out)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	at := "now"
	if out.RevokedAt != nil {
		at = stamp(*out.RevokedAt)
	}
	g.printf("operator %s: revoked at %s; its certificate is refused on every member\n", out.Name, at)
	return nil
}
