package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// apiCall is one request to a member's API listener: its status, the
// error it answered and its headers.
type apiCall struct {
	status int
	err    *api.Error
	header http.Header
}

func callAPI(t *testing.T, hc *http.Client, addr, method, path string, header http.Header) apiCall {
	t.Helper()
	return callAPIWith(t, hc, addr, method, path, header, struct{}{})
}

func callAPIWith(t *testing.T, hc *http.Client, addr, method, path string, header http.Header, body any) apiCall {
	t.Helper()
	raw, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(method, "https://"+addr+path, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s on the API listener: %v", method, path, err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	return apiCall{status: resp.StatusCode, err: eb.Error, header: resp.Header}
}

func bearer(key string) http.Header { return http.Header{"Authorization": {"Bearer " + key}} }

// createKey makes an API key of the default namespace through the
// operator API and returns its secret.
func createKey(t *testing.T, c *clustertest.Cluster, name, role string) string {
	t.Helper()
	var out api.APIKeyCreated
	if _, err := c.Client(c.WaitLeader()).Do(context.Background(), "POST", "/v1/api-keys", api.APIKeyCreateRequest{Name: name, Role: role}, &out); err != nil || out.Secret == "" {
		t.Fatalf("api-key create %s: %v", name, err)
	}
	return out.Secret
}

// apiClient is a plain HTTPS client (what an application uses) that
// trusts pool and presents cert when the server asks for one.
func apiClient(t *testing.T, pool *x509.CertPool, cert *tls.Certificate) *http.Client {
	conf := &tls.Config{RootCAs: pool}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	return hc
}

// The API listener takes API keys only: without one a request is
// refused 401 (and says how to send one), with one it goes to the key
// check and, accepted, through the member's route table as key:<name>.
// Certificates and the members' actor headers count for nothing there,
// and each key is held to its rate (429 with Retry-After), the others
// not. The member port is as it was.
func TestAPIListenerTakesAPIKeysOnly(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, API: &cluster.APIConfig{Rate: 0.01, Burst: 20}})
	ctrl := c.Members[0]
	addr := ctrl.Server.APIAddr()
	if addr == "" {
		t.Fatal("the member serves no API listener though [api] listen is set")
	}
	pool, err := ctrl.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	// An application's TLS: the cluster CA, the standard host check.
	hc := apiClient(t, pool, nil)

	r := callAPI(t, hc, addr, "GET", "/v1/nodes", nil)
	if r.status != http.StatusUnauthorized || r.err == nil || r.err.Code != api.CodeUnauthenticated || !strings.Contains(r.err.Message, "Authorization: Bearer") {
		t.Fatalf("without a key: %d %v, want 401 unauthenticated saying how to send one", r.status, r.err)
	}
	if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("401 without WWW-Authenticate: Bearer (got %q)", r.header.Get("WWW-Authenticate"))
	}
	// The key store's check is asked, and refuses what is no key.
	if r := callAPI(t, hc, addr, "GET", "/v1/nodes", bearer("some-key")); r.status != http.StatusUnauthorized || r.err == nil || r.err.Code != api.CodeUnauthenticated {
		t.Fatalf("with a token that is no key: %d %v, want 401 unauthenticated", r.status, r.err)
	}

	app, busy := createKey(t, c, "app", api.KeyRoleSandbox), createKey(t, c, "busy", api.KeyRoleSandbox)
	const appName = "key:default/app"
	// Accepted, the request goes through the route table as the key: the
	// namespace's Workspaces are its, the nodes are not.
	if r := callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(app)); r.status != http.StatusOK {
		t.Fatalf("key app lists its Workspaces: %d %v, want 200", r.status, r.err)
	}
	r = callAPI(t, hc, addr, "GET", "/v1/nodes", bearer(app))
	if r.status != http.StatusForbidden || r.err == nil || !strings.Contains(r.err.Message, appName) {
		t.Fatalf("key app on /v1/nodes: %d %v, want 403 naming %s", r.status, r.err, appName)
	}
	// A ctrl member's actor headers are those of an application here.
	forged := bearer(app)
	for k, v := range map[string]string{"X-Kibotos-Actor": "admin@" + ctrl.ID, "X-Kibotos-Actor-Kind": trust.KindAdmin, "X-Kibotos-Actor-Node": ctrl.ID,
		"X-Kibotos-Actor-Admitted": "0", "X-Kibotos-Forwarded": "1"} {
		forged.Set(k, v)
	}
	if r := callAPI(t, hc, addr, "GET", "/v1/nodes", forged); r.status != http.StatusForbidden || r.err == nil || !strings.Contains(r.err.Message, appName) {
		t.Fatalf("key app with actor headers of the operator: %d %v, want 403 naming %s", r.status, r.err, appName)
	}
	// The host's operator certificate is not asked for, nor taken.
	admin := adminCert(t, ctrl)
	withCert := apiClient(t, pool, &admin)
	if r := callAPI(t, withCert, addr, "GET", "/v1/nodes", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("the operator certificate without a key: %d %v, want 401", r.status, r.err)
	}
	if r := callAPI(t, withCert, addr, "GET", "/v1/nodes", bearer(app)); r.status != http.StatusForbidden || r.err == nil || !strings.Contains(r.err.Message, appName) {
		t.Fatalf("the operator certificate with key app: %d %v, want 403 naming %s", r.status, r.err, appName)
	}

	// A burst of 20, then 0.01 a second: the 21st request is refused.
	var last apiCall
	for i := 0; i < 25; i++ {
		if last = callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(busy)); last.status == http.StatusTooManyRequests {
			if i != 20 {
				t.Fatalf("key busy refused for its rate after %d requests, want after its burst of 20", i)
			}
			break
		}
	}
	if last.status != http.StatusTooManyRequests || last.err == nil || last.err.Code != api.CodeResourceExhausted {
		t.Fatalf("key busy past its burst: %d %v, want 429 resource_exhausted", last.status, last.err)
	}
	if s, err := strconv.Atoi(last.header.Get("Retry-After")); err != nil || s < 1 || s > 100 {
		t.Fatalf("429 with Retry-After %q, want 1 to 100 seconds (rate 0.01/s)", last.header.Get("Retry-After"))
	}
	if r := callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(app)); r.status != http.StatusOK {
		t.Fatalf("key app after key busy ran out: %d %v, want its own answer (200)", r.status, r.err)
	}
	// A revoked key is refused at once.
	if _, err := c.Client(ctrl).Do(context.Background(), "POST", "/v1/api-keys/app/revoke", api.WriteMeta{}, nil); err != nil {
		t.Fatalf("api-key revoke app: %v", err)
	}
	if r := callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(app)); r.status != http.StatusUnauthorized {
		t.Fatalf("key app revoked: %d %v, want 401", r.status, r.err)
	}
	// Requests without a valid key from one address: at most a burst of
	// 20 refused (and audited) at 5 a second, then 429 for them; a valid
	// key from the same address still passes.
	other := createKey(t, c, "other", api.KeyRoleSandbox)
	for i := 0; ; i++ {
		r := callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(fmt.Sprintf("guess-%d", i)))
		if r.status == http.StatusUnauthorized && i < 21 {
			continue
		}
		if r.status != http.StatusTooManyRequests || r.err == nil || r.err.Code != api.CodeResourceExhausted || !strings.Contains(r.err.Message, "without a valid API key from 127.0.0.1") || r.header.Get("Retry-After") == "" {
			t.Fatalf("guess %d from one address: %d %v (Retry-After %q), want 401 for at most 21, then 429 resource_exhausted naming the address", i, r.status, r.err, r.header.Get("Retry-After"))
		}
		break
	}
	if r := callAPI(t, hc, addr, "GET", "/v1/workspaces", bearer(other)); r.status != http.StatusOK {
		t.Fatalf("key other from an address out of refusals: %d %v, want 200", r.status, r.err)
	}

	// The member port answers certificates as before.
	var nodes api.NodeList
	if _, err := c.Client(ctrl).Do(context.Background(), "GET", "/v1/nodes", nil, &nodes); err != nil || len(nodes.Nodes) != 1 {
		t.Fatalf("member port with the operator certificate: %v (%d nodes)", err, len(nodes.Nodes))
	}
}

