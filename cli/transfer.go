package cli

import (
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/kibotos/kibotos/api"
)

// TransferCmd groups the Transfer commands: a stopped Workspace's layer,
// Volumes and shape as one archive in the artifact store, from which a new
// Workspace is made in this or another cluster that reaches the store.
type TransferCmd struct {
	Export TransferExportCmd `cmd:"" help:"Write a Workspace's layer, Volumes and shape into the artifact store as a Transfer: a STOPPED one as it is, an AVAILABLE one paused while its disks are copied."`
	Get    TransferGetCmd    `cmd:"" help:"Show one Transfer."`
	List   TransferListCmd   `cmd:"" help:"List the Transfers."`
	Import TransferImportCmd `cmd:"" help:"Make a new Workspace from a Transfer (this cluster's, or another's in the same store: --namespace)."`
	Delete TransferDeleteCmd `cmd:"" help:"Remove a Transfer and its archive."`
}

// TransferExportCmd is `transfer export`.
type TransferExportCmd struct {
	WaitFlags
	Workspace       string        `arg:"" name:"workspace" help:"The Workspace (STOPPED, or AVAILABLE: paused while its disks are copied)."`
	TTL             time.Duration `name:"ttl" help:"How long the Transfer and its archive are kept; default 168h (7 days), at most 2160h."`
	CommandID       string        `name:"command-id" help:"Idempotency key (the Transfer id is derived from it)."`
	ExpectedVersion *uint64       `name:"expected-version" help:"Version the Workspace must still be at."`
	NoWait          bool          `name:"no-wait" help:"Return once ctrl accepted the export instead of when it is READY."`
	Quiet           bool          `short:"q" name:"quiet" help:"Print only the Transfer id."`
}

func (c *TransferExportCmd) Run(g *Globals) error {
	req := api.TransferExportRequest{WriteMeta: writeMeta(c.CommandID, c.ExpectedVersion), WorkspaceID: c.Workspace, Namespace: g.Namespace, TTLSeconds: int64(c.TTL / time.Second)}
	var tr api.Transfer
	raw, err := g.call("POST", "/v1/transfers", req, &tr)
	if err != nil {
		return err
	}
	if !c.NoWait {
		final, err := waitTransfer(g, tr.TransferID)
		if err != nil {
			return err
		}
		tr, raw = *final, nil
	}
	switch {
	case c.Quiet:
		g.printf("%s\n", tr.TransferID)
	case g.JSON && raw != nil:
		return g.printJSON(raw)
	case g.JSON:
		return printResult(g, &tr)
	default:
		g.printf("transfer %s of workspace %s: %s%s\n", tr.TransferID, tr.WorkspaceID, tr.State, sizeNote(&tr))
	}
	return nil
}

func sizeNote(tr *api.Transfer) string {
	if tr.State != api.TransferReady {
		return ""
	}
	return fmt.Sprintf(", %s at %s", formatBytes(uint64(tr.SizeBytes)), tr.ArchiveKey())
}

// waitTransfer polls until the Transfer is READY; FAILED is exit 13 with
// its error. On a terminal a bar shows the bytes its node wrote so far.
func waitTransfer(g *Globals, id string) (*api.Transfer, error) {
	bar := g.progress(true, "transfer "+id, 0)
	tr, err := pollObject(g, "/v1/transfers/"+url.PathEscape(id), func(t *api.Transfer) uint64 { return t.Version },
		func(t *api.Transfer) (bool, error) {
			switch {
			case t == nil:
				return false, api.Errorf(api.CodeNotFound, "transfer %s is gone", id)
			case t.State == api.TransferReady:
				bar.total = t.SizeBytes
				bar.set(bar.name, t.SizeBytes)
				bar.done()
				return true, nil
			case t.State == api.TransferFailed:
				bar.abandon()
				return false, exitError{api.ExitFailedPrecondition, fmt.Sprintf("transfer %s FAILED: %s", id, t.Error)}
			}
			if t.TotalBytes > 0 {
				bar.total = t.TotalBytes
				bar.set(bar.name, t.DoneBytes)
			}
			return false, nil
		},
		func(t *api.Transfer) error {
			return exitError{api.ExitTimedOut, fmt.Sprintf("transfer %s is still %s after %s; it goes on in the background: check with kibo transfer get %s", id, t.State, g.Timeout, id)}
		})
	return tr, err
}

// TransferGetCmd is `transfer get`.
type TransferGetCmd struct {
	Transfer string `arg:"" name:"transfer"`
}

