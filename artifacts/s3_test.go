package artifacts

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/kibotos/kibotos/api"
)

func TestParseS3URL(t *testing.T) {
	for raw, want := range map[string][2]string{
		"s3://kibotos-artifacts":                                                {"kibotos-artifacts", ""},
		"s3://kibotos-artifacts/":                                               {"kibotos-artifacts", ""},
		"s3://my.bucket-1/cluster-a/artifacts/":                                 {"my.bucket-1", "cluster-a/artifacts"},
		"s3://abc/" + strings.Repeat("a", 255) + "/" + strings.Repeat("b", 255): {"abc", strings.Repeat("a", 255) + "/" + strings.Repeat("b", 255)},
		"s3://abc/v1.2_x-y/" + strings.Repeat("b", 8):                           {"abc", "v1.2_x-y/bbbbbbbb"},
	} {
		u, err := ParseURL(raw)
		if err != nil {
			t.Errorf("ParseURL(%.40q): %v", raw, err)
			continue
		}
		if b, p, err := bucketAndPrefix(u); err != nil || b != want[0] || p != want[1] {
			t.Errorf("%.40q: bucket %q prefix %q, %v; want %q", raw, b, p, err, want)
		}
	}
	for raw, says := range map[string]string{
		"s3://Bucket/x":                            "not an S3 bucket name",
		"s3://ab/x":                                "not an S3 bucket name",
		"s3://" + strings.Repeat("a", 64):          "not an S3 bucket name",
		"s3://-bucket":                             "not an S3 bucket name",
		"s3://my..bucket":                          "not an S3 bucket name",
		"s3://192.168.1.1":                         "not an S3 bucket name",
		"s3://xn--bucket":                          "not an S3 bucket name",
		"s3://my_bucket":                           "not an S3 bucket name",
		"s3://bucket/a/../b":                       "none of them . or ..",
		"s3://bucket/..":                           "none of them . or ..",
		"s3://bucket//a":                           "none of them . or ..",
		"s3://bucket/a//b":                         "none of them . or ..",
		"s3://bucket/a b":                          "none of them . or ..",
		"s3://bucket/a?versionId=1":                "query",
		"s3://bucket/a#b":                          "fragment",
		"s3://key:secret@bucket/a":                 "user",
		"s3://bucket:9000/a":                       "port",
		"s3:bucket":                                "not an S3 bucket name",
		"s3://bucket/" + strings.Repeat("a/", 257): "at most 512",
		"s3://bucket/" + strings.Repeat("a", 256):  "none of them . or ..",
	} {
		_, err := ParseURL(raw)
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), "[artifacts] url") {
			t.Errorf("ParseURL(%.50q) = %v, want invalid_argument saying %q", raw, err, says)
		}
		if err != nil && strings.Contains(err.Error(), "secret@") {
			t.Errorf("%q: the error shows the password: %v", raw, err)
		}
	}
}

