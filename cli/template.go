package cli

import (
	"errors"
	"fmt"
	"net/url"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/template"
)

// TemplateCmd groups the template commands. A template is built on a node;
// published, it is in the cluster's catalog and any node can fetch it
// from the artifact store.
type TemplateCmd struct {
	Build   TemplateBuildCmd   `cmd:"" help:"Build a template (ext4 root filesystem image) from a directory, a rootfs tarball, an OCI/Docker image (a file or a registry), a Debian release (debootstrap) or busybox."`
	Publish TemplatePublishCmd `cmd:"" help:"Put a template a node built into the artifact store and record it in the cluster's catalog."`
	List    TemplateListCmd    `cmd:"" help:"List the templates Workspaces can be created from: the cluster's catalog and those nodes built and did not publish (--local: the templates built on this host)."`
	Get     TemplateGetCmd     `cmd:"" help:"Show one template."`
	Delete  TemplateDeleteCmd  `cmd:"" help:"Delete a template from the catalog, refused while Workspaces use it (--local: every build on this host)."`
}

type templateRoot struct {
	StorageRoot string `name:"storage-root" help:"Storage root holding templates/; default: <data-dir>/storage."`
}

func (r templateRoot) root(g *Globals) string {
	if r.StorageRoot != "" {
		return r.StorageRoot
	}
	return g.dir().StorageRoot()
}

// TemplateBuildCmd builds a template.
type TemplateBuildCmd struct {
	templateRoot `embed:""`
	Name         string   `arg:"" name:"name" help:"Template name, e.g. kibotos-coding."`
	FromDir      string   `name:"from-dir" type:"existingdir" help:"Directory holding the root filesystem."`
	FromTar      string   `name:"from-tar" type:"existingfile" help:"Rootfs tarball (any compression tar reads)."`
	FromOCI      string   `name:"from-oci" type:"existingfile" help:"OCI/Docker image file: a docker save tarball or an OCI image-layout archive (uncompressed). Its layers are flattened; its Env, WorkingDir and User become the defaults of workspace exec."`
	OCIRef       string   `name:"oci-ref" help:"With --from-oci: the image of a file that holds several, by tag (app:1) or OCI ref name."`
	FromRegistry string   `name:"from-registry" help:"Image reference to pull, e.g. docker.io/library/debian:12 or localhost:5000/app:1 (linux/amd64; credentials from ~/.docker/config.json; a registry on a loopback address over plain http). As --from-oci otherwise."`
	Debootstrap  bool     `name:"debootstrap" help:"Build a Debian root filesystem with debootstrap (Debian package debootstrap; needs root)."`
	Busybox      bool     `name:"busybox" help:"Build the small busybox system kibotos dev builds as kibotos-base: the static busybox of the Debian package busybox-static (a shell, nc and the usual tools) with GNU wget; 1 GiB file system."`
	Suite        string   `name:"suite" help:"With --debootstrap: the Debian release; default bookworm."`
	Mirror       string   `name:"mirror" help:"With --debootstrap: the Debian archive URL; default: the one apt uses on this host (/etc/apt/sources.list{,.d})."`
	Include      []string `name:"include" sep:"," help:"With --debootstrap: extra packages, e.g. --include git,curl,python3."`
	Variant      string   `name:"variant" help:"With --debootstrap: minbase (default: essential packages and apt), buildd (plus build-essential) or standard (required and important packages)."`
	User         string   `name:"user" placeholder:"NAME" help:"With --debootstrap: add the account NAME (uid and gid 1000, home /home/NAME from /etc/skel, locked password) and run every exec of the template's Workspaces as NAME in its home, as E2B's templates do with user."`
	Sudo         bool     `name:"sudo" help:"With --user: NAME may run anything as root without a password (group sudo, /etc/sudoers.d/NAME); adds the package sudo to --include."`
	Size         string   `name:"size" help:"Image size, e.g. 2GiB; default: the content plus half again plus 64 MiB (--debootstrap: the content plus 2 GiB, at least 4 GiB; the image is sparse). With --from-oci and --from-registry it also bounds the image's files (default bound 64 GiB)."`
}

