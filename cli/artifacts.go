package cli

import (
	"fmt"
	"time"

	"github.com/kibotos/kibotos/api"
)

// ArtifactsCmd groups the commands on the cluster's artifact store.
type ArtifactsCmd struct {
	GC ArtifactsGCCmd `cmd:"" name:"gc" help:"Remove the store's objects no catalog entry references any more (templates published again or deleted, Platforms withdrawn)."`
}

// ArtifactsGCCmd is `artifacts gc`.
type ArtifactsGCCmd struct {
	DryRun    bool           `name:"dry-run" help:"List what would be removed; remove nothing."`
	OlderThan *time.Duration `name:"older-than" placeholder:"AGE" help:"Remove only objects written at least this long ago; default 24h."`
	Quiet     bool           `short:"q" name:"quiet" help:"Print only the digests removed (or, with --dry-run, that would be)."`
}

func (c *ArtifactsGCCmd) Run(g *Globals) error {
	req := api.ArtifactsGCRequest{DryRun: c.DryRun}
	if c.OlderThan != nil {
		secs := int64(*c.OlderThan / time.Second)
		req.OlderThanSeconds = &secs
	}
	var res api.ArtifactsGCResult
	raw, err := g.call("POST", "/v1/artifacts/gc", req, &res)
	if err != nil {
		return err
	}
	failed := 0
	for _, o := range res.Objects {
		if o.Action == api.GCFailed {
			failed++
		}
	}
	switch {
	case g.JSON:
		if err := g.printJSON(raw); err != nil {
			return err
		}
	case c.Quiet:
		for _, o := range res.Objects {
			if o.Action == api.GCRemoved || o.Action == api.GCWouldRemove {
				g.printf("%s\n", o.Digest)
			}
		}
	default:
		t := newTable(g.stdout, "DIGEST", "SIZE", "WRITTEN", "ACTION")
		for _, o := range res.Objects {
			action := o.Action
			if o.Error != "" {
				action += ": " + o.Error
			}
			t.row(shortDigest(o.Digest), formatBytes(uint64(o.SizeBytes)), stamp(o.Modified), action)
		}
		t.flush()
		verb := "removed"
		if res.DryRun {
			verb = "would remove"
		}
		g.note("%d objects referenced by the catalog kept; %s %s\n", res.Referenced, verb, formatBytes(uint64(res.RemovedBytes+wouldRemove(res))))
	}
	if failed > 0 {
		return exitError{api.ExitUnavailable, fmt.Sprintf("artifacts gc: %d objects could not be removed (see the table); run it again once the store takes writes", failed)}
	}
	return nil
}

// wouldRemove is the size a dry run would have removed.
func wouldRemove(res api.ArtifactsGCResult) int64 {
	var n int64
	for _, o := range res.Objects {
		if o.Action == api.GCWouldRemove {
			n += o.SizeBytes
		}
	}
	return n
}
