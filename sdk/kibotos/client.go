package kibotos

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/kibotos/kibotos/api"
)

// Options are the optional parts of a connection; nil is all defaults.
type Options struct {
	// CAFile and CAPEM are the CA (PEM) that issued the API listener's
	// certificate when it is not in the system's trust store: the
	// cluster CA (tls/ca.crt of a ctrl member), which also issued the
	// certificates of the nodes' data planes that Exec and Files reach.
	// Both may be given; neither: the system roots only, and Exec and
	// Files are refused (the data planes serve the cluster CA's).
	CAFile string
	CAPEM  []byte
	// HTTPClient, if set, sends the API calls (its transport decides
	// the TLS check; the CA above then serves the data planes only).
	HTTPClient *http.Client
	// Namespace is the namespace every call names. An API key works in
	// its own namespace: leave it empty, or give that one (Connect then
	// checks the key belongs to it).
	Namespace string
	// MaxRetries bounds how often a call refused for the key's rate
	// (429) or because no leader answered (unavailable) is sent again;
	// 0 is 8, negative is none. The call's context bounds it too.
	MaxRetries int
}

// Client is a connection to a Kibotos API listener with an API key. It is
// safe for concurrent use.
type Client struct {
	// Workspaces are the namespace's Workspaces.
	Workspaces *WorkspaceService
	// Volumes are the namespace's Volumes.
	Volumes *VolumeService

	base      string // https://HOST:PORT[/prefix]
	token     string
	namespace string
	hc        *http.Client
	// dataRoots is the CA a node's data plane is checked against: the
	// one given alone, never the system roots (nil: none given).
	dataRoots *x509.CertPool
	retries   int
}

// Connect checks that the API at apiURL (https://HOST:PORT, the [api]
// listen address of a ctrl member, or behind a proxy with a path prefix)
// answers and accepts token (an API key, kbt_...), and returns a client
// that sends it with every call. The server's certificate is checked
// against the system roots and the CA of opts.
func Connect(ctx context.Context, apiURL, token string, opts *Options) (*Client, error) {
	if opts == nil {
		opts = &Options{}
	}
	u, err := url.Parse(apiURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, errorf(CodeInvalidArgument, "kibotos: API URL %q: want https://HOST:PORT (the [api] listen address of a ctrl member)", apiURL)
	}
	if token == "" {
		return nil, errorf(CodeUnauthenticated, "kibotos: no API key for %s: give the key kibo api-key create printed (kbt_...)", apiURL)
	}
	if opts.Namespace != "" {
		if err := api.ValidNamespace(opts.Namespace); err != nil {
			return nil, errorf(CodeInvalidArgument, "kibotos: %v", err)
		}
	}
	ca, err := caPEM(opts)
	if err != nil {
		return nil, err
	}
	c := &Client{base: strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/"), token: token, namespace: opts.Namespace, retries: opts.MaxRetries, hc: opts.HTTPClient}
	if c.retries == 0 {
		c.retries = 8
	}
	if ca != nil {
		c.dataRoots = x509.NewCertPool()
		c.dataRoots.AppendCertsFromPEM(ca)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: transport(ca)}
	}
	c.Workspaces = &WorkspaceService{c: c}
	c.Volumes = &VolumeService{c: c}
	if err := c.check(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// check makes one call every key may make, so that a wrong URL, CA or
// key fails at Connect rather than at the first real call.
func (c *Client) check(ctx context.Context) error {
	if c.namespace != "" {
		return c.do(ctx, http.MethodGet, "/v1/namespaces/"+url.PathEscape(c.namespace), nil, nil, nil)
	}
	return c.do(ctx, http.MethodGet, "/v1/workspaces", url.Values{"page_size": {"1"}}, nil, nil)
}

// Namespace is the namespace the client names, "" when it names none
// (an API key's own).
func (c *Client) Namespace() string { return c.namespace }

// NamespaceInfo reads the client's namespace: its quota, usage and
// lifetime defaults. It needs Options.Namespace.
func (c *Client) NamespaceInfo(ctx context.Context) (*api.Namespace, error) {
	if c.namespace == "" {
		return nil, errorf(CodeInvalidArgument, "kibotos: the client names no namespace: give Options.Namespace (the API key's) to read it")
	}
	var ns api.Namespace
	if err := c.do(ctx, http.MethodGet, "/v1/namespaces/"+url.PathEscape(c.namespace), nil, nil, &ns); err != nil {
		return nil, err
	}
	return &ns, nil
}

// caPEM is the CA of opts, checked to hold a certificate.
func caPEM(opts *Options) ([]byte, error) {
	var ca []byte
	if opts.CAFile != "" {
		b, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf("kibotos: CA file: %v; give the PEM file of the CA (tls/ca.crt of a ctrl member for the cluster CA)", err), Err: err}
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, errorf(CodeInvalidArgument, "kibotos: CA file %s holds no PEM certificate; give the PEM file of the CA (tls/ca.crt of a ctrl member)", opts.CAFile)
		}
		ca = append(ca, b...)
		ca = append(ca, '\n')
	}
	if len(opts.CAPEM) > 0 {
		if !x509.NewCertPool().AppendCertsFromPEM(opts.CAPEM) {
			return nil, errorf(CodeInvalidArgument, "kibotos: Options.CAPEM holds no PEM certificate; give the PEM text of the CA (tls/ca.crt of a ctrl member)")
		}
		ca = append(ca, opts.CAPEM...)
	}
	return ca, nil
}

// transport checks the API listener the HTTPS way: its certificate names
// the URL's host and chains to the system roots or to ca, so one CA file
// serves a listener with a cluster certificate and one with a public CA's.
func transport(ca []byte) *http.Transport {
	var pool *x509.CertPool
	if ca != nil {
		var err error
		if pool, err = x509.SystemCertPool(); err != nil {
			pool = x509.NewCertPool() // a host without a trust store
		}
		pool.AppendCertsFromPEM(ca)
	}
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
}

// writeMeta is the meta of a write: a command id of this client's, so
// that a retry of a write whose answer was lost returns the first
// result instead of doing it twice.
func writeMeta() api.WriteMeta {
	var b [12]byte
	rand.Read(b[:])
	return api.WriteMeta{CommandID: "sdk-" + hex.EncodeToString(b[:]), Generated: true}
}

// transportError is the error of a request that got no answer.
func (c *Client) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("kibotos API at %s: %w", c.base, context.Cause(ctx))
	}
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host) || errors.As(err, &verify) {
		// Not worth a retry: the next answer has the same certificate.
		return &Error{Code: CodeUnauthenticated, Err: err, Message: fmt.Sprintf("kibotos API at %s presented a certificate this client does not trust (%v): give the CA that issued it in Options.CAFile (the cluster CA, tls/ca.crt of a ctrl member)", c.base, err)}
	}
	return &Error{Code: CodeUnavailable, Err: err, Message: fmt.Sprintf("cannot reach the kibotos API at %s: %v; check the URL and that a ctrl member serves [api] listen there", c.base, err)}
}
