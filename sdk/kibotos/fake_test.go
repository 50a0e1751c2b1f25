package kibotos_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/sdk/kibotos"
)

// fakeAPI is an API listener that answers from a script: each request is
// recorded and answered by the handler the test gave for its route.
type fakeAPI struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []seen
	routes   map[string]func(r *http.Request, body []byte) (int, http.Header, any)
}

// seen is one request as the fake received it.
type seen struct {
	method, path string
	query        url.Values
	auth         string
	body         []byte
	at           time.Time
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{routes: map[string]func(*http.Request, []byte) (int, http.Header, any){}}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	// Connect's check of a key that names no namespace.
	f.handle("GET /v1/workspaces", func(*http.Request, []byte) (int, http.Header, any) {
		return 200, nil, api.WorkspaceList{}
	})
	return f
}

// handle answers route ("METHOD /path") with h: a status, headers and a
// result (200) or *api.Error (other statuses), or a string sent as is.
func (f *fakeAPI) handle(route string, h func(r *http.Request, body []byte) (int, http.Header, any)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[route] = h
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.requests = append(f.requests, seen{method: r.Method, path: r.URL.Path, query: r.URL.Query(), auth: r.Header.Get("Authorization"), body: body, at: time.Now()})
	h := f.routes[r.Method+" "+r.URL.Path]
	f.mu.Unlock()
	if h == nil {
		writeAnswer(w, 404, nil, api.Errorf(api.CodeNotFound, "no route %s %s in this fake", r.Method, r.URL.Path))
		return
	}
	status, hdr, v := h(r, body)
	writeAnswer(w, status, hdr, v)
}

func writeAnswer(w http.ResponseWriter, status int, hdr http.Header, v any) {
	for k, vs := range hdr {
		w.Header()[k] = vs
	}
	if s, ok := v.(string); ok {
		w.WriteHeader(status)
		w.Write([]byte(s))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if e, ok := v.(*api.Error); ok {
		json.NewEncoder(w).Encode(api.ErrorBody{Error: e})
		return
	}
	json.NewEncoder(w).Encode(api.ResultBody{Result: v})
}

// seenOf are the requests of route so far.
func (f *fakeAPI) seenOf(method, path string) []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seen
	for _, s := range f.requests {
		if s.method == method && s.path == path {
			out = append(out, s)
		}
	}
	return out
}

// caPEM is the PEM of the fake's certificate (self-signed: its own CA).
func (f *fakeAPI) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
}

const testKey = "kbt_aaaaaaaaaaaaaaaa_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

// connect is a client of the fake with its CA.
func (f *fakeAPI) connect(t *testing.T, opts *kibotos.Options) *kibotos.Client {
	t.Helper()
	if opts == nil {
		opts = &kibotos.Options{}
	}
	opts.CAPEM = f.caPEM()
	c, err := kibotos.Connect(context.Background(), f.srv.URL, testKey, opts)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	return c
}

// otherCA is the PEM of a CA that issued nothing the fake serves.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
