// Package s3test starts an S3-protocol server for tests of the s3://
// artifact store outside package artifacts: gofakes3 (the server rclone's
// `serve s3` is built on) with its in-memory backend, on a real port, so
// the store's client (minio-go, SigV4-signed requests, multipart uploads,
// ranged reads) runs as against any endpoint: over plain http on loopback
// (Start), or over https with a certificate signed by a CA the test made,
// on a listener the caller opened where its members reach it (StartTLS),
// as an on-premises store signed by a private CA is reached.
//
// gofakes3 does not verify signatures: the server refuses a request whose
// access key id is not the credentials file's, as S3 does, so a member
// that signs with other keys is refused; package artifacts tests the
// refusal's message.
package s3test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// accessKeyID is the credentials file's key id, the only one served.
const accessKeyID = "AKIATEST"

// Server is a running server with one bucket and a credentials file an
// [artifacts] section can name.
type Server struct {
	Endpoint        string
	Bucket          string
	CredentialsFile string
	// CAFile is the PEM certificate of the CA that signed the server's
	// certificate, for [artifacts] ca_file (StartTLS only).
	CAFile string

	mem *s3mem.Backend
}

// URL is the store's [artifacts] url under prefix.
func (s *Server) URL(prefix string) string { return "s3://" + s.Bucket + "/" + prefix }

// Start starts a server on loopback over plain http; it stops with the
// test.
func Start(t testing.TB) *Server {
	t.Helper()
	s := newServer(t)
	srv := httptest.NewServer(s.handler())
	t.Cleanup(srv.Close)
	s.Endpoint = srv.URL
	return s
}

// StartTLS serves https on l (which it closes with the test) with a
// certificate for l's IP address, signed by a CA made here and written
// to CAFile.
func StartTLS(t testing.TB, l net.Listener) *Server {
	t.Helper()
	tcp, ok := l.Addr().(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		t.Fatalf("s3test: listener on %s: want a TCP listener on one IP address (the certificate names it)", l.Addr())
	}
	s := newServer(t)
	caPEM, cert := certificates(t, tcp.IP)
	s.CAFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(s.CAFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: s.handler()}, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	s.Endpoint = srv.URL
	return s
}

func newServer(t testing.TB) *Server {
	t.Helper()
	mem := s3mem.New()
	const bucket = "kibotos-test"
	if err := mem.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "s3.toml")
	if err := os.WriteFile(creds, []byte("access_key_id = \""+accessKeyID+"\"\nsecret_access_key = \"kibotos-test-secret\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &Server{Bucket: bucket, CredentialsFile: creds, mem: mem}
}

// handler is gofakes3 behind the access key id check.
func (s *Server) handler() http.Handler {
	return KeyChecked(gofakes3.New(s.mem).Server(), accessKeyID)
}

// KeyChecked serves h only the requests signed with access key id, and
// answers the others as S3 does an unknown key (gofakes3 checks none).
func KeyChecked(h http.Handler, id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Authorization"), "Credential="+id+"/") {
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key Id you provided does not exist in our records.</Message></Error>`)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Object is the size of the object at key in the bucket; an object
// that is not there is an error.
func (s *Server) Object(key string) (int64, error) {
	o, err := s.mem.HeadObject(s.Bucket, key)
	if err != nil {
		return 0, err
	}
	if o.Contents != nil {
		o.Contents.Close()
	}
	return o.Size, nil
}

// Keys lists the keys under prefix with their sizes, for messages.
func (s *Server) Keys(prefix string) string {
	l, err := s.mem.ListBucket(s.Bucket, &gofakes3.Prefix{HasPrefix: true, Prefix: prefix}, gofakes3.ListBucketPage{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, c := range l.Contents {
		fmt.Fprintf(&b, "%s (%d bytes)\n", c.Key, c.Size)
	}
	return b.String()
}

// certificates makes a CA and a server certificate for ip signed by it:
// the CA's PEM and the server's key pair.
func certificates(t testing.TB, ip net.IP) ([]byte, tls.Certificate) {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kibotos test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: ip.String()},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{ip},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
