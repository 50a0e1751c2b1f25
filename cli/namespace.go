package cli

import (
	"net/url"

	"github.com/kibotos/kibotos/api"
)

// NamespaceCmd groups the namespace commands (operators).
type NamespaceCmd struct {
	Create NamespaceCreateCmd `cmd:"" help:"Create a namespace: a tenant's own Workspaces, Volumes and API keys."`
	List   NamespaceListCmd   `cmd:"" help:"List the namespaces with what each holds."`
	Get    NamespaceGetCmd    `cmd:"" help:"Show a namespace and what it holds."`
	Delete NamespaceDeleteCmd `cmd:"" help:"Delete an empty namespace (its API keys go with it)."`
}

// NamespaceCreateCmd is `namespace create`.
type NamespaceCreateCmd struct {
	Name      string `arg:"" name:"name" help:"1-63 lower-case letters, digits or '-'."`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceCreateCmd) Run(g *Globals) error {
	var ns api.Namespace
	raw, err := g.call("POST", "/v1/namespaces", api.NamespaceCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name}, &ns)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("namespace %s created\n", ns.Name)
	g.note("Give it an API key: kibo api-key create NAME --namespace %s --role sandbox\n", ns.Name)
	return nil
}

// NamespaceListCmd is `namespace list`.
type NamespaceListCmd struct {
	Quiet bool `short:"q" name:"quiet" help:"Print only the names."`
}

func (c *NamespaceListCmd) Run(g *Globals) error {
	var out []api.Namespace
	return runList(g, listCall{path: "/v1/namespaces", quiet: c.Quiet, what: "namespaces"}, &out,
		func() ([]string, string) {
			names := make([]string, len(out))
			for i, ns := range out {
				names[i] = ns.Name
			}
			return names, ""
		},
		func() {
			t := newTable(g.stdout, "NAME", "WORKSPACES", "VOLUMES", "API KEYS", "CREATED")
			for _, ns := range out {
				created := "-"
				if !ns.CreatedAt.IsZero() {
					created = stamp(ns.CreatedAt)
				}
				t.row(ns.Name, itoa(ns.Usage.Workspaces), itoa(ns.Usage.Volumes), itoa(ns.Usage.APIKeys), created)
			}
			t.flush()
		})
}

// NamespaceGetCmd is `namespace get`.
type NamespaceGetCmd struct {
	Name string `arg:"" name:"name"`
}

func (c *NamespaceGetCmd) Run(g *Globals) error {
	var ns api.Namespace
	raw, err := g.call("GET", "/v1/namespaces/"+url.PathEscape(c.Name), nil, &ns)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	line := kv{g.stdout}.line
	line("Name", "%s", ns.Name)
	if !ns.CreatedAt.IsZero() {
		line("Created", "%s by %s", stamp(ns.CreatedAt), dash(ns.CreatedBy))
	}
	line("Workspaces", "%d", ns.Usage.Workspaces)
	line("Volumes", "%d", ns.Usage.Volumes)
	line("API keys", "%d", ns.Usage.APIKeys)
	return nil
}

// NamespaceDeleteCmd is `namespace delete`.
type NamespaceDeleteCmd struct {
	Name      string `arg:"" name:"name"`
	CommandID string `name:"command-id" help:"Idempotency key."`
}

func (c *NamespaceDeleteCmd) Run(g *Globals) error {
	raw, err := g.call("POST", "/v1/namespaces/"+url.PathEscape(c.Name)+"/delete", writeMeta(c.CommandID, nil), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("namespace %s deleted\n", c.Name)
	return nil
}