func (c *TemplateBuildCmd) Run(g *Globals) error {
	n := 0
	for _, set := range []bool{c.FromDir != "", c.FromTar != "", c.FromOCI != "", c.FromRegistry != "", c.Debootstrap, c.Busybox} {
		if set {
			n++
		}
	}
	if n != 1 {
		return api.Errorf(api.CodeInvalidArgument, "template %s: give exactly one of --from-dir DIR, --from-tar FILE, --from-oci FILE, --from-registry REF, --debootstrap and --busybox", c.Name)
	}
	if !c.Debootstrap && (c.Suite != "" || c.Mirror != "" || len(c.Include) > 0 || c.Variant != "" || c.User != "" || c.Sudo) {
		return api.Errorf(api.CodeInvalidArgument, "template %s: --suite, --mirror, --include, --variant, --user and --sudo go with --debootstrap", c.Name)
	}
	if c.OCIRef != "" && c.FromOCI == "" {
		return api.Errorf(api.CodeInvalidArgument, "template %s: --oci-ref goes with --from-oci (a registry reference names its image itself)", c.Name)
	}
	o := template.Options{StorageRoot: c.root(g), Name: c.Name, FromDir: c.FromDir, FromTar: c.FromTar}
	if c.Size != "" {
		n, err := parseSize(c.Size)
		if err != nil || n < 1<<20 {
			return api.Errorf(api.CodeInvalidArgument, "template %s: --size %q is not a size such as 512MiB or 2GiB", c.Name, c.Size)
		}
		o.SizeMiB = int(n >> 20)
	}
	if c.Debootstrap {
		return c.runDebootstrap(g, o.SizeMiB)
	}
	if c.FromOCI != "" || c.FromRegistry != "" {
		return c.runOCI(g, o.SizeMiB)
	}
	var t *template.Template
	var err error
	if c.Busybox {
		if c.Size != "" {
			return api.Errorf(api.CodeInvalidArgument, "template %s: --size goes with --from-dir, --from-tar, --from-oci, --from-registry or --debootstrap; a --busybox template is %d MiB", c.Name, template.BusyboxSizeMiB)
		}
		t, err = template.BuildBusybox(g.ctx, o.StorageRoot, c.Name, "")
	} else {
		t, err = template.Build(g.ctx, o)
	}
	if err != nil {
		return api.Errorf(api.CodeInvalidArgument, "%v", err)
	}
	if g.JSON {
		return printResult(g, t)
	}
	printBuilt(g, t)
	return nil
}

func printBuilt(g *Globals, t *template.Template) {
	g.printf("%s\n", t.ID)
	g.note("template %s: %d files, %s of content, image %s in %s\n", t.Name, t.Files, formatBytes(uint64(t.ContentBytes)), formatBytes(uint64(t.ImageBytes)), t.Dir)
}

func (c *TemplateBuildCmd) runDebootstrap(g *Globals, sizeMiB int) error {
	o := template.DebootstrapOptions{StorageRoot: c.root(g), Name: c.Name, Suite: c.Suite, Mirror: c.Mirror, Include: c.Include, Variant: c.Variant, SizeMiB: sizeMiB,
		User: template.DefaultUser{Name: c.User, Sudo: c.Sudo}}
	if err := o.Validate(); err != nil {
		return api.Errorf(api.CodeInvalidArgument, "%v", err)
	}
	start := time.Now()
	t, err := buildDebian(g, o, !g.JSON)
	if err != nil {
		return err
	}
	if g.JSON {
		return printResult(g, t)
	}
	printBuilt(g, t)
	g.note("template %s: built with debootstrap in %s\n", t.Name, time.Since(start).Round(time.Second))
	return nil
}

