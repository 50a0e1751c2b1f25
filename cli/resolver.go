package cli

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/kibotos/kibotos/api"
)

// ResolverCmd groups the Resolver object commands.
type ResolverCmd struct {
	Create ResolverCreateCmd `cmd:"" help:"Create a Resolver: the DNS upstreams of the Workspaces that name it (workspace --resolver NAME)."`
	List   ResolverListCmd   `cmd:"" help:"List Resolver objects, by name."`
	Get    ResolverGetCmd    `cmd:"" help:"Show one Resolver."`
	Delete ResolverDeleteCmd `cmd:"" help:"Delete a Resolver that no Workspace's network policy names."`
}

func resolverPath(name string, verb ...string) string {
	p := "/v1/resolvers/" + url.PathEscape(name)
	if len(verb) > 0 {
		p += "/" + verb[0]
	}
	return p
}

// ResolverCreateCmd is `resolver create`.
type ResolverCreateCmd struct {
	Name      string   `arg:"" name:"name" help:"1-63 lowercase letters, digits or '-'; not none, public or default."`
	Upstream  []string `name:"upstream" required:"" placeholder:"ADDR[:PORT]" help:"A DNS upstream: ADDR, ADDR:PORT, HOSTNAME or HOSTNAME:PORT (port 53 by default; [IPv6]:PORT); 1-8, repeat or comma-separate."`
	CommandID string   `name:"command-id" help:"Idempotency key."`
}

func (c *ResolverCreateCmd) Run(g *Globals) error {
	var r api.Resolver
	raw, err := g.call("POST", "/v1/resolvers", api.ResolverCreateRequest{WriteMeta: writeMeta(c.CommandID, nil), Name: c.Name, Upstreams: ruleFlags(c.Upstream)}, &r)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("resolver %s created: upstreams %s (version %d)\n", r.Name, strings.Join(r.Upstreams, ","), r.Version)
	return nil
}

// ResolverListCmd is `resolver list`.
type ResolverListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Resolvers per page (0: all)."`
	PageToken string `name:"page-token" help:"Continue after a previous page."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the names."`
}

func (c *ResolverListCmd) Run(g *Globals) error {
	var out api.ResolverList
	return runList(g, listCall{path: "/v1/resolvers", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "Resolvers"}, &out,
		func() ([]string, string) {
			names := make([]string, len(out.Resolvers))
			for i, r := range out.Resolvers {
				names[i] = r.Name
			}
			return names, out.NextPageToken
		},
		func() {
			t := newTable(g.stdout, g.namespaceFirst("NAMESPACE", []string{"NAME", "UPSTREAMS", "WORKSPACES", "VERSION"})...)
			for _, r := range out.Resolvers {
				t.row(g.namespaceFirst(api.ShownNamespace(r.Namespace), []string{r.Name, strings.Join(r.Upstreams, ","), itoa(r.Workspaces), strconv.FormatUint(r.Version, 10)})...)
			}
			t.flush()
		})
}

// ResolverGetCmd is `resolver get`.
type ResolverGetCmd struct {
	Name string `arg:"" name:"name"`
}

func (c *ResolverGetCmd) Run(g *Globals) error {
	var r api.Resolver
	raw, err := g.call("GET", resolverPath(c.Name), nil, &r)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	line := func(label, format string, args ...any) {
		g.printf("%-12s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("Name", "%s", r.Name)
	line("Upstreams", "%s", strings.Join(r.Upstreams, ","))
	line("Workspaces", "%d", r.Workspaces)
	line("Version", "%d", r.Version)
	line("Created", "%s", stamp(r.CreatedAt))
	return nil
}

// ResolverDeleteCmd is `resolver delete`.
type ResolverDeleteCmd struct {
	Name            string  `arg:"" name:"name"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Resolver must still be at."`
}

func (c *ResolverDeleteCmd) Run(g *Globals) error {
	raw, err := g.call("POST", resolverPath(c.Name, "delete"), writeMeta(c.CommandID, c.ExpectedVersion), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("resolver %s deleted\n", c.Name)
	return nil
}
