package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/trust"
)

// An application's client sends its key as Authorization: Bearer to the
// API listener at its URL (a path prefix kept), and only after the
// server proved itself with a certificate of the CA it was given: to a
// server of another CA it sends nothing, and says to pass --ca-file.
func TestTokenClientSendsKeyOnlyToTheTrustedServer(t *testing.T) {
	ca, err := trust.NewCA("c1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueTLS(trust.Identity{ClusterID: "c1", Kind: trust.KindAPIServer, NodeID: "n1"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string // path and Authorization of every request
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/busy") {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":{"code":"resource_exhausted","message":"key:app is over its rate limit"}}`))
			return
		}
		w.Write([]byte(`{"result":{"node_id":"n1"}}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	requests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	ctx := context.Background()

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	c, err := NewTokenClient(srv.URL+"/kibotos/", "k1-secret", pool)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		NodeID string `json:"node_id"`
	}
	if _, err := c.Do(ctx, "GET", "/v1/status", nil, &st); err != nil || st.NodeID != "n1" {
		t.Fatalf("call with the cluster CA: %+v, %v", st, err)
	}
	if got := requests(); len(got) != 1 || got[0] != "/kibotos/v1/status Bearer k1-secret" {
		t.Fatalf("the server saw %q, want one /kibotos/v1/status with Bearer k1-secret", got)
	}
	if _, err := c.Do(ctx, "GET", "/v1/busy", nil, nil); CodeOf(err) != CodeResourceExhausted || CodeOf(err).ExitCode() != ExitResourceExhausted {
		t.Fatalf("429: %v, want resource_exhausted (exit %d)", err, ExitResourceExhausted)
	}

	other, err := trust.NewCA("c2")
	if err != nil {
		t.Fatal(err)
	}
	otherPool := x509.NewCertPool()
	otherPool.AddCert(other.Cert)
	before := len(requests())
	for name, p := range map[string]*x509.CertPool{"another CA": otherPool, "the system roots": nil} {
		c, err := NewTokenClient(srv.URL, "k1-secret", p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Do(ctx, "GET", "/v1/status", nil, nil)
		if CodeOf(err) != CodeUnauthenticated || !strings.Contains(err.Error(), "does not trust") || !strings.Contains(err.Error(), "--ca-file") {
			t.Errorf("server checked against %s: %v, want unauthenticated naming --ca-file", name, err)
		}
	}
	if got := requests(); len(got) != before {
		t.Fatalf("an untrusted server received %q", got[before:])
	}
}

// A URL that is not https://HOST:PORT, or no key, is refused before any
// call, in one line.
func TestTokenClientRefusesBadURLAndNoKey(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:7443", "127.0.0.1:7443", "https://", "https://user@h:1", "https://h:1/?x=1"} {
		if _, err := NewTokenClient(u, "k", nil); CodeOf(err) != CodeInvalidArgument || !strings.Contains(err.Error(), "want https://HOST:PORT") {
			t.Errorf("URL %q: %v, want invalid_argument", u, err)
		}
	}
	if _, err := NewTokenClient("https://127.0.0.1:7443", "", nil); CodeOf(err) != CodeUnauthenticated {
		t.Errorf("no key: %v, want unauthenticated", err)
	}
}