// runOCI builds from an image file or a registry, with the layers' progress
// on stderr when it is a terminal. Ctrl-C or SIGTERM stops the build and
// removes what it unpacked.
func (c *TemplateBuildCmd) runOCI(g *Globals, sizeMiB int) error {
	o := template.OCIOptions{StorageRoot: c.root(g), Name: c.Name, File: c.FromOCI, Ref: c.OCIRef, Registry: c.FromRegistry, SizeMiB: sizeMiB}
	pb := g.progress(true, "template "+c.Name, -1)
	if pb.on {
		o.Progress = func(p template.OCIProgress) {
			pb.set(fmt.Sprintf("template %s: layer %d/%d", c.Name, min(p.LayersDone+1, p.Layers), p.Layers), p.Bytes)
		}
	}
	ctx, stop := signal.NotifyContext(g.ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	t, err := template.BuildOCI(ctx, o)
	if err != nil {
		pb.abandon()
	} else {
		pb.done()
	}
	switch {
	case err == nil:
	case errors.Is(err, template.ErrImageUnavailable):
		return api.Errorf(api.CodeUnavailable, "%v", err)
	case errors.Is(err, template.ErrImageNotFound):
		return api.Errorf(api.CodeNotFound, "%v", err)
	default:
		return api.Errorf(api.CodeInvalidArgument, "%v", err)
	}
	if g.JSON {
		return printResult(g, t)
	}
	printBuilt(g, t)
	return nil
}

// buildDebian runs BuildDebootstrap, with debootstrap's output on stderr
// when progress is set, mapping its errors to exit codes. Ctrl-C or
// SIGTERM stops debootstrap (its own process group) and removes the
// half-built tree instead of leaving both behind.
func buildDebian(g *Globals, o template.DebootstrapOptions, progress bool) (*template.Template, error) {
	if progress {
		o.Progress = g.stderr
	}
	ctx, stop := signal.NotifyContext(g.ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	t, err := template.BuildDebootstrap(ctx, o)
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, template.ErrDebootstrapPrereq):
		return nil, api.Errorf(api.CodeFailedPrecondition, "%v", err)
	case errors.Is(err, template.ErrDebootstrapFailed):
		return nil, api.Errorf(api.CodeUnavailable, "%v", err)
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "%v", err)
	}
}

// TemplateListCmd lists the catalog, or this host's builds.
type TemplateListCmd struct {
	templateRoot `embed:""`
	Local        bool   `name:"local" help:"List the templates built on this host (its storage root) instead of the catalog; implied by --storage-root."`
	PageSize     int    `name:"page-size" default:"0" help:"Catalog entries per page (0: all)."`
	PageToken    string `name:"page-token" help:"Continue after a previous page."`
	Quiet        bool   `short:"q" name:"quiet" help:"Print only the template names."`
}

func (c *TemplateListCmd) Run(g *Globals) error {
	if c.Local || c.StorageRoot != "" {
		return c.runLocal(g)
	}
	var out api.CatalogTemplateList
	return runList(g, listCall{path: "/v1/templates", size: c.PageSize, token: c.PageToken, quiet: c.Quiet, what: "templates"}, &out,
		func() ([]string, string) {
			names := make([]string, 0, len(out.Templates)+len(out.NodeTemplates))
			for _, t := range out.Templates {
				names = append(names, t.Name)
			}
			for _, t := range out.NodeTemplates {
				names = append(names, t.Name)
			}
			return names, out.NextPageToken
		},
		func() {
			// SOURCE says where placement finds a template: the catalog
			// (any node fetches it) or only the nodes that built it.
			t := newTable(g.stdout, "NAME", "SOURCE", "DIGEST", "SIZE", "PUBLISHED", "NODES")
			for _, e := range out.Templates {
				t.row(e.Name, "catalog", shortDigest(e.Digest), formatBytes(uint64(e.SizeBytes)), stamp(e.PublishedAt)+" by "+e.PublishedBy, dash(strings.Join(e.Nodes, ",")))
			}
			for _, e := range out.NodeTemplates {
				t.row(e.Name, "node", "-", "-", "-", strings.Join(e.Nodes, ","))
			}
			t.flush()
			if len(out.Templates)+len(out.NodeTemplates) == 0 && c.PageToken == "" {
				g.note("no template is published to the catalog or built on a node: kibo template build NAME --busybox on a node, then kibo template publish NAME --from-node NODE\n")
			}
		})
}

