package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/vmm/platform"
)

// PublishPlatform puts one of this node's Platforms (id, or "own": the one
// whose guest agent is this executable) into the artifact store as an
// archive and answers what ctrl records in the catalog.
func (a *Agent) PublishPlatform(ctx context.Context, id string) (api.PlatformImage, error) {
	if a.cfg.Artifacts == nil {
		return api.PlatformImage{}, api.Errorf(api.CodeFailedPrecondition, "node %s has no artifact store: set [artifacts] url in its configuration file and restart it", a.cfg.NodeID)
	}
	in, err := a.installedPlatform(id)
	if err != nil {
		return api.PlatformImage{}, err
	}
	if err := in.Verify(); err != nil {
		return api.PlatformImage{}, api.Errorf(api.CodeFailedPrecondition, "%v: rebuild it with kibotos platform build", err)
	}
	if in.AgentSHA256 == "" {
		return api.PlatformImage{}, api.Errorf(api.CodeFailedPrecondition, "platform %s was built before Platforms recorded their guest agent: rebuild it with kibotos platform build", in.ID)
	}
	c, end := a.transfers.Begin(api.PlatformPublishProgressKey(id), "platform publish", -1)
	defer end()
	pr, wait := pipeFrom(func(w io.Writer) error { return platform.WriteArchive(in, w) })
	o, err := a.cfg.Artifacts.Put(ctx, c.Reader(pr), "")
	pr.CloseWithError(errors.New("upload ended"))
	wait()
	if err != nil {
		return api.PlatformImage{}, namedErr("platform "+in.ID, err)
	}
	img := api.PlatformImage{PlatformID: in.ID, KernelSeries: api.KernelSeriesOf(in.KernelVersion), KernelVersion: in.KernelVersion,
		AgentRelease: in.AgentRelease, AgentSHA256: in.AgentSHA256, Digest: string(o.Digest), SizeBytes: o.Size}
	if img.AgentRelease == "unreleased" {
		img.AgentRelease = ""
	}
	a.log.Info("platform published", "platform", in.ID, "digest", img.Digest, "bytes", img.SizeBytes)
	return img, img.Check()
}

// installedPlatform is this node's Platform id, or its own for "own".
func (a *Agent) installedPlatform(id string) (*platform.Installation, error) {
	if id == "own" {
		in, err := a.ownPlatform()
		if err != nil {
			return nil, api.Errorf(api.CodeNotFound, "%v", err)
		}
		return in, nil
	}
	if err := api.ValidPlatformID(id); err != nil {
		return nil, err
	}
	in, err := platform.Load(filepath.Join(platform.InstallationsDir(a.cfg.DataDir.StorageRoot()), id))
	if err != nil {
		return nil, api.Errorf(api.CodeNotFound, "platform %s is not installed on node %s (%v): see kibotos platform list --local there", id, a.cfg.NodeID, err)
	}
	return in, nil
}

// platformFor is the Platform a start boots on. While the catalog approves
// no Platform (t.Platforms is empty) it is the node's own build. Otherwise
// it is the first of the approved defaults this build can drive: one whose
// guest agent is this executable, or of a release it drives; one not
// installed here is fetched from the artifact store. A node that can use
// none refuses, naming each and why, so ctrl places the Workspace
// elsewhere.
func (a *Agent) platformFor(ctx context.Context, t api.WorkspaceTask) (*platform.Installation, string, error) {
	if len(t.Platforms) == 0 {
		in, err := a.ownPlatform()
		return in, "", err
	}
	var why []string
	for _, p := range t.Platforms {
		if err := p.Check(); err != nil {
			return nil, "", err
		}
		if err := a.drives(p); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", p.Describe(), err))
			continue
		}
		in, err := a.installPlatform(ctx, t.WorkspaceID, p)
		if err == nil {
			return in, "", nil
		}
		if errors.Is(err, artifacts.ErrCorrupt) {
			return nil, "", err // never booted, never tried elsewhere as if it were this node's problem
		}
		why = append(why, fmt.Sprintf("%s: %v", p.Describe(), err))
	}
	return nil, fmt.Sprintf("node %s can run no approved Platform: %s; publish and approve one it can (kibo platform publish --from-node %s, kibo platform approve ID)",
		a.cfg.NodeID, strings.Join(why, "; "), a.cfg.NodeID), nil
}

// drives says why this build cannot drive Platform p; nil when it can.
func (a *Agent) drives(p api.PlatformImage) error {
	sha := a.cfg.PlatformAgent
	if sha == "" {
		sha, _ = platform.SelfSHA256()
	}
	if p.AgentSHA256 == sha {
		return nil // its guest agent is this executable
	}
	// The catalog's "" is an unreleased agent; an installation's "" is one
	// of an unknown release.
	return platform.Drivable(&platform.Installation{ID: p.PlatformID, AgentRelease: cmp.Or(p.AgentRelease, "unreleased")}, a.ownPlatformID(), buildinfo.Release)
}

// installPlatform is p as installed here, fetched from the artifact store
// first when it is not (progress in the log).
func (a *Agent) installPlatform(ctx context.Context, ws string, p api.PlatformImage) (*platform.Installation, error) {
	root := a.cfg.DataDir.StorageRoot()
	if in, err := platform.Load(filepath.Join(platform.InstallationsDir(root), p.PlatformID)); err == nil {
		return in, nil
	}
	if a.cfg.Artifacts == nil {
		return nil, errors.New("not installed here, and the node has no artifact store to fetch it from: set [artifacts] url in its configuration")
	}
	c, end := a.transfers.Begin(api.WorkspaceProgressKey(ws), "platform fetch", p.SizeBytes)
	defer end()
	a.fetchMu.Lock()
	defer a.fetchMu.Unlock()
	log := a.log.With("platform", p.PlatformID, "digest", p.Digest, "store", a.cfg.Artifacts.String())
	log.Info("platform fetch started", "bytes", p.SizeBytes)
	start := time.Now()
	in, err := platform.Install(ctx, root, p.PlatformID, func(ctx context.Context, archive string) error {
		return artifacts.Fetch(ctx, a.cfg.Artifacts, artifacts.Object{Digest: artifacts.Digest(p.Digest), Size: p.SizeBytes}, archive, c.Set)
	})
	if err != nil {
		log.Warn("platform fetch failed", "err", err)
		if errors.Is(err, artifacts.ErrCorrupt) {
			os.RemoveAll(platform.FetchDir(root, p.PlatformID))
		}
		return nil, err
	}
	log.Info("platform fetched", "seconds", time.Since(start).Seconds())
	return in, nil
}
