package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/platform"
)

// check-upgrade from the CLI on a node that never ran a VMM: with this
// build's own Platform in place it may go ahead (exit 0); a missing
// runtime directory, a node record of another format, or a Platform of
// another build each give their blocked: line and exit 13; nothing in
// the data directory changes.
func TestCheckUpgradeCommand(t *testing.T) {
	dir := datadir.Dir(t.TempDir())
	if err := os.MkdirAll(dir.NodeDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := dir.SaveIdentity(&datadir.Identity{ClusterID: "c-1", NodeID: "node-u", Roles: []string{"node"}}); err != nil {
		t.Fatal(err)
	}
	own := fakePlatform(t, dir.StorageRoot())
	run := func(args ...string) (string, string, int) {
		t.Helper()
		var out, errb bytes.Buffer
		full := append([]string{"check-upgrade", "--data-dir", string(dir), "--systemd", "none"}, args...)
		code := Main(context.Background(), "kibotos", full, nil, &out, &errb)
		return out.String(), errb.String(), code
	}
	before := testenv.TreeDigest(t, string(dir))
	for _, preview := range [][]string{nil, {"--preview"}} {
		out, errs, code := run(append([]string{"--runtime-dir", own}, preview...)...)
		if code != 0 || !strings.Contains(out, "ok: runtime directory "+own) || !strings.Contains(errs, "can take node node-u over") {
			t.Fatalf("clean check %v: exit %d\n%s%s", preview, code, out, errs)
		}
		if (len(preview) > 0) != strings.Contains(out, "not judged by --preview: quiescence and ownership") {
			t.Errorf("the preview's reminder of what it does not judge, %v:\n%s", preview, out)
		}
	}
	out, errs, code := run("--runtime-dir", filepath.Join(string(dir), "nowhere"))
	if code != api.ExitFailedPrecondition || !strings.Contains(out, "blocked: runtime directory "+filepath.Join(string(dir), "nowhere")) || !strings.Contains(errs, "deal with the lines marked blocked: first") {
		t.Errorf("missing runtime directory: exit %d\n%s%s", code, out, errs)
	}
	if after := testenv.TreeDigest(t, string(dir)); after != before {
		t.Error("check-upgrade changed the data directory")
	}

	// Records of a format this build does not read: each is a blocked
	// line in the seed's words.
	inc := filepath.Join(dir.NodeDir(), "incarnation")
	os.WriteFile(inc, []byte(`{"format_version": 5, "incarnation": 3}`), 0o600)
	out, _, code = run("--runtime-dir", own, "--preview")
	if code != api.ExitFailedPrecondition || !strings.Contains(out, "blocked: node record: incarnation record "+inc+" has version 5, this build reads [0 1]") {
		t.Errorf("incarnation of a newer build: exit %d\n%s", code, out)
	}
	os.Remove(inc)
	raw, _ := os.ReadFile(dir.IdentityFile())
	os.WriteFile(dir.IdentityFile(), bytes.Replace(raw, []byte(`"format_version": 1`), []byte(`"format_version": 2`), 1), 0o600)
	out, _, code = run("--runtime-dir", own)
	if code != api.ExitFailedPrecondition || !strings.Contains(out, "blocked: identity "+dir.IdentityFile()+": identity file "+dir.IdentityFile()+" has version 2, this build reads [1]") {
		t.Errorf("identity of a newer build: exit %d\n%s", code, out)
	}
	os.WriteFile(dir.IdentityFile(), raw, 0o600)

	// A Platform whose agent is another executable is not this build's.
	other := fakePlatformWith(t, dir.StorageRoot(), "0000", "other")
	out, _, code = run("--runtime-dir", other)
	if code != api.ExitFailedPrecondition || !strings.Contains(out, "carries guest agent sha256 0000, not the target executable's") {
		t.Errorf("another build's Platform: exit %d\n%s", code, out)
	}
}

// fakePlatform installs a Platform whose guest agent is this (test)
// executable: small stand-in files, a true manifest.
func fakePlatform(t *testing.T, storageRoot string) string {
	t.Helper()
	sha, err := platform.SelfSHA256()
	if err != nil {
		t.Fatal(err)
	}
	return fakePlatformWith(t, storageRoot, sha, "own")
}

func fakePlatformWith(t *testing.T, storageRoot, agentSHA, content string) string {
	t.Helper()
	var files []platform.File
	body := map[string][]byte{platform.KernelFile: []byte("kernel " + content), platform.InitrdFile: []byte("initrd " + content)}
	h := sha256.New()
	fmt.Fprintf(h, "kibotos-platform v1\n")
	for _, name := range []string{platform.InitrdFile, platform.KernelFile} { // sorted
		sum := sha256.Sum256(body[name])
		f := platform.File{Name: name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(body[name]))}
		files = append(files, f)
		fmt.Fprintf(h, "%s %s %d\n", f.Name, f.SHA256, f.Size)
	}
	in := platform.Installation{FormatVersion: platform.FormatVersion, ID: "sha256-" + hex.EncodeToString(h.Sum(nil)), Kind: platform.Kind,
		KernelVersion: "6.1-test", AgentRelease: "unreleased", AgentSHA256: agentSHA, Files: files}
	dir := filepath.Join(platform.InstallationsDir(storageRoot), in.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range body {
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	raw, _ := json.Marshal(in)
	os.WriteFile(filepath.Join(dir, platform.ManifestFile), raw, 0o644)
	if _, err := platform.Load(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}
