package agent

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/datadir"
)

// A start offered approved Platforms uses none this build cannot drive,
// nor one it cannot get: it refuses (ctrl places elsewhere), naming each
// Platform and why. A node without one of its own is not asked for it
// when Platforms are offered.
func TestPlatformForRefusesWhatItCannotRun(t *testing.T) {
	dir := t.TempDir()
	store, err := artifacts.NewDir(filepath.Join(dir, "store"), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	ours := strings.Repeat("1", 64)
	a := &Agent{cfg: Config{NodeID: "node-b", DataDir: datadir.Dir(filepath.Join(dir, "data")), Artifacts: store, PlatformAgent: ours}, log: slog.New(slog.NewTextHandler(&logs, nil))}
	foreign := api.PlatformImage{PlatformID: "sha256-" + strings.Repeat("a", 64), KernelSeries: "6.1", KernelVersion: "6.1.0-28-cloud-amd64",
		AgentSHA256: strings.Repeat("2", 64), Digest: "sha256:" + strings.Repeat("b", 64), SizeBytes: 100}
	missing := foreign
	missing.PlatformID, missing.AgentSHA256, missing.KernelSeries, missing.KernelVersion = "sha256-"+strings.Repeat("c", 64), ours, "6.12", "6.12.9-cloud-amd64"

	if _, _, err := a.platformFor(context.Background(), api.WorkspaceTask{}); err == nil || !strings.Contains(err.Error(), "kibotos platform build") {
		t.Fatalf("no Platform offered and none of its own: %v", err)
	}
	in, refusal, err := a.platformFor(context.Background(), api.WorkspaceTask{Platforms: []api.PlatformImage{foreign, missing}})
	if in != nil || err != nil {
		t.Fatalf("got %v, %v; want a refusal", in, err)
	}
	for _, want := range []string{"node node-b can run no approved Platform", foreign.PlatformID + " (kernel series 6.1, agent unreleased build 222222222222): its guest agent is unreleased and this build is unreleased: an unreleased build drives only its own Platform",
		missing.PlatformID + " (kernel series 6.12", "no such file or directory", "kibo platform publish --from-node node-b"} {
		if !strings.Contains(refusal, want) {
			t.Errorf("refusal %q lacks %q", refusal, want)
		}
	}
	bad := foreign
	bad.PlatformID = "sha256-../x"
	if _, _, err := a.platformFor(context.Background(), api.WorkspaceTask{Platforms: []api.PlatformImage{bad}}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a malformed Platform from ctrl: %v", err)
	}
}
