package cli

import (
	"net/url"
	"time"

	"github.com/kibotos/kibotos/api"
)

// APIKeyCmd groups the API key commands: operators, and namespace-admin
// keys for their own namespace.
type APIKeyCmd struct {
	Create APIKeyCreateCmd `cmd:"" help:"Create an API key of a namespace; its secret is printed once."`
	List   APIKeyListCmd   `cmd:"" help:"List the API keys of a namespace (--all-namespaces: every one)."`
	Revoke APIKeyRevokeCmd `cmd:"" help:"Revoke an API key: refused on every ctrl member within a heartbeat."`
}

// APIKeyCreateCmd is `api-key create`. The secret is drawn here and only
// its hash goes to ctrl: a retry records the same key, and the secret
// never crosses the network.
type APIKeyCreateCmd struct {
	Name      string `arg:"" name:"name" help:"Name of the key within its namespace (1-63 letters, digits, '.', '_' or '-')."`
	Role      string `name:"role" default:"sandbox" enum:"sandbox,namespace-admin" help:"sandbox: the namespace's Workspaces and Volumes; namespace-admin: also its API keys."`
	Expires   string `name:"expires" help:"Lifetime, e.g. 90d or 12h; default: none."`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *APIKeyCreateCmd) Run(g *Globals) error {
	ns := g.Namespace
	if ns == "" {
		ns = api.DefaultNamespace
	}
	id, secret, hash := api.NewKeySecret()
	var out api.APIKey
	_, err := g.call("POST", "/v1/api-keys", api.APIKeyCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name, Namespace: ns, Role: c.Role, TTL: c.Expires, KeyID: id, SecretHash: hash}, &out)
	if err != nil {
		return err
	}
	if out.KeyID != id {
		// A replay of a command that recorded another key: its secret
		// was printed then, and is not known here.
		return api.Errorf(api.CodeFailedPrecondition, "API key %s: command %s recorded another key (%s); its secret was shown when it was created; revoke it or use a new --command-id", c.Name, c.CommandID, out.KeyID)
	}
	if g.JSON {
		return printResult(g, api.APIKeyCreated{APIKey: out, Secret: secret})
	}
	g.printf("%s\n", secret)
	expires := "never"
	if out.ExpiresAt != nil {
		expires = stamp(*out.ExpiresAt)
	}
	g.note("API key %s of namespace %s (role %s, expires %s): the secret above is shown only now. Use it as KIBOTOS_TOKEN, or as Authorization: Bearer in API calls\n", out.Name, out.Namespace, out.Role, expires)
	return nil
}

// APIKeyListCmd is `api-key list`.
type APIKeyListCmd struct {
	Quiet bool `short:"q" name:"quiet" help:"Print only the names."`
}

func (c *APIKeyListCmd) Run(g *Globals) error {
	var out []api.APIKey
	return runList(g, listCall{path: "/v1/api-keys", quiet: c.Quiet, what: "API keys"}, &out,
		func() ([]string, string) {
			names := make([]string, len(out))
			for i, k := range out {
				names[i] = k.Name
			}
			return names, ""
		},
		func() {
			t := newTable(g.stdout, "NAME", "NAMESPACE", "ROLE", "CREATED", "EXPIRES", "LAST USED", "STATE")
			optional := func(t *time.Time, none string) string {
				if t == nil {
					return none
				}
				return stamp(*t)
			}
			for _, k := range out {
				t.row(k.Name, k.Namespace, k.Role, stamp(k.CreatedAt), optional(k.ExpiresAt, "never"), optional(k.LastUsedAt, "never"), k.State)
			}
			t.flush()
		})
}

// APIKeyRevokeCmd is `api-key revoke`.
type APIKeyRevokeCmd struct {
	Name      string `arg:"" name:"name"`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *APIKeyRevokeCmd) Run(g *Globals) error {
	var out api.APIKey
	raw, err := g.call("POST", "/v1/api-keys/"+url.PathEscape(c.Name)+"/revoke", writeMeta(c.CommandID, nil), &out)
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
	g.printf("API key %s of namespace %s: revoked at %s; it is refused on every ctrl member\n", out.Name, out.Namespace, at)
	return nil
}
