package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// kibo operator issue writes a credential a person uses from any member's
// host, a node-only one included; it refuses to overwrite one.
func TestOperatorIssueWritesACredential(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	dir := filepath.Join(t.TempDir(), "alice")
	out := e.mustRun("operator", "issue", "alice", "--out", dir)
	if !strings.Contains(out, "operator alice: credential written to "+dir) {
		t.Fatalf("issue printed %q", out)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("credentials directory %s: %v %v, want 0700", dir, fi.Mode(), err)
	}
	for _, f := range []string{credCACert, credCert, credKey} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want 0600", f, fi, err)
		}
	}
	e.expectExit(api.ExitAlreadyExists, "pass --force to replace it", "operator", "issue", "alice", "--out", dir)
	e.expectExit(api.ExitInvalidArgument, "the maximum is 30d", "operator", "issue", "bob", "--ttl", "90d", "--out", filepath.Join(t.TempDir(), "bob"))
	list := e.mustRun("operator", "list")
	if !strings.Contains(list, "ISSUED BY") || !strings.Contains(list, "alice") || !strings.Contains(list, "admin@node-1") || !strings.Contains(list, "active") {
		t.Fatalf("operator list:\n%s", list)
	}
	if q := e.mustRun("operator", "list", "-q"); q != "alice\n" {
		t.Fatalf("operator list -q: %q", q)
	}

	// From the node-only member's host: its data directory holds no
	// operator credential; alice's works.
	worker := &cliEnv{t: t, c: e.c, dataDir: string(e.c.Members[1].Dir)}
	worker.expectExit(api.ExitUnauthenticated, "no operator credential found", "node", "drain", "node-1")
	worker.mustRun("--credentials", dir, "node", "drain", "node-1")

	e.mustRun("operator", "revoke", "alice")
	worker.expectExit(api.ExitUnauthenticated, "operator:alice was revoked", "--credentials", dir, "node", "get", "node-1")
}

// The CLI takes the first credential it finds: --credentials, then
// KIBOTOS_CREDENTIALS, then the per-user directory, then the member's.
// A damaged credential at a place earlier in the order is what it
// reports, though a good one waits further on.
func TestCredentialDiscoveryOrder(t *testing.T) {
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1})
	damaged := func() string {
		d := t.TempDir()
		for _, f := range []string{credCACert, credCert, credKey} {
			os.WriteFile(filepath.Join(d, f), []byte("not PEM"), 0o600)
		}
		return d
	}
	good := filepath.Join(t.TempDir(), "good")
	e.mustRun("operator", "issue", "carol", "--out", good)
	flagDir, envDir, userDir := damaged(), damaged(), damaged()
	config := t.TempDir()
	if err := os.MkdirAll(filepath.Join(config, "kibotos"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(userDir, filepath.Join(config, "kibotos", "credentials")); err != nil {
		t.Fatal(err)
	}
	userDir = filepath.Join(config, "kibotos", "credentials")
	t.Setenv("XDG_CONFIG_HOME", config)
	t.Setenv("KIBOTOS_CREDENTIALS", envDir)

	e.expectExit(api.ExitUnauthenticated, "operator credential "+flagDir, "--credentials", flagDir, "status")
	e.mustRun("--credentials", good, "status")
	e.expectExit(api.ExitUnauthenticated, "operator credential "+envDir, "status")
	t.Setenv("KIBOTOS_CREDENTIALS", good)
	e.mustRun("status")
	t.Setenv("KIBOTOS_CREDENTIALS", "")
	e.expectExit(api.ExitUnauthenticated, "operator credential "+userDir, "status")
	if err := os.RemoveAll(userDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(good, userDir); err != nil {
		t.Fatal(err)
	}
	e.mustRun("status")
	os.RemoveAll(userDir)
	e.mustRun("status") // the member's own (ctrl) operator certificate
}