func (c *TemplateListCmd) runLocal(g *Globals) error {
	all, err := template.List(c.root(g))
	if err != nil {
		return err
	}
	if g.JSON {
		if all == nil {
			all = []*template.Template{}
		}
		return printResult(g, all)
	}
	if c.Quiet {
		for _, tp := range all {
			g.printf("%s\n", tp.Name)
		}
		return nil
	}
	t := newTable(g.stdout, "NAME", "ID", "FILES", "CONTENT", "IMAGE", "CREATED")
	for _, tp := range all {
		t.row(tp.Name, shortID(tp.ID), itoa(tp.Files), formatBytes(uint64(tp.ContentBytes)), formatBytes(uint64(tp.ImageBytes)), stamp(tp.CreatedAt))
	}
	t.flush()
	return nil
}

// shortDigest is sha256: and 12 hex digits.
func shortDigest(d string) string {
	if len(d) > 19 && strings.HasPrefix(d, "sha256:") {
		return d[:19]
	}
	return d
}

func shortID(id string) string {
	if len(id) > 19 && strings.HasPrefix(id, "sha256-") {
		return id[:19]
	}
	return id
}

// TemplateGetCmd shows a template.
type TemplateGetCmd struct {
	templateRoot `embed:""`
	Name         string `arg:"" name:"name"`
}

func (c *TemplateGetCmd) Run(g *Globals) error {
	t, err := template.Get(c.root(g), c.Name)
	if err != nil {
		return api.Errorf(api.CodeNotFound, "%v", err)
	}
	if g.JSON {
		return printResult(g, t)
	}
	g.printf("Name:     %s\nID:       %s\nSource:   %s\nFiles:    %d\nContent:  %s\nImage:    %s (%s)\nCreated:  %s\n",
		t.Name, t.ID, t.Source, t.Files, formatBytes(uint64(t.ContentBytes)), t.Image(), formatBytes(uint64(t.ImageBytes)), stamp(t.CreatedAt))
	return nil
}

// TemplateDeleteCmd deletes a catalog entry, or this host's builds.
type TemplateDeleteCmd struct {
	templateRoot    `embed:""`
	Name            string  `arg:"" name:"name"`
	Local           bool    `name:"local" help:"Delete every build of the template on this host (its storage root) instead of the catalog entry; implied by --storage-root."`
	CommandID       string  `name:"command-id" help:"Idempotency key."`
	ExpectedVersion *uint64 `name:"expected-version" help:"Version the catalog entry must still be at."`
}

func (c *TemplateDeleteCmd) Run(g *Globals) error {
	if c.Local || c.StorageRoot != "" {
		n, err := template.Delete(c.root(g), c.Name)
		if err != nil {
			return api.Errorf(api.CodeNotFound, "%v", err)
		}
		g.printf("template %s: %d build(s) deleted\n", c.Name, n)
		return nil
	}
	raw, err := g.call("POST", "/v1/templates/"+url.PathEscape(c.Name)+"/delete", writeMeta(c.CommandID, c.ExpectedVersion), nil)
	if err != nil {
		return err
	}
	if g.JSON {
		return g.printJSON(raw)
	}
	g.printf("template %s deleted from the catalog (the image stays in the artifact store and on the nodes that hold it)\n", c.Name)
	return nil
}
