package template

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/kibotos/kibotos/storagepool"
)

// Published is a template as the cluster's catalog records it: what a
// node that lacks it fetches.
type Published struct {
	Name      string
	ID        string // sha256-<hex>, the build id on the publishing node
	Digest    string // sha256:<hex> of the image
	SizeBytes int64
}

var idRE = regexp.MustCompile(`^sha256-[0-9a-f]{64}$`)

// FetchDir is where the image of p is fetched to before it is installed:
// the same path on every attempt, so an interrupted fetch continues.
func FetchDir(storageRoot string, p Published) string {
	return filepath.Join(Dir(storageRoot), ".fetch-"+strings.TrimPrefix(p.Digest, "sha256:"))
}

// Install puts a published template in place on this node: fetch writes
// (and verifies) its image at the path it is given, then the template
// directory is completed and renamed into place, as Build does. A build
// with the same id already here is returned as it is. Callers serialize
// installs of one template.
func Install(ctx context.Context, storageRoot string, p Published, fetch func(ctx context.Context, image string) error) (*Template, error) {
	switch {
	case !nameRE.MatchString(p.Name):
		return nil, fmt.Errorf("template name %.80q is not valid", p.Name)
	case !idRE.MatchString(p.ID):
		return nil, fmt.Errorf("template %s: build id %.80q is not sha256- and 64 hex digits", p.Name, p.ID)
	case !imageDigestRE.MatchString(p.Digest):
		return nil, fmt.Errorf("template %s: image digest %.80q is not sha256: and 64 hex digits", p.Name, p.Digest)
	}
	final := filepath.Join(Dir(storageRoot), p.ID)
	if t, err := Load(final); err == nil {
		return t, nil
	}
	work := FetchDir(storageRoot, p)
	if err := os.MkdirAll(work, 0o700); err != nil {
		return nil, fmt.Errorf("template %s: %w", p.Name, err)
	}
	img := filepath.Join(work, ImageFile)
	if err := fetch(ctx, img); err != nil {
		return nil, err
	}
	t := &Template{FormatVersion: FormatVersion, ID: p.ID, Name: p.Name, Source: "artifact:" + p.Digest, ImageBytes: p.SizeBytes, CreatedAt: time.Now().UTC(), Dir: work}
	raw, _ := json.MarshalIndent(t, "", "  ")
	if err := storagepool.WriteFile(filepath.Join(work, "template.json"), raw, 0o600, storagepool.Temp{Purpose: "record"}); err != nil {
		return nil, err
	}
	if err := os.Chmod(img, 0o400); err != nil { // the base of every layer: never written
		return nil, err
	}
	if err := t.SetImageDigest(p.Digest); err != nil {
		return nil, err
	}
	if err := os.Rename(work, final); err != nil {
		if t2, lerr := Load(final); lerr == nil {
			return t2, nil // installed concurrently
		}
		return nil, fmt.Errorf("template %s: %w", p.Name, err)
	}
	return Load(final)
}
