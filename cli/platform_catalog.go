package cli

import (
	"fmt"
	"net/url"

	"github.com/kibotos/kibotos/api"
)

// PlatformPublishCmd is `platform publish`.
type PlatformPublishCmd struct {
	FromNode        string  `name:"from-node" placeholder:"NODE" help:"The node whose Platform to publish; default: the cluster's only node."`
	Platform        string  `name:"platform" placeholder:"ID" help:"Which of that node's Platforms (kibotos platform list --local there); default: its own, whose guest agent is the kibotos it runs."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the catalog entry must still be at (when it is published again)."`
}

func (c *PlatformPublishCmd) Run(g *Globals) error {
	var p api.CatalogPlatform
	req := api.PlatformPublishRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), FromNode: c.FromNode, PlatformID: c.Platform}
	q := url.Values{}
	if c.FromNode != "" {
		q.Set("from_node", c.FromNode)
	}
	if c.Platform != "" {
		q.Set("platform", c.Platform)
	}
	stop := g.following("platform", "platform: publishing", "/v1/platforms/publish-progress?"+q.Encode())
	raw, err := g.call("POST", "/v1/platforms/publish", req, &p)
	stop()
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("%s\n", p.PlatformID)
	g.note("platform %s (kernel series %s) published from node %s: %s, %s; approve it to make it the default of its series: kibo platform approve %s\n",
		shortID(p.PlatformID), p.KernelSeries, p.PublishedBy, shortDigest(p.Digest), formatBytes(uint64(p.SizeBytes)), p.PlatformID)
	return nil
}

// PlatformApproveCmd is `platform approve`.
type PlatformApproveCmd struct {
	Platform        string  `arg:"" name:"platform" help:"Platform id (kibo platform list)."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the catalog entry must still be at."`
}

func (c *PlatformApproveCmd) Run(g *Globals) error {
	var p api.CatalogPlatform
	raw, err := g.call("POST", "/v1/platforms/"+url.PathEscape(c.Platform)+"/approve", writeMeta(c.CommandID, c.ExpectedVersion), &p)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("platform %s approved: the default of kernel series %s\n", p.PlatformID, p.KernelSeries)
	return nil
}

// PlatformWithdrawCmd is `platform withdraw`.
type PlatformWithdrawCmd struct {
	Platform        string  `arg:"" name:"platform" help:"Platform id (kibo platform list)."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the catalog entry must still be at."`
}

func (c *PlatformWithdrawCmd) Run(g *Globals) error {
	raw, err := g.call("POST", "/v1/platforms/"+url.PathEscape(c.Platform)+"/withdraw", writeMeta(c.CommandID, c.ExpectedVersion), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("platform %s withdrawn from the catalog (the archive stays in the artifact store and the installations on the nodes)\n", c.Platform)
	return nil
}

// runCatalog lists the catalog: ID, KERNEL SERIES, APPROVED, DEFAULT.
func (c *PlatformListCmd) runCatalog(g *Globals) error {
	var out api.CatalogPlatformList
	return runList(g, listCall{path: "/v1/platforms", quiet: c.Quiet, what: "platforms"}, &out,
		func() ([]string, string) {
			ids := make([]string, len(out.Platforms))
			for i, p := range out.Platforms {
				ids[i] = p.PlatformID
			}
			return ids, out.NextPageToken
		},
		func() {
			t := newTable(g.stdout, "ID", "KERNEL SERIES", "APPROVED", "DEFAULT", "KERNEL", "AGENT", "SIZE", "PUBLISHED")
			for _, p := range out.Platforms {
				agent := p.AgentRelease
				if agent == "" {
					agent = fmt.Sprintf("unreleased %.12s", p.AgentSHA256)
				}
				t.row(p.PlatformID, p.KernelSeries, yesNo(p.Approved), yesNo(p.Default), p.KernelVersion, agent, formatBytes(uint64(p.SizeBytes)), stamp(p.PublishedAt)+" by "+p.PublishedBy)
			}
			t.flush()
		})
}
