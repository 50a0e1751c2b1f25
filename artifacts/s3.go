package artifacts

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/internal/ctxio"
	"github.com/kibotos/kibotos/storagepool"
)

// S3 is the bucket backend: objects/sha256/<hex> and named/<key> under
// its prefix in an S3-compatible bucket. An object appears whole because
// S3 shows a key only once the single request or multipart upload that
// writes it completes; Put completes one only for content whose digest it
// checked.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string // "" or segments joined by "/", no leading or trailing "/"
	node   string
	// partSize is what Put buffers and sends per request (tests lower it
	// to reach many parts with small objects).
	partSize uint64
	// listPage is how many keys ListNamed asks for per request (0: the
	// endpoint's default, 1000 on S3; tests lower it to reach many pages).
	listPage int
	// maxListed bounds a listing (defaultMaxListed; tests lower it).
	maxListed int
}

// DefaultS3Endpoint is [artifacts] endpoint when none is given.
const DefaultS3Endpoint = "https://s3.amazonaws.com"

// s3PartBytes is a Put's part: S3 allows 10,000 parts, and 10,000 of
// these hold MaxObjectBytes. One part per Put is held in memory.
const s3PartBytes = 112 << 20

// s3Stall bounds how long a connection to the endpoint may make no
// progress (a request written, a response read; dialing and the TLS
// handshake have their own bounds) before the operation fails: a dead
// endpoint fails a start in minutes, never hangs it.
const s3Stall = 2 * time.Minute

// s3CopyBytes is the most S3 copies in one request.
const s3CopyBytes = 5 << 30

// s3Retries is how often minio-go retries a failed request (it waits
// between tries, and honours the context throughout).
const s3Retries = 3

// s3Config is an s3:// store's settings, checked.
type s3Config struct {
	bucket, prefix string
	endpoint       *url.URL
	region         string
	// creds is a pointer: a configuration printed with %+v shows its
	// address, never the secret key.
	creds *credentials.Credentials
	stall time.Duration
	// roots replace the host's trust store for the endpoint (ca_file).
	roots *x509.CertPool
}