func (c *TransferGetCmd) Run(g *Globals) error {
	var tr api.Transfer
	raw, err := g.call("GET", "/v1/transfers/"+url.PathEscape(c.Transfer), nil, &tr)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	t := kv{g.stdout}
	t.line("ID", "%s", tr.TransferID)
	t.line("State", "%s", tr.State)
	if tr.Error != "" {
		t.line("Error", "%s", tr.Error)
	}
	t.line("Workspace", "%s", tr.WorkspaceID)
	t.line("Node", "%s", tr.NodeID)
	t.line("Template", "%s %s", tr.Shape.Template, dash(tr.Shape.TemplateID))
	t.line("CPU", "%s", tr.Shape.CPU)
	t.line("Memory", "%s", formatBytes(tr.Shape.MemoryBytes))
	for _, v := range tr.Shape.Volumes {
		t.line("Volume", "%s %s", v.Path, formatBytes(v.SizeBytes))
	}
	t.line("Archive", "%s", tr.ArchiveKey())
	if tr.State == api.TransferExporting && tr.TotalBytes > 0 {
		t.line("Progress", "%s", progressText(&tr))
	}
	if tr.State == api.TransferReady {
		t.line("Size", "%s", formatBytes(uint64(tr.SizeBytes)))
		t.line("Digest", "%s", tr.Digest)
	}
	t.line("Created", "%s", stamp(tr.CreatedAt))
	t.line("Expires", "%s", stamp(tr.ExpiresAt))
	t.line("Version", "%d", tr.Version)
	return nil
}

// kv prints the "label: value" lines of workspace get and transfer get;
// an empty label continues the line above.
type kv struct{ w io.Writer }

func (k kv) line(label, format string, args ...any) {
	if label != "" {
		label += ":"
	}
	fmt.Fprintf(k.w, "%-18s %s\n", label, fmt.Sprintf(format, shown(args)...))
}

// TransferListCmd is `transfer list`.
type TransferListCmd struct {
	PageSize  int    `name:"page-size" default:"0" help:"Transfers per page (0: all)."`
	PageToken string `name:"page-token" help:"Continue after a previous page."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the Transfer ids."`
}

func (c *TransferListCmd) Run(g *Globals) error {
	var out api.TransferList
	return runList(g, listCall{path: "/v1/transfers", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "transfers"}, &out,
		func() ([]string, string) {
			ids := make([]string, len(out.Transfers))
			for i, t := range out.Transfers {
				ids[i] = t.TransferID
			}
			return ids, out.NextPageToken
		},
		func() {
			t := newTable(g.stdout, "ID", "STATE", "WORKSPACE", "NODE", "TEMPLATE", "SIZE", "CREATED", "EXPIRES")
			for _, tr := range out.Transfers {
				size := "-"
				switch {
				case tr.State == api.TransferReady:
					size = formatBytes(uint64(tr.SizeBytes))
				case tr.TotalBytes > 0:
					size = progressText(&tr)
				}
				t.row(tr.TransferID, tr.State, tr.WorkspaceID, tr.NodeID, tr.Shape.Template, size, stamp(tr.CreatedAt), stamp(tr.ExpiresAt))
			}
			t.flush()
		})
}

// TransferImportCmd is `transfer import`.
type TransferImportCmd struct {
	WaitFlags
	Transfer  string `arg:"" name:"transfer"`
	Node      string `name:"node" help:"Start the new Workspace on this node only."`
	CommandID string `name:"command-id" help:"Idempotency key (the Workspace id is derived from it)."`
	NoWait    bool   `name:"no-wait" help:"Return once ctrl accepted the Workspace instead of when it is AVAILABLE."`
	Quiet     bool   `short:"q" name:"quiet" help:"Print only the Workspace id."`
}

func (c *TransferImportCmd) Run(g *Globals) error {
	req := api.TransferImportRequest{WriteMeta: writeMeta(c.CommandID, nil), Namespace: g.Namespace, NodeID: c.Node}
	var ws api.Workspace
	raw, err := g.call("POST", "/v1/transfers/"+url.PathEscape(c.Transfer)+"/import", req, &ws)
	if err != nil {
		return err
	}
	if !c.NoWait {
		final, err := waitWorkspace(g, ws.WorkspaceID, api.WorkspaceAvailable)
		if err != nil {
			return err
		}
		ws, raw = *final, nil
	}
	return printWorkspaceResult(g, raw, &ws, c.Quiet, "imported from "+c.Transfer)
}

// TransferDeleteCmd is `transfer delete`.
type TransferDeleteCmd struct {
	Transfer        string  `arg:"" name:"transfer"`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the Transfer must still be at."`
}

func (c *TransferDeleteCmd) Run(g *Globals) error {
	raw, err := g.call("POST", "/v1/transfers/"+url.PathEscape(c.Transfer)+"/delete", writeMeta(c.CommandID, c.ExpectedVersion), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("transfer %s deleted with its archive\n", c.Transfer)
	return nil
}

// progressText is an export's "42% of 1.2GiB".
func progressText(tr *api.Transfer) string {
	return fmt.Sprintf("%d%% of %s", tr.DoneBytes*100/tr.TotalBytes, formatBytes(uint64(tr.TotalBytes)))
}
