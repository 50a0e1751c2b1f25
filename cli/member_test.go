package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
)

// A pool's capacity is ctrl's: a node configuration that still declares
// one (as earlier releases read it) makes start-up fail, naming the pool
// and the command that replaces it, before anything is started.
func TestServeRefusesPoolCapacity(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "kibotos.toml")
	os.WriteFile(config, []byte("[[storage.pools]]\nid = \"nfs-1\"\npath = \"/srv/nfs\"\nshared = true\ncapacity = \"2TiB\"\n"), 0o600)
	var out, errb bytes.Buffer
	code := Main(context.Background(), "kibotos", []string{"serve", "--config", config, "--data-dir", filepath.Join(dir, "data")}, nil, &out, &errb)
	if code != api.ExitInvalidArgument {
		t.Fatalf("exit %d, want %d: %s", code, api.ExitInvalidArgument, errb.String())
	}
	if msg := errb.String(); !strings.Contains(msg, "storage pool nfs-1: capacity is no longer a node setting") || !strings.Contains(msg, "kibo storage-pool set-capacity nfs-1 SIZE") {
		t.Fatalf("message: %s", msg)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("the refused start touched the data directory: %v", err)
	}
}
