package platform

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDrivable(t *testing.T) {
	in := &Installation{ID: "sha256-old"}
	for _, c := range []struct {
		agent, target string
		ok            bool
		why           string
	}{
		{"0.3.1", "0.3.4", true, ""},
		{"0.3.4", "0.3.4", true, ""},
		{"0.2.9", "0.3.0", true, ""},                                    // the previous MINOR
		{"0.3.5", "0.3.4", false, "outside what this build (0.3.4)"},    // a later patch
		{"0.1.0", "0.3.0", false, "releases of the previous MINOR"},     // two MINORs back
		{"0.3.0", "1.0.0", false, "outside"},                            // another MAJOR
		{"0.3.0-beta.1", "0.3.0", false, "outside"},                     // pre-releases are on no line
		{"unreleased", "0.3.0", false, "not a release this build"},      // an unreleased agent
		{"", "0.3.0", false, "unknown release"},                         // a version 1 manifest
		{"0.3.0", "", false, "an unreleased build drives only its own"}, // an unreleased node
		{"unreleased", "unreleased", false, "drives only its own"},      // even of another unreleased build
	} {
		in.AgentRelease = c.agent
		err := Drivable(in, "sha256-new", c.target)
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), c.why)) {
			t.Errorf("agent %q, node %q: %v", c.agent, c.target, err)
		}
	}
	// Its own Platform a node always drives.
	in.AgentRelease = "unreleased"
	if err := Drivable(in, in.ID, ""); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyDigests(t *testing.T) {
	root := t.TempDir()
	w := writeInstallation(t, root, time.Now(), "content")
	in, err := Load(filepath.Join(InstallationsDir(root), w.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Verify(); err != nil {
		t.Fatal(err)
	}
	// Same size, one byte flipped: Load (sizes) passes, Verify does not.
	p := filepath.Join(in.Dir, InitrdFile)
	raw, _ := os.ReadFile(p)
	raw[0] ^= 0xff
	os.WriteFile(p, raw, 0o644)
	if _, err := Load(in.Dir); err != nil {
		t.Fatal(err)
	}
	if err := in.Verify(); err == nil || !strings.Contains(err.Error(), InitrdFile+" has sha256") {
		t.Fatalf("verify a changed file: %v", err)
	}
}

// A version 1 manifest is read, and rewritten as version 2 when a build
// of the same content learns its agent; one newer than this build is
// refused in the upgrade seed's words.
func TestManifestFormats(t *testing.T) {
	root := t.TempDir()
	w := writeInstallation(t, root, time.Now(), "v1")
	dir := filepath.Join(InstallationsDir(root), w.ID)
	setVersion := func(v int) {
		raw, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
		var m map[string]any
		json.Unmarshal(raw, &m)
		m["format_version"] = v
		delete(m, "agent_sha256")
		raw, _ = json.Marshal(m)
		os.WriteFile(filepath.Join(dir, ManifestFile), raw, 0o644)
	}
	setVersion(1)
	old, err := Load(dir)
	if err != nil || old.AgentSHA256 != "" {
		t.Fatalf("load v1: %+v %v", old, err)
	}
	if Own(root, "abc") != nil {
		t.Fatal("a v1 Platform has no known agent, it is nobody's own")
	}
	up, err := migrate(old, &Installation{AgentRelease: "0.3.0", AgentSHA256: "abc"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Load(dir)
	if err != nil || again.FormatVersion != FormatVersion || again.AgentSHA256 != "abc" || again.ID != old.ID || !again.CreatedAt.Equal(old.CreatedAt) || up.ID != old.ID {
		t.Fatalf("migrated: %+v %v", again, err)
	}
	if own := Own(root, "abc"); own == nil || own.ID != old.ID {
		t.Fatalf("own: %+v", own)
	}
	setVersion(FormatVersion + 1)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "has version 3, this build reads [1 2]") {
		t.Fatalf("newer manifest: %v", err)
	}
}
