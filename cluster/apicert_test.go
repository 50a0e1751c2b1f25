package cluster

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kibotos/kibotos/trust"
)

// A configured certificate replaced on disk (an ACME client's renewal)
// is served from the next look at the files on; a pair that does not
// load yet (the certificate written, not its key) keeps the one before.
func TestFileCertFollowsReplacedFiles(t *testing.T) {
	ca, err := trust.NewCA("public")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	write := func(name string, cert, key bool) []byte {
		certPEM, keyPEM, err := ca.IssueKeyPair(trust.Identity{ClusterID: "public", Kind: trust.KindAPIServer, NodeID: name}, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if cert {
			os.WriteFile(certFile, certPEM, 0o600)
		}
		if key {
			os.WriteFile(keyFile, keyPEM, 0o600)
		}
		return certPEM
	}
	served := func(f *fileCert) string {
		f.checked = time.Time{} // as if fileCertCheck had passed
		c, err := f.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.Subject.CommonName
	}
	write("first", true, true)
	f, err := loadFileCert(certFile, keyFile, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := served(f); got != "first" {
		t.Fatalf("served %q, want first", got)
	}
	write("second", true, false)
	if got := served(f); got != "first" {
		t.Fatalf("with the certificate replaced and not its key: served %q, want first still", got)
	}
	write("third", true, true)
	if got := served(f); got != "third" {
		t.Fatalf("with both replaced: served %q, want third", got)
	}
	if _, err := loadFileCert(certFile, filepath.Join(dir, "missing.key"), f.log); err == nil {
		t.Fatal("a missing key file was loaded")
	}
}
