package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/vmm/template"
)

// PublishTemplate puts the latest build of template name on this node
// into the artifact store and records the digest beside the image, so the
// node reports holding a verified copy (at once). ctrl asks for it
// (template publish) and records the catalog entry from the answer.
func (a *Agent) PublishTemplate(ctx context.Context, name string) (api.TemplateImage, error) {
	img, err := publishTemplate(ctx, a.cfg.Artifacts, a.cfg.DataDir.StorageRoot(), name)
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

func publishTemplate(ctx context.Context, store artifacts.Store, storageRoot, name string) (api.TemplateImage, error) {
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
	o, err := store.Put(ctx, f, "")
	if err != nil {
		var e *api.Error
		if errors.As(err, &e) {
			return api.TemplateImage{}, api.Errorf(e.Code, "template %s: %s", name, e.Message)
		}
		return api.TemplateImage{}, fmt.Errorf("template %s: %w", name, err)
	}
	if err := t.SetImageDigest(string(o.Digest)); err != nil {
		return api.TemplateImage{}, err
	}
	return api.TemplateImage{Name: t.Name, TemplateID: t.ID, Digest: string(o.Digest), SizeBytes: o.Size, ImageFormat: api.ImageFormatExt4}, nil
}
