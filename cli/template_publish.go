package cli

import (
	"net/url"

	"github.com/kibotos/kibotos/api"
)

// TemplatePublishCmd is `template publish`.
type TemplatePublishCmd struct {
	Name            string  `arg:"" name:"name" help:"The template, as built on a node (kibo node get NODE lists a node's templates)."`
	FromNode        string  `name:"from-node" placeholder:"NODE" help:"The node whose build to publish; default: the one node that has the template (refused when several have it)."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the catalog entry must still be at (when it replaces one)."`
}

func (c *TemplatePublishCmd) Run(g *Globals) error {
	var t api.CatalogTemplate
	req := api.TemplatePublishRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), FromNode: c.FromNode}
	progress := "/v1/templates/" + url.PathEscape(c.Name) + "/publish-progress"
	if c.FromNode != "" {
		progress += "?" + url.Values{"from_node": {c.FromNode}}.Encode()
	}
	stop := g.following("template "+c.Name, "template "+c.Name+": publishing", progress)
	raw, err := g.call("POST", "/v1/templates/"+url.PathEscape(c.Name)+"/publish", req, &t)
	stop()
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("template %s published from node %s: %s, %s (version %d)\n", t.Name, t.PublishedBy, t.Digest, formatBytes(uint64(t.SizeBytes)), t.Version)
	return nil
}