func TestS3Config(t *testing.T) {
	good := writeCredentials(t, accessKey, 0o600)
	open := func(c Config) error {
		if c.URL == "" {
			c.URL = "s3://kibotos-artifacts/cluster-a"
		}
		return c.Check()
	}
	for _, ep := range []string{"", "https://s3.example.net:9000", "https://s3.eu-west-1.amazonaws.com/", "http://127.0.0.1:9000", "http://[::1]:9000", "http://localhost:9000"} {
		if err := open(Config{Endpoint: ep, CredentialsFile: good, Region: "eu-west-1"}); err != nil {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}
	loose := writeCredentials(t, accessKey, 0o644)
	dir := t.TempDir()
	badTOML := filepath.Join(dir, "bad.toml")
	os.WriteFile(badTOML, []byte("access_key_id = \""+accessKey+"\"\nsecret_access_key = "+secretKey+"\n"), 0o600)
	extra := filepath.Join(dir, "extra.toml")
	os.WriteFile(extra, []byte("access_key_id = \"a\"\nsecret_access_key = \"b\"\nsession_token = \"c\"\n"), 0o600)
	empty := filepath.Join(dir, "empty.toml")
	os.WriteFile(empty, []byte("access_key_id = \"a\"\n"), 0o600)
	for name, tc := range map[string]struct {
		c    Config
		says string
	}{
		"http elsewhere":        {Config{Endpoint: "http://10.0.0.5:9000", CredentialsFile: good}, "plain http to a host other than this one"},
		"http by name":          {Config{Endpoint: "http://minio.internal:9000", CredentialsFile: good}, "give https://minio.internal:9000"},
		"endpoint scheme":       {Config{Endpoint: "ftp://s3.example.net", CredentialsFile: good}, `scheme "ftp"`},
		"endpoint path":         {Config{Endpoint: "https://s3.example.net/bucket", CredentialsFile: good}, "https://host[:port]"},
		"endpoint user":         {Config{Endpoint: "https://key:" + secretKey + "@s3.example.net", CredentialsFile: good}, "names a user"},
		"region":                {Config{Region: "EU West", CredentialsFile: good}, "not a region name"},
		"no credentials":        {Config{}, "give credentials_file"},
		"relative credentials":  {Config{CredentialsFile: "s3.toml"}, "not an absolute path"},
		"missing credentials":   {Config{CredentialsFile: filepath.Join(dir, "none.toml")}, "no such file"},
		"credentials a dir":     {Config{CredentialsFile: dir}, "not a regular file"},
		"credentials readable":  {Config{CredentialsFile: loose}, "chmod 600 " + loose},
		"credentials not TOML":  {Config{CredentialsFile: badTOML}, "is not TOML at line 2"},
		"credentials extra key": {Config{CredentialsFile: extra}, "unknown key session_token"},
		"credentials half":      {Config{CredentialsFile: empty}, "give both access_key_id and secret_access_key"},
		"s3 keys for file://":   {Config{URL: "file:///srv/artifacts", Endpoint: "https://s3.example.net"}, "are an s3:// store's"},
	} {
		err := open(tc.c)
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want invalid_argument saying %q", name, err, tc.says)
		}
		if err != nil && strings.Contains(err.Error(), secretKey) {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
	}
}

func TestS3StoreNamesNoCredentials(t *testing.T) {
	s := newS3Store(t, testBucket)
	if s.String() != "s3://"+testBucket+"/"+testPrefix {
		t.Fatalf("String() = %q", s.String())
	}
	sc, err := parseS3Config(&url.URL{Scheme: "s3", Host: testBucket}, Config{CredentialsFile: writeCredentials(t, accessKey, 0o600)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"%v", "%+v", "%#v"} {
		if got := strings.ReplaceAll(fmt.Sprintf(f, sc), "\n", " "); strings.Contains(got, secretKey) {
			t.Errorf("%s of the configuration shows the secret: %s", f, got)
		}
	}
}

// A put of content other than want is aborted: the parts already sent
// (many parts) or none (small) are dropped and no object is completed.
func TestS3PutOfWrongContentAbortsTheUpload(t *testing.T) {
	f := newFakeS3(t)
	s := openS3(t, f.url, testBucket, accessKey)
	for name, tc := range map[string]struct {
		size  int
		parts int
	}{"small": {100, 0}, "many parts": {11 << 20, 2}} {
		before := len(f.requests())
		_, err := s.Put(context.Background(), bytes.NewReader(content(t, tc.size)), digestOfBytes([]byte("expected")))
		if err == nil {
			t.Fatalf("%s: wrong content stored", name)
		}
		reqs := f.requests()[before:]
		if n := count(reqs, "PUT part"); n != tc.parts || count(reqs, "DELETE upload") != 1 || count(reqs, "POST upload") != 1 || count(reqs, "PUT object") != 0 {
			t.Errorf("%s: requests %v, want one upload started, %d parts, aborted, none completed", name, reqs, tc.parts)
		}
		if got := stored(t, s); len(got) != 0 {
			t.Fatalf("%s: a refused put left %v", name, got)
		}
	}
}

func count(reqs []string, r string) int {
	n := 0
	for _, x := range reqs {
		if x == r {
			n++
		}
	}
	return n
}

// gofakes3 cannot verify a signature: the fake refuses an access key id
// it does not know, as S3 does, and the error says where to look.
func TestS3WrongCredentials(t *testing.T) {
	f := newFakeS3(t)
	s := openS3(t, f.url, testBucket, "AKIDWRONG")
	_, err := s.Put(context.Background(), strings.NewReader("x"), "")
	if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "InvalidAccessKeyId") ||
		!strings.Contains(err.Error(), "check [artifacts] credentials_file") || strings.Contains(err.Error(), secretKey) {
		t.Fatalf("Put with a wrong key = %v", err)
	}
	_, err = s.Stat(context.Background(), digestOfBytes([]byte("x")))
	if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "check [artifacts] credentials_file") {
		t.Fatalf("Stat with a wrong key = %v", err)
	}
}

