package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// An application's client: it calls the API listener of a ctrl member
// ([api] listen) with an API key instead of a certificate, and takes the
// server for the one it meant by the usual HTTPS check (the URL's host in
// the certificate, chained to the given CAs), since a certificate from a
// public CA names no member.

// NewTokenClient makes a client for the API listener at rawURL
// (https://HOST:PORT, or with a path prefix behind a proxy) that calls
// with the API key token. The server's certificate is checked against
// pool, the cluster CA's (tls/ca.crt of a ctrl member) for a listener
// serving one, or against the host's trust store when pool is nil (a
// listener with a certificate from a public CA).
func NewTokenClient(rawURL, token string, pool *x509.CertPool) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, Errorf(CodeInvalidArgument, "API URL %q: want https://HOST:PORT (the [api] listen address of a ctrl member)", rawURL)
	}
	if token == "" {
		return nil, Errorf(CodeUnauthenticated, "no API key for %s: give the key kibo api-key create printed", rawURL)
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	c := &Client{Addr: u.Host, token: token, base: strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/")}
	c.once.Do(func() { c.first = &http.Client{Timeout: 2 * time.Minute, Transport: tr} })
	return c, nil
}

// tokenCallError is what a failed request of a token client says.
func (c *Client) tokenCallError(err error) error {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host) {
		// Not worth a retry: the next answer comes with the same certificate.
		return Errorf(CodeUnauthenticated, "the kibotos API at %s presented a certificate this client does not trust (%v): give the CA file of its certificate with --ca-file (KIBOTOS_CA_FILE), the cluster CA tls/ca.crt of a ctrl member for a certificate of the cluster", c.base, err)
	}
	return Errorf(CodeUnavailable, "cannot reach the kibotos API at %s: %v; check --api-url / KIBOTOS_API_URL and that a ctrl member serves [api] listen there", c.base, err)
}