var (
	bucketPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	segment       = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,255}$`)
	regionPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
)

// maxPrefixBytes leaves room in S3's 1024-byte keys for what follows the
// prefix (a staging key is the longest, about 100 bytes).
const maxPrefixBytes = 512

// bucketAndPrefix reads s3://bucket/prefix: a bucket named by S3's rules
// and a prefix of plain segments (letters, digits, '.', '_', '-'), so a
// key never needs escaping and never climbs out with "..".
func bucketAndPrefix(u *url.URL) (bucket, prefix string, err error) {
	raw := u.Redacted()
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Port() != "" {
		return "", "", api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q has a user, port, query or fragment: give s3://bucket/prefix and the endpoint as [artifacts] endpoint", raw)
	}
	bucket = u.Host
	if !bucketPattern.MatchString(bucket) || strings.Contains(bucket, "..") || net.ParseIP(bucket) != nil ||
		strings.HasPrefix(bucket, "xn--") || strings.HasSuffix(bucket, "-s3alias") || strings.HasSuffix(bucket, "--ol-s3") {
		return "", "", api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: bucket %q is not an S3 bucket name: give 3 to 63 lower-case letters, digits, '.' and '-', starting and ending with a letter or digit", raw, bucket)
	}
	prefix = strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/")
	if prefix == "" {
		return bucket, "", nil
	}
	if len(prefix) > maxPrefixBytes {
		return "", "", api.Errorf(api.CodeInvalidArgument, "[artifacts] url: the prefix is %d bytes long: give at most %d", len(prefix), maxPrefixBytes)
	}
	for _, seg := range strings.Split(prefix, "/") {
		if !segment.MatchString(seg) || seg == "." || seg == ".." {
			return "", "", api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q: the prefix %q must be segments of letters, digits, '.', '_' and '-' between single '/', none of them . or .., e.g. s3://bucket/kibotos/artifacts", raw, prefix)
		}
	}
	return bucket, prefix, nil
}

// parseS3Config checks an s3:// store's [artifacts] keys and reads its
// credentials file.
func parseS3Config(u *url.URL, c Config) (s3Config, error) {
	bucket, prefix, err := bucketAndPrefix(u)
	if err != nil {
		return s3Config{}, err
	}
	sc := s3Config{bucket: bucket, prefix: prefix, region: c.Region, stall: s3Stall}
	if c.Region != "" && !regionPattern.MatchString(c.Region) {
		return s3Config{}, api.Errorf(api.CodeInvalidArgument, "[artifacts] region %.80q is not a region name such as eu-west-1", c.Region)
	}
	if sc.endpoint, err = parseEndpoint(c.Endpoint); err != nil {
		return s3Config{}, err
	}
	if c.CredentialsFile == "" {
		return s3Config{}, api.Errorf(api.CodeInvalidArgument, "[artifacts] url %q is an s3:// store: give credentials_file, a file (mode 600) holding access_key_id and secret_access_key", u)
	}
	if sc.creds, err = readCredentials(c.CredentialsFile); err != nil {
		return s3Config{}, err
	}
	if c.CAFile != "" {
		if sc.endpoint.Scheme != "https" {
			return s3Config{}, api.Errorf(api.CodeInvalidArgument, "[artifacts] ca_file %s goes with an https:// endpoint, and the endpoint is %s", c.CAFile, sc.endpoint)
		}
		if sc.roots, err = readCAFile(c.CAFile); err != nil {
			return s3Config{}, err
		}
	}
	return sc, nil
}

// readCAFile reads the PEM certificates of a private CA (bounded).
func readCAFile(path string) (*x509.CertPool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] ca_file %s: %v", path, err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] ca_file %s: %v", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] ca_file %s holds no PEM certificate: give the CA certificate(s) that signed the endpoint's", path)
	}
	return pool, nil
}

// parseEndpoint checks [artifacts] endpoint: https, or http to this host
// only, since the requests carry a signature made with the secret key
// and the objects themselves.
func parseEndpoint(raw string) (*url.URL, error) {
	if raw == "" {
		raw = DefaultS3Endpoint
	}
	u, err := url.Parse(raw)
	if err == nil && u.User != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint %q names a user: give https://host[:port] and the keys in credentials_file", u.Redacted())
	}
	if err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint %.200q is not a URL of the form https://host[:port], e.g. https://s3.example.net:9000", raw)
	}
	switch u.Scheme {
	case "https":
	case "http":
		if ip := net.ParseIP(u.Hostname()); u.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint %q is plain http to a host other than this one: the objects and signed requests would cross the network in cleartext; give https://%s", raw, u.Host)
		}
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint %q: scheme %q is not supported; give https://host[:port]", raw, u.Scheme)
	}
	return u, nil
}

// readCredentials reads access_key_id and secret_access_key from a TOML
// file only its owner may read. Its errors name the file, never what it
// holds.
func readCredentials(file string) (*credentials.Credentials, error) {
	if !strings.HasPrefix(file, "/") {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %q is not an absolute path", file)
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %s is not a regular file", file)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %s is open to group or others (mode %04o): chmod 600 %s", file, fi.Mode().Perm(), file)
	}
	var creds struct {
		AccessKeyID     string `toml:"access_key_id"`
		SecretAccessKey string `toml:"secret_access_key"`
	}
	md, err := toml.DecodeFile(file, &creds)
	if err != nil {
		// A parse error may quote the line it stopped on: the secret.
		where := ""
		var pe toml.ParseError
		if errors.As(err, &pe) {
			where = fmt.Sprintf(" at line %d", pe.Position.Line)
		}
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %s is not TOML%s: give access_key_id = \"...\" and secret_access_key = \"...\"", file, where)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %s: unknown key %s: give access_key_id and secret_access_key only", file, und[0])
	}
	if creds.AccessKeyID == "" || creds.SecretAccessKey == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] credentials_file %s: give both access_key_id and secret_access_key", file)
	}
	return credentials.NewStaticV4(creds.AccessKeyID, creds.SecretAccessKey, ""), nil
}

// newS3 is the store sc names; node names its staging keys. It sends
// nothing yet.
func newS3(sc s3Config, node string) (*S3, error) {
	if _, err := (storagepool.Temp{Node: node, Purpose: "put"}).Name(); err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "artifact store s3://%s: %v", sc.bucket, err)
	}
	secure := sc.endpoint.Scheme == "https"
	client, err := minio.New(sc.endpoint.Host, &minio.Options{
		Creds:      sc.creds,
		Secure:     secure,
		Region:     sc.region,
		Transport:  stallTransport(sc.stall, secure, sc.roots),
		MaxRetries: s3Retries,
	})
	if err != nil {
		return nil, api.Errorf(api.CodeInvalidArgument, "[artifacts] endpoint %s: %v", sc.endpoint, err)
	}
	return &S3{client: client, bucket: sc.bucket, prefix: sc.prefix, node: node, partSize: s3PartBytes, maxListed: defaultMaxListed}, nil
}

// stallTransport fails a connection that makes no progress for stall,
// whatever it waits on.
func stallTransport(stall time.Duration, secure bool, roots *x509.CertPool) *http.Transport {
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return stallConn{c, stall}, nil
		},
		MaxIdleConnsPerHost: 16,
		// Below stall: the transport, not a read deadline, ends an
		// idle connection.
		IdleConnTimeout:       min(time.Minute, stall/2),
		TLSHandshakeTimeout:   30 * time.Second,
		ExpectContinueTimeout: 10 * time.Second,
		// An object is raw bytes: never let the transport decode them.
		DisableCompression: true,
	}
	if secure {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	}
	return tr
}

// stallConn gives every read and write stall to make progress. A write
// extends the pending read too: net/http reads a connection all along,
// also while it writes a long request body (and S3 sends spaces while it
// completes a long copy or upload, so a slow answer is progress too).
type stallConn struct {
	net.Conn
	stall time.Duration
}

func (c stallConn) Read(p []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(c.stall))
	return c.Conn.Read(p)
}

func (c stallConn) Write(p []byte) (int, error) {
	c.Conn.SetDeadline(time.Now().Add(c.stall))
	return c.Conn.Write(p)
}

func (s *S3) String() string {
	if s.prefix == "" {
		return "s3://" + s.bucket
	}
	return "s3://" + s.bucket + "/" + s.prefix
}

func (s *S3) key(parts ...string) string { return path.Join(append([]string{s.prefix}, parts...)...) }

// object is where d lies (l.err if d is not a digest).
func (s *S3) object(d Digest) loc {
	_, err := ParseDigest(string(d))
	return loc{s.key("objects", "sha256", d.Hex()), digestRef(s, d), err}
}

// namedObject is where key lies (l.err if it is not a key, or too long
// for S3 with the store's prefix): under named/, so a listing never
// reaches objects/ or staging/.
func (s *S3) namedObject(key string) loc {
	l := loc{s.key("named", key), keyRef(s, key), checkKey(s, key)}
	if l.err == nil && len(l.at) > s3KeyBytes {
		l.err = api.Errorf(api.CodeInvalidArgument, "artifact store %s: key %s makes the S3 key %d bytes long with the store's prefix, S3 allows %d: choose a shorter key or [artifacts] url prefix", s, key, len(l.at), s3KeyBytes)
	}
	return l
}

// s3KeyBytes is the longest key S3 takes.
const s3KeyBytes = 1024

// Put streams what r yields into the bucket. With want, straight to the
// object's key: the reader fails instead of ending when the content does
// not match, so the upload is aborted and the key never appears. Without
// want, the digest (and so the key) is known only at the end: through a
// staging key (staged). Like Dir it always writes, so a Put repairs an
// object damaged in place.
func (s *S3) Put(ctx context.Context, r io.Reader, want Digest) (Object, error) {
	if want != "" {
		l := s.object(want)
		if l.err != nil {
			return Object{}, l.err
		}
		return s.upload(ctx, l.at, r, want)
	}
	return s.staged(ctx, r, func(o Object) string { return s.object(o.Digest).at })
}

// PutNamed writes as Put does without a digest, through a staging key:
// one write path for both, and the key changes only when the copy of a
// complete, counted upload does (what was there stays until then).
func (s *S3) PutNamed(ctx context.Context, key string, r io.Reader) (Object, error) {
	l := s.namedObject(key)
	if l.err != nil {
		return Object{}, l.err
	}
	o, err := s.staged(ctx, r, func(Object) string { return l.at })
	if err != nil {
		return Object{}, fmt.Errorf("put %s: %w", l.name, err) // the errors above name the staging key
	}
	return o, nil
}

// staged uploads what r yields to a staging key of this node and copies
// it server-side to the key final names from its digest and size, where
// it appears whole once the copy completes.
func (s *S3) staged(ctx context.Context, r io.Reader, final func(Object) string) (Object, error) {
	var b [8]byte
	rand.Read(b[:])
	key := s.key("staging", s.node+"."+hex.EncodeToString(b[:]))
	// Also when the upload or the copy failed: a staging key is never
	// read, only left behind.
	defer s.client.RemoveObject(context.WithoutCancel(ctx), s.bucket, key, minio.RemoveObjectOptions{})
	o, err := s.upload(ctx, key, r, "")
	if err != nil {
		return Object{}, err
	}
	dstKey := final(o)
	dst, src := minio.CopyDestOptions{Bucket: s.bucket, Object: dstKey}, minio.CopySrcOptions{Bucket: s.bucket, Object: key}
	if o.Size <= s3CopyBytes {
		_, err = s.client.CopyObject(ctx, dst, src)
	} else {
		// In parts (UploadPartCopy), which S3 requires past 5 GiB;
		// minio-go copies even a small object so, in three requests.
		_, err = s.client.ComposeObject(ctx, dst, src)
	}
	if err != nil {
		return Object{}, s.fail(ctx, "copy "+key+" to "+dstKey, nil, err)
	}
	return o, nil
}

// upload streams what r yields to key and returns its digest and size;
// with want, content that hashes otherwise fails the reader, so the
// upload is aborted and key never appears.
func (s *S3) upload(ctx context.Context, key string, r io.Reader, want Digest) (Object, error) {
	br := bufio.NewReader(ctxio.Reader(ctx, r)) // large reads pass it by
	hr := &hashingReader{r: br, h: sha256.New(), want: want, name: s}
	size := int64(-1) // unknown: a multipart upload, whose parts may not be empty
	if _, err := br.Peek(1); err == io.EOF {
		if io.Copy(io.Discard, hr); hr.err != nil {
			return Object{}, hr.err // not want
		}
		size = 0
	}
	_, err := s.client.PutObject(ctx, s.bucket, key, hr, size, minio.PutObjectOptions{
		PartSize:    s.partSize,
		ContentType: "application/octet-stream",
		// The content is checked end to end by its sha256 digest and by
		// TLS in transit; signing it too would hash every byte once more
		// (and gofakes3, the tests' server, cannot read a signed part).
		DisableContentSha256: true,
	})
	if hr.err != nil {
		return Object{}, hr.err
	}
	if err != nil {
		return Object{}, s.fail(ctx, "upload "+key, nil, err)
	}
	return Object{Digest: digestOf(hr.h), Size: hr.n}, nil
}

// hashingReader hashes and counts what passes through; at the end it
// fails instead of returning io.EOF when the content is not want, and it
// fails as soon as there is more than MaxObjectBytes.
type hashingReader struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	want Digest
	name Store
	err  error
}

func (hr *hashingReader) Read(p []byte) (int, error) {
	if hr.err != nil {
		return 0, hr.err
	}
	n, err := hr.r.Read(p)
	hr.h.Write(p[:n])
	hr.n += int64(n)
	switch {
	case hr.n > MaxObjectBytes:
		hr.err = api.Errorf(api.CodeInvalidArgument, "object for %s is larger than %d bytes", hr.name, int64(MaxObjectBytes))
	case err == io.EOF && hr.want != "" && digestOf(hr.h) != hr.want:
		hr.err = fmt.Errorf("%s: what was written hashes to %s: %w; nothing was stored", objectName(hr.name, hr.want), digestOf(hr.h).Short(), ErrCorrupt)
	case err != nil && err != io.EOF:
		hr.err = err // the caller's reader failed: say so, not what the upload made of it
	}
	if hr.err != nil {
		return 0, hr.err
	}
	return n, err
}

func (s *S3) Stat(ctx context.Context, d Digest) (Object, error) {
	size, err := s.stat(ctx, s.object(d))
	if err != nil {
		return Object{}, err
	}
	return Object{Digest: d, Size: size}, nil
}

func (s *S3) StatNamed(ctx context.Context, key string) (int64, error) {
	return s.stat(ctx, s.namedObject(key))
}

func (s *S3) OpenAt(ctx context.Context, d Digest, offset int64) (io.ReadCloser, error) {
	return s.open(ctx, s.object(d), offset)
}

func (s *S3) OpenNamed(ctx context.Context, key string, offset int64) (io.ReadCloser, error) {
	return s.open(ctx, s.namedObject(key), offset)
}

func (s *S3) Delete(ctx context.Context, d Digest) error { return s.remove(ctx, s.object(d)) }

func (s *S3) DeleteNamed(ctx context.Context, key string) error {
	return s.remove(ctx, s.namedObject(key))
}

func (s *S3) stat(ctx context.Context, l loc) (int64, error) {
	if l.err != nil {
		return 0, l.err
	}
	info, err := s.client.StatObject(ctx, s.bucket, l.at, minio.StatObjectOptions{})
	if err != nil {
		return 0, s.fail(ctx, "stat", &l.ref, err)
	}
	return info.Size, nil
}

func (s *S3) open(ctx context.Context, l loc, offset int64) (io.ReadCloser, error) {
	if l.err != nil {
		return nil, l.err
	}
	if err := l.checkOffset(offset); err != nil {
		return nil, err
	}
	var opts minio.GetObjectOptions
	if offset > 0 {
		opts.SetRange(offset, 0)
	}
	body, _, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, l.at, opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "InvalidRange" {
			return io.NopCloser(strings.NewReader("")), nil // at or past the end, as a file reads
		}
		return nil, s.fail(ctx, "read", &l.ref, err)
	}
	return body, nil
}

// remove deletes the object at l; one that is not there is no error.
func (s *S3) remove(ctx context.Context, l loc) error {
	if l.err != nil {
		return l.err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, l.at, minio.RemoveObjectOptions{}); err != nil {
		if err := s.fail(ctx, "delete", &l.ref, err); api.CodeOf(err) != api.CodeNotFound {
			return err
		}
	}
	return nil
}

// ListNamed pages through the listing (minio-go asks for the next page
// until the answer is complete).
func (s *S3) List(ctx context.Context) ([]Listed, error) {
	ctx, cancel := context.WithCancel(ctx) // see ListNamed
	defer cancel()
	root := s.key("objects", "sha256") + "/"
	l := objectListing{s: s, max: s.maxListed}
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: root, Recursive: true, MaxKeys: s.listPage}) {
		if o.Err != nil {
			return nil, s.fail(ctx, "list objects", nil, o.Err)
		}
		if err := l.add(strings.TrimPrefix(o.Key, root), o.Size, o.LastModified); err != nil {
			return nil, err
		}
	}
	return l.sorted(), nil
}

func (s *S3) ListNamed(ctx context.Context, prefix string) ([]Named, error) {
	if err := checkPrefix(s, prefix); err != nil {
		return nil, err
	}
	// Cancelled on return: minio-go lists in a goroutine that stops
	// only so when the loop below stops early.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	root := s.key("named") + "/"
	l := listing{s: s, max: s.maxListed, prefix: prefix}
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: root + prefix, Recursive: true, MaxKeys: s.listPage}) {
		if o.Err != nil {
			return nil, s.fail(ctx, "list "+prefix, nil, o.Err)
		}
		if err := l.add(strings.TrimPrefix(o.Key, root), o.Size); err != nil {
			return nil, err
		}
	}
	return l.sorted(), nil
}

// fail turns what the endpoint or the network said about r (or about
// what alone, when r is nil) into one line saying what to do.
func (s *S3) fail(ctx context.Context, what string, r *ref, err error) error {
	if r != nil {
		what += " " + r.id
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == "NoSuchKey" || (resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket" && r != nil):
		// A HEAD answer has no body: a missing bucket reads as a
		// missing key until asked.
		if ok, berr := s.client.BucketExists(ctx, s.bucket); berr == nil && !ok {
			return s.fail(ctx, what, nil, minio.ErrorResponse{Code: "NoSuchBucket", StatusCode: http.StatusNotFound})
		}
		if r == nil {
			return api.Errorf(api.CodeNotFound, "artifact store %s: %s: not there (another writer removed it?); try again", s, what)
		}
		return r.missing()
	case resp.Code == "NoSuchBucket":
		return api.Errorf(api.CodeUnavailable, "artifact store %s: %s: bucket %s does not exist at %s: create it, or correct [artifacts] url and endpoint", s, what, s.bucket, s.client.EndpointURL().Host)
	case resp.StatusCode == http.StatusForbidden || resp.Code == "InvalidAccessKeyId" || resp.Code == "SignatureDoesNotMatch" || resp.Code == "AccessDenied":
		return api.Errorf(api.CodeUnavailable, "artifact store %s: %s: %s refused the request (%s: %s); check [artifacts] credentials_file and the bucket's policy", s, what, s.client.EndpointURL().Host, resp.Code, resp.Message)
	}
	return api.Errorf(api.CodeUnavailable, "artifact store %s: %s: %v; check that [artifacts] endpoint %s is reachable from this host", s, what, err, s.client.EndpointURL())
}