// A ctrl member that is not the leader forwards a key's writes and
// consistent reads with the key's name, and the leader looks the key up
// again before the route's rule sees it. A listener with a configured
// certificate serves that certificate; a node-only member with [api]
// listen does not start.
func TestAPIKeyForwardedAndConfiguredCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	public, err := trust.NewCA("public-ca")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := public.IssueKeyPair(trust.Identity{ClusterID: "public-ca", Kind: trust.KindDataPlane, NodeID: "api"}, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)

	c := clustertest.New(t, clustertest.Options{Ctrl: 2, NodeOnly: 1, API: &cluster.APIConfig{CertFile: certFile, KeyFile: keyFile}})
	leader := c.WaitLeader()
	var follower *clustertest.Member
	for _, m := range c.Members[:2] {
		if m != leader {
			follower = m
		}
	}

	// An application trusting only the public CA reaches the listener.
	publicPool := x509.NewCertPool()
	publicPool.AddCert(public.Cert)
	if r := callAPI(t, apiClient(t, publicPool, nil), follower.Server.APIAddr(), "GET", "/v1/nodes", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("through the configured certificate: %d %v, want 401 (no key)", r.status, r.err)
	}

	ctx := context.Background()
	app := createKey(t, c, "app", api.KeyRoleSandbox)
	// The follower's replica has the key once it applied its entry.
	hc := apiClient(t, publicPool, nil)
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		r := callAPI(t, hc, follower.Server.APIAddr(), "GET", "/v1/workspaces", bearer(app))
		return r.status == http.StatusOK, fmt.Sprintf("follower answered key app %d %v", r.status, r.err)
	})
	if r := callAPI(t, hc, follower.Server.APIAddr(), "GET", "/v1/workspaces?consistent=true", bearer(app)); r.status != http.StatusOK {
		t.Fatalf("consistent read of key app through the follower: %d %v, want 200 from the leader", r.status, r.err)
	}
	if r := callAPIWith(t, hc, follower.Server.APIAddr(), "POST", "/v1/volumes", bearer(app), api.VolumeCreateRequest{WriteMeta: api.WriteMeta{CommandID: "vol-1"}, Name: "data", SizeBytes: 64 << 20}); r.status != http.StatusOK {
		t.Fatalf("Volume create of key app through the follower: %d %v, want 200 from the leader", r.status, r.err)
	}
	var v api.Volume
	if _, err := c.Client(leader).Do(ctx, "GET", "/v1/volumes/data", nil, &v); err != nil {
		t.Fatalf("the Volume key app created: %v", err)
	}

	worker := c.Members[2]
	worker.Stop()
	_, err = cluster.Open(ctx, cluster.Config{DataDir: worker.Dir, Timings: cluster.TestTimings(), API: cluster.APIConfig{Listen: "127.0.0.1:0"}})
	if err == nil || !strings.Contains(err.Error(), "is not a ctrl member: [api] listen is served by ctrl members only") {
		t.Fatalf("node-only member with [api] listen: %v, want refused", err)
	}
}

