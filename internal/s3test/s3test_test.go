package s3test_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/internal/s3test"
)

// StartTLS is reached with its CA as ca_file and its credentials file
// only; the object a store puts is in its bucket under the url's
// prefix.
func TestStartTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := s3test.StartTLS(t, l)
	if !strings.HasPrefix(srv.Endpoint, "https://127.0.0.1:") || srv.CAFile == "" {
		t.Fatalf("endpoint %s, CA file %q", srv.Endpoint, srv.CAFile)
	}
	cfg := artifacts.Config{URL: srv.URL("p"), Endpoint: srv.Endpoint, CredentialsFile: srv.CredentialsFile, CAFile: srv.CAFile}
	st, err := artifacts.Open(cfg, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	o, err := st.Put(context.Background(), strings.NewReader("hello"), "")
	if err != nil {
		t.Fatal(err)
	}
	if size, err := srv.Object("p/objects/sha256/" + o.Digest.Hex()); err != nil || size != 5 {
		t.Fatalf("object in the bucket: %d bytes, %v; keys:\n%s", size, err, srv.Keys("p/"))
	}
	if _, err := srv.Object("p/objects/sha256/none"); err == nil {
		t.Fatal("a missing object reported present")
	}

	// Keys of another id are refused, as S3 refuses them.
	other := filepath.Join(t.TempDir(), "other.toml")
	if err := os.WriteFile(other, []byte("access_key_id = \"AKIAOTHER\"\nsecret_access_key = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wrong, err := artifacts.Open(artifacts.Config{URL: cfg.URL, Endpoint: cfg.Endpoint, CredentialsFile: other, CAFile: cfg.CAFile}, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Put(context.Background(), strings.NewReader("x"), ""); err == nil || !strings.Contains(err.Error(), "InvalidAccessKeyId") {
		t.Fatalf("put with another access key id: %v", err)
	}

	// Without the CA the host's trust store refuses the certificate.
	cfg.CAFile = ""
	untrusted, err := artifacts.Open(cfg, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusted.Put(context.Background(), strings.NewReader("x"), ""); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("put without the CA: %v", err)
	}
}
