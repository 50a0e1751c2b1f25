package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	kbuildinfo "github.com/kibotos/kibotos/buildinfo"
	"github.com/kibotos/kibotos/storagepool"
)

// Which Platform a node uses, and which earlier ones it may keep driving.
//
// A node starts new Instances on its own Platform: the one whose guest
// agent is the node's own executable (AgentSHA256), never merely the
// newest one on disk, so a Platform built by another binary never carries
// a guest agent of a protocol the node did not ship with. An Instance
// started on an earlier Platform keeps it across a node upgrade when the
// Platform is whole (every file's digest matches installation.json) and
// its agent's release is one the node drives: its own, an earlier release
// of its release line, or any release of the previous MINOR.

// SelfSHA256 is the digest of the running executable, computed once.
func SelfSHA256() (string, error) { return kbuildinfo.ExecutableSHA256() }

// agentRelease is the kibotos release of the agent binary: ours when we
// ship ourselves, else what the binary says of itself; "" when it does
// not say.
func agentRelease(ctx context.Context, path string, isSelf bool) string {
	if isSelf {
		return kbuildinfo.ReleaseName()
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--json", "version").Output()
	if err != nil {
		return ""
	}
	var v struct {
		Result struct {
			Release string `json:"release"`
		} `json:"result"`
	}
	if json.Unmarshal(out, &v) != nil {
		return ""
	}
	return v.Result.Release
}

// writeManifest writes in as dir/name, synced, through a temp file.
func writeManifest(dir, name string, in *Installation) error {
	raw, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		return err
	}
	return storagepool.WriteFile(filepath.Join(dir, name), append(raw, '\n'), 0o644, storagepool.Temp{Purpose: "manifest"})
}

// migrate rewrites the older manifest of an installed Platform in the
// current format with what this build learned of the same content (the
// agent's release and digest); its files are untouched.
func migrate(existing, built *Installation, log *slog.Logger) (*Installation, error) {
	up := *existing
	up.FormatVersion = FormatVersion
	up.AgentRelease, up.AgentSHA256 = built.AgentRelease, built.AgentSHA256
	if err := writeManifest(existing.Dir, ManifestFile, &up); err != nil {
		return nil, fmt.Errorf("platform %s: migrate %s from version %d: %w", existing.ID, ManifestFile, existing.FormatVersion, err)
	}
	log.Info("platform manifest migrated", "id", up.ID, "from_version", existing.FormatVersion, "to_version", FormatVersion)
	return &up, nil
}

// Verify reads every file of the installation and compares its size and
// digest with installation.json; the files are hashed in parallel.
func (in *Installation) Verify() error {
	errs := make([]error, len(in.Files))
	var wg sync.WaitGroup
	for i, f := range in.Files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = in.verifyFile(f)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // one line: the first file that differs
		}
	}
	return nil
}

func (in *Installation) verifyFile(f File) error {
	path := filepath.Join(in.Dir, f.Name)
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("platform %s: %w", in.ID, err)
	}
	if st.Size() != f.Size {
		return fmt.Errorf("platform %s: %s is %d bytes, %s records %d", in.ID, f.Name, st.Size(), ManifestFile, f.Size)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return fmt.Errorf("platform %s: %w", in.ID, err)
	}
	if sum != f.SHA256 {
		return fmt.Errorf("platform %s: %s has sha256 %s, %s records %s", in.ID, f.Name, sum, ManifestFile, f.SHA256)
	}
	return nil
}

// Own is the Platform under storageRoot whose guest agent has digest
// agentSHA (a node passes SelfSHA256); nil when there is none. Broken
// Platforms are skipped.
func Own(storageRoot, agentSHA string) *Installation {
	ps, _ := List(storageRoot)
	for _, p := range ps {
		if p.AgentSHA256 == agentSHA {
			return p
		}
	}
	return nil
}

// Drivable says why a node of release target whose own Platform is ownID
// cannot keep driving an Instance started on in; nil when it can.
func Drivable(in *Installation, ownID, target string) error {
	if in.ID == ownID {
		return nil
	}
	agent := in.AgentRelease
	if agent == "" {
		agent = "of an unknown release"
	}
	t, err := kbuildinfo.ParseRelease(target)
	if err != nil {
		return fmt.Errorf("its guest agent is %s and this build is %s: an unreleased build drives only its own Platform", agent, releaseName(target))
	}
	v, err := kbuildinfo.ParseRelease(in.AgentRelease)
	if err != nil {
		return fmt.Errorf("its guest agent is %s, not a release this build (%s) drives", agent, t)
	}
	switch {
	case v.Pre != "" || t.Pre != "":
		// Pre-releases are on no release line.
	case v.Major == t.Major && v.Minor == t.Minor && v.Patch <= t.Patch:
		return nil // an earlier release of this line
	case v.Major == t.Major && v.Minor+1 == t.Minor:
		return nil // the previous MINOR
	}
	return fmt.Errorf("its guest agent is release %s, outside what this build (%s) drives: its own Platform, earlier releases of %d.%d and releases of the previous MINOR", v, t, t.Major, t.Minor)
}

func releaseName(r string) string {
	if r == "" {
		return "unreleased"
	}
	return r
}