// apiLeaf is the certificate the API listener at addr serves now.
func apiLeaf(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // what is served is what the test looks at
	if err != nil {
		t.Fatalf("handshake with the API listener: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// Without a configured certificate the listener serves one of the
// cluster CA, for the member's host and for serving only, and one of the
// new CA from a rotation's signing phase on, as the member certificate
// follows it, without a restart.
func TestAPICertificateFollowsCARotation(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, API: &cluster.APIConfig{}})
	m := c.Members[0]
	addr := m.Server.APIAddr()
	oldCA, err := trust.LoadCA(m.Dir.CACert(), m.Dir.CAKey())
	if err != nil {
		t.Fatal(err)
	}
	leaf := apiLeaf(t, addr)
	id, err := trust.FromCert(leaf)
	if err != nil || id.Kind != trust.KindAPIServer || id.NodeID != m.ID || !trust.IssuedBy(leaf, oldCA.Cert) {
		t.Fatalf("API listener certificate: %+v %v, want kind %s of %s from the cluster CA", id, err, trust.KindAPIServer, m.ID)
	}
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || leaf.VerifyHostname("127.0.0.1") != nil {
		t.Fatalf("API listener certificate: usages %v, hosts %v %v; want server only, for 127.0.0.1", leaf.ExtKeyUsage, leaf.IPAddresses, leaf.DNSNames)
	}

	if _, err := c.Client(c.WaitLeader()).Do(context.Background(), "POST", "/v1/ca/rotate", api.WriteMeta{CommandID: "rotate-1"}, nil); err != nil {
		t.Fatalf("ca rotate: %v", err)
	}
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		st := caStatus(t, c)
		return st.Phase == "signing", statusTable(st)
	})
	clustertest.WaitFor(t, 10*time.Second, func() (bool, string) {
		leaf = apiLeaf(t, addr)
		return !trust.IssuedBy(leaf, oldCA.Cert), "the API listener still serves a certificate of the old CA"
	})
	// The CA file a client takes from a ctrl member now (both CAs) vouches for it.
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	if r := callAPI(t, apiClient(t, pool, nil), addr, "GET", "/v1/status", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("after the rotation: %d %v, want 401 (no key) over a trusted handshake", r.status, r.err)
	}
}
