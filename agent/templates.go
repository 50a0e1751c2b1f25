package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/internal/progress"
	"github.com/kibotos/kibotos/vmm/template"
)

// PublishTemplate puts the latest build of template name on this node
// into the artifact store and records the digest beside the image, so the
// node reports holding a verified copy (at once). ctrl asks for it
// (template publish) and records the catalog entry from the answer.
func (a *Agent) PublishTemplate(ctx context.Context, name string) (api.TemplateImage, error) {
	c, end := a.transfers.Begin(api.TemplatePublishProgressKey(name), "template publish", -1)
	defer end()
	img, err := publishTemplate(ctx, a.cfg.Artifacts, a.cfg.DataDir.StorageRoot(), name, c)
	if err == nil {
		a.templatesChanged()
	}
	return img, err
}

// templatesChanged drops the listing of templates a report uses and sends
// a report with a new one.
func (a *Agent) templatesChanged() {
	a.mu.Lock()
	a.templatesMod = time.Time{}
	a.mu.Unlock()
	a.PushReport()
}

func publishTemplate(ctx context.Context, store artifacts.Store, storageRoot, name string, c *progress.Counter) (api.TemplateImage, error) {
	if err := api.ValidTemplateName(name); err != nil {
		return api.TemplateImage{}, err
	}
	if store == nil {
		return api.TemplateImage{}, api.Errorf(api.CodeFailedPrecondition, "template %s: this node has no artifact store: set [artifacts] url in its configuration file and restart it", name)
	}
	t, err := template.Get(storageRoot, name)
	if err != nil {
		return api.TemplateImage{}, api.Errorf(api.CodeNotFound, "%v", err)
	}
	f, err := os.Open(t.Image())
	if err != nil {
		return api.TemplateImage{}, fmt.Errorf("template %s: %w", name, err)
	}
	defer f.Close()
	var r io.Reader = f
	if c != nil {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			c.Set(0, fi.Size())
		}
		r = c.Reader(f)
	}
	o, err := store.Put(ctx, r, "")
	if err != nil {
		return api.TemplateImage{}, namedErr("template "+name, err)
	}
	if err := t.SetImageDigest(string(o.Digest)); err != nil {
		return api.TemplateImage{}, err
	}
	return api.TemplateImage{Name: t.Name, TemplateID: t.ID, Digest: string(o.Digest), SizeBytes: o.Size, ImageFormat: api.ImageFormatExt4}, nil
}

// templateFor is the template a start boots: the node's own build, else
// the published one, fetched from the artifact store (progress in the
// log) as a step of the start recorded in volume-commands.json (the
// start's command id with "/template"). A store this node cannot read is
// a refusal, so ctrl places the Workspace elsewhere; an object that does
// not verify is an error.
func (a *Agent) templateFor(ctx context.Context, t api.WorkspaceTask) (*template.Template, string, error) {
	root := a.cfg.DataDir.StorageRoot()
	if tpl, err := template.Get(root, t.Template); err == nil {
		return tpl, "", nil
	}
	p := t.Published
	if p == nil || p.Name != t.Template {
		return nil, "", fmt.Errorf("template %s is not on node %s: build it there with kibotos template build %s --from-dir DIR, or publish it from a node that has it (kibo template publish %s)", t.Template, a.cfg.NodeID, t.Template, t.Template)
	}
	if a.cfg.Artifacts == nil {
		return nil, fmt.Sprintf("template %s is not on node %s, which has no artifact store to fetch it from: set [artifacts] url in its configuration", t.Template, a.cfg.NodeID), nil
	}
	var tpl *template.Template
	rec := commandRecord{CommandID: t.Command.CommandID + "/template", Kind: cmdTemplateFetch, WorkspaceID: t.WorkspaceID, Template: p.Name, Digest: p.Digest}
	refusal, err := a.recorded(rec, func() (refusal string, err error) {
		tpl, refusal, err = a.fetchTemplate(ctx, t.WorkspaceID, *p)
		return refusal, err
	})
	return tpl, refusal, err
}

// fetchTemplate fetches published template p from the artifact store and
// installs it, for a start of Workspace ws.
func (a *Agent) fetchTemplate(ctx context.Context, ws string, p api.TemplateImage) (*template.Template, string, error) {
	root := a.cfg.DataDir.StorageRoot()
	c, end := a.transfers.Begin(api.WorkspaceProgressKey(ws), "template fetch", p.SizeBytes)
	defer end()
	a.fetchMu.Lock()
	defer a.fetchMu.Unlock()
	log := a.log.With("template", p.Name, "digest", p.Digest, "store", a.cfg.Artifacts.String())
	log.Info("template fetch started", "bytes", p.SizeBytes)
	start, lastTenth := time.Now(), int64(-1)
	progress := func(done, total int64) {
		c.Set(done, total)
		if tenth := done * 10 / max(total, 1); tenth != lastTenth {
			lastTenth = tenth
			log.Info("template fetch progress", "done_bytes", done, "total_bytes", total)
		}
	}
	tp := template.Published{Name: p.Name, ID: p.TemplateID, Digest: p.Digest, SizeBytes: p.SizeBytes}
	tpl, err := template.Install(ctx, root, tp, func(ctx context.Context, img string) error {
		return artifacts.Fetch(ctx, a.cfg.Artifacts, artifacts.Object{Digest: artifacts.Digest(p.Digest), Size: p.SizeBytes}, img, progress)
	})
	if err != nil {
		log.Warn("template fetch failed", "err", err)
		if errors.Is(err, artifacts.ErrCorrupt) {
			os.RemoveAll(template.FetchDir(root, tp)) // nothing worth continuing
		}
		if api.CodeOf(err) == api.CodeUnavailable || api.CodeOf(err) == api.CodeNotFound {
			return nil, fmt.Sprintf("template %s could not be fetched: %v", p.Name, err), nil
		}
		return nil, "", fmt.Errorf("template %s: %w", p.Name, err)
	}
	log.Info("template fetched", "seconds", time.Since(start).Seconds())
	a.templatesChanged()
	return tpl, "", nil
}

// namedErr puts what (the template or Platform being published) before a
// store's error, keeping its code (unavailable, resource exhausted...).
func namedErr(what string, err error) error {
	var e *api.Error
	if errors.As(err, &e) {
		return api.Errorf(e.Code, "%s: %s", what, e.Message)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Progress is how far the publish, fetch or import listed under key
// (api.ProgressKey...) is; false when none runs here.
func (a *Agent) Progress(key string) (api.ByteProgress, bool) { return a.transfers.Get(key) }