func TestS3MissingBucket(t *testing.T) {
	s := newS3Store(t, "no-such-bucket")
	d := digestOfBytes([]byte("x"))
	for name, err := range map[string]error{
		"stat": func() error { _, err := s.Stat(context.Background(), d); return err }(),
		"put":  func() error { _, err := s.Put(context.Background(), strings.NewReader("x"), ""); return err }(),
		"read": func() error { _, err := s.OpenAt(context.Background(), d, 0); return err }(),
	} {
		if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "bucket no-such-bucket does not exist") {
			t.Errorf("%s in a missing bucket = %v", name, err)
		}
	}
}

// An endpoint that accepts connections and never answers fails an
// operation once a connection has stalled, or when the caller's context
// ends, whichever comes first.
func TestS3DeadEndpoint(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var held []net.Conn
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	open := func(stall time.Duration) *S3 {
		u, _ := url.Parse("s3://" + testBucket)
		sc, err := parseS3Config(u, Config{Endpoint: "http://" + l.Addr().String(), CredentialsFile: writeCredentials(t, accessKey, 0o600)})
		if err != nil {
			t.Fatal(err)
		}
		sc.stall = stall
		s, err := newS3(sc, "node-a")
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	o := Object{Digest: digestOfBytes([]byte("x")), Size: 1}

	start := time.Now()
	_, err = open(200*time.Millisecond).Stat(context.Background(), o.Digest)
	if api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "is reachable from this host") || time.Since(start) > 20*time.Second {
		t.Fatalf("Stat at a stalled endpoint = %v after %v", err, time.Since(start))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	err = Fetch(ctx, open(s3Stall), o, filepath.Join(t.TempDir(), "x"), nil)
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("Fetch from a stalled endpoint = %v after %v, want the context's end", err, time.Since(start))
	}
}

// A key ParseKey takes may not fit S3's 1024 bytes behind a long prefix:
// refused before any request, saying what to shorten.
func TestS3NamedKeyTooLongForThePrefix(t *testing.T) {
	prefix := strings.Repeat("p", 255) + "/" + strings.Repeat("q", 255)
	st, err := Open(Config{URL: "s3://" + testBucket + "/" + prefix, Endpoint: newFakeS3(t).url, CredentialsFile: writeCredentials(t, accessKey, 0o600)}, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.PutNamed(context.Background(), strings.Repeat("k", MaxKeyBytes), strings.NewReader("x"))
	if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), "S3 allows 1024: choose a shorter key or [artifacts] url prefix") {
		t.Fatalf("PutNamed of a key too long behind the prefix = %v", err)
	}
	putNamed(t, st, strings.Repeat("k", 400), []byte("x"))
}

// An https endpoint signed by a private CA: refused against the host's
// trust store, reached with ca_file naming that CA; ca_file must hold a
// certificate and goes with https only.
func TestS3PrivateCA(t *testing.T) {
	mem := s3mem.New()
	if err := mem.CreateBucket(testBucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(gofakes3.New(mem).Server())
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	creds := writeCredentials(t, accessKey, 0o600)
	open := func(caFile string) (Store, error) {
		return Open(Config{URL: "s3://" + testBucket + "/" + testPrefix, Endpoint: srv.URL, CredentialsFile: creds, CAFile: caFile}, "node-a")
	}
	ctx := context.Background()
	untrusted, err := open("")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusted.Put(ctx, strings.NewReader("hello"), ""); api.CodeOf(err) != api.CodeUnavailable || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("put to an endpoint of an unknown CA: %v, want unavailable naming the certificate", err)
	}
	trusted, err := open(ca)
	if err != nil {
		t.Fatal(err)
	}
	o, err := trusted.Put(ctx, strings.NewReader("hello"), "")
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := Get(ctx, trusted, o.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, err := io.ReadAll(rc); err != nil || string(b) != "hello" {
		t.Fatalf("read back %q %v", b, err)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o644)
	if _, err := open(notPEM); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Errorf("ca_file without a certificate: %v", err)
	}
	if err := (Config{URL: "s3://" + testBucket + "/p", Endpoint: "http://127.0.0.1:9000", CredentialsFile: creds, CAFile: ca}).Check(); err == nil || !strings.Contains(err.Error(), "goes with an https:// endpoint") {
		t.Errorf("ca_file with http: %v", err)
	}
	if err := (Config{URL: "file:///srv/artifacts", CAFile: ca}).Check(); err == nil {
		t.Error("ca_file for a file:// store accepted")
	}
}
