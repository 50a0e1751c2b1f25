package runtime

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/vmm/guestproto"
)

// A Workspace's environment is part of what a restarted guest is told
// again: a later configure with one replaces it, one without keeps it.
func TestMergeConfiguredEnv(t *testing.T) {
	c := mergeConfigured(nil, guestproto.ConfigureRequest{Hostname: "a", Env: []string{"A=1", "B=2"}})
	c = mergeConfigured(c, guestproto.ConfigureRequest{Mounts: []guestproto.Mount{{Source: "serial:vol-1", Target: "/rootfs/data"}}})
	if !slices.Equal(c.Env, []string{"A=1", "B=2"}) || c.Hostname != "a" || len(c.Mounts) != 1 {
		t.Fatalf("after a configure without env: %+v", c)
	}
	c = mergeConfigured(c, guestproto.ConfigureRequest{Env: []string{"C=3"}})
	if !slices.Equal(c.Env, []string{"C=3"}) {
		t.Fatalf("after a new env: %+v", c)
	}
}

// An environment read from a snapshot is checked like one a create
// gives, and the largest one a Workspace may have fits in snapshot.json
// however its values escape in JSON.
func TestConfiguredEnvFromSnapshot(t *testing.T) {
	if err := checkConfigured(&guestproto.ConfigureRequest{Env: []string{"1BAD=x"}}); err == nil || !strings.Contains(err.Error(), `recorded configuration: environment variable name "1BAD" is not valid`) {
		t.Errorf("a bad recorded env: %v", err)
	}
	// Control characters escape to six bytes each (\u0001).
	value := strings.Repeat("\x01", api.MaxWorkspaceEnvBytes/2-8)
	env := []string{"A=" + value, "B=" + value}
	if err := api.CheckWorkspaceEnv("test", env); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := SnapshotMeta{FormatVersion: snapshotFormat, InstanceID: "i-1", StateBytes: 1, StateXXH3: "00112233445566778899aabbccddeeff",
		Compat:     api.SnapshotCompat{InstallationID: "sha256-a", QEMUVersion: "7.2.9", Accel: "tcg", MemoryMiB: 256, VCPUs: 1},
		Configured: &guestproto.ConfigureRequest{Hostname: "ws-1", Env: env}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) <= 64<<10 {
		t.Fatalf("snapshot.json of %d bytes: the test wants one over the old bound", len(b))
	}
	if err := os.WriteFile(filepath.Join(dir, SnapshotMetaFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readSnapshotMeta(dir)
	if err != nil || got.Configured == nil || !slices.Equal(got.Configured.Env, env) {
		t.Fatalf("read back: %v", err)
	}
}

// A guest agent that cannot take the environment is refused before it is
// told anything, saying so; one without environment to take is not.
func TestGuestTakesEnv(t *testing.T) {
	old := guestproto.GuestInfo{AgentVersion: "v0.9.0", Capabilities: []string{guestproto.CapConfigure}}
	if err := guestTakes(old, guestproto.ConfigureRequest{Hostname: "ws-1"}); err != nil {
		t.Errorf("no env: %v", err)
	}
	err := guestTakes(old, guestproto.ConfigureRequest{Env: []string{"TOKEN=s3cret"}})
	if err == nil || !strings.Contains(err.Error(), `guest agent (version "v0.9.0") cannot take the Workspace's environment variables`) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("an old agent: %v", err)
	}
	now := guestproto.GuestInfo{Capabilities: guestproto.Capabilities}
	if err := guestTakes(now, guestproto.ConfigureRequest{Env: []string{"TOKEN=s3cret"}}); err != nil {
		t.Errorf("this build's agent: %v", err)
	}
}
