// Package s3test starts an S3-protocol server for tests of the s3://
// artifact store outside package artifacts: gofakes3 (the server rclone's
// `serve s3` is built on) with its in-memory backend, on a real loopback
// port, so the store's client (minio-go, SigV4-signed requests, multipart
// uploads, ranged reads) runs as against any endpoint. gofakes3 does not
// verify signatures; package artifacts tests refused credentials.
package s3test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// Server is a running server with one bucket and a credentials file an
// [artifacts] section can name.
type Server struct {
	Endpoint        string
	Bucket          string
	CredentialsFile string
}

// URL is the store's [artifacts] url under prefix.
func (s *Server) URL(prefix string) string { return "s3://" + s.Bucket + "/" + prefix }

// Start starts a server that stops with the test.
func Start(t testing.TB) *Server {
	t.Helper()
	mem := s3mem.New()
	const bucket = "kibotos-test"
	if err := mem.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(mem).Server())
	t.Cleanup(srv.Close)
	creds := filepath.Join(t.TempDir(), "s3.toml")
	if err := os.WriteFile(creds, []byte("access_key_id = \"AKIATEST\"\nsecret_access_key = \"kibotos-test-secret\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Server{Endpoint: srv.URL, Bucket: bucket, CredentialsFile: creds}
}
