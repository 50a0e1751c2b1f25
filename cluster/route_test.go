package cluster_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// Every route of the API declares who may call it, and a caller the
// rule does not name is refused (403 permission_denied; without a
// certificate 401 unauthenticated) before the route does anything: the
// state stays as it was. The callers are the certificates a cluster
// hands out: a ctrl host's operator certificate, a person's (kibo
// operator issue), a node-only member's and a ctrl member's (which has
// the node role too).
func TestEveryRouteRefusesCallersItsRuleDoesNotName(t *testing.T) {
	t.Parallel()
	// Key uses are not reported during the test, nor nodes asked for
	// their full report (ctrl records it, with the node's clock): the
	// refusals must leave the state as it was, and under load the test
	// outlasts the 5 s between two.
	tm := cluster.TestTimings()
	tm.KeyUseFlush, tm.SyncInterval = time.Hour, time.Hour
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, Timings: &tm, API: &cluster.APIConfig{Rate: 1000, Burst: 1000}})
	ctrl, worker := c.Members[0], c.Members[1]
	c.WaitAllReady()
	// API keys call through the API listener.
	pool, err := ctrl.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	keyHTTP := apiClient(t, pool, nil)
	keys := []struct {
		name, secret string
		roles        []string
	}{
		{"sandbox key", namespaceKey(t, c, "acme", "app", api.KeyRoleSandbox), []string{"sandbox"}},
		{"namespace-admin key", namespaceKey(t, c, "acme", "admin", api.KeyRoleNamespaceAdmin), []string{"sandbox", "namespace-admin"}},
	}

	operatorCert, nodeCert, ctrlCert := adminCert(t, ctrl), memberCert(t, worker), memberCert(t, ctrl)
	personal, _ := issueOperator(t, c, ctrl, "alice", "")
	callers := []struct {
		name  string
		cert  *tls.Certificate
		roles []string // what the rules call a caller of this certificate
	}{
		{"operator", &operatorCert, []string{"operator"}},
		{"personal operator", &personal, []string{"operator"}},
		{"node-only member", &nodeCert, []string{"member", "node"}},
		{"ctrl member", &ctrlCert, []string{"member", "node", "ctrl"}},
	}

	rules := ctrl.Server.RouteRules()
	if len(rules) < 70 {
		t.Fatalf("the route table has %d routes; the API has more than 70", len(rules))
	}
	before := stateDigest(t, ctrl)
	for _, rule := range rules {
		want, listed := notOperatorOnly[rule.Method+" "+rule.Path]
		if !listed {
			want = []string{"operator"}
		}
		if !slices.Equal(rule.Roles, want) {
			t.Errorf("%s %s may be called as %v, want %v", rule.Method, rule.Path, rule.Roles, want)
		}
		switch {
		case rule.Public:
			if rule.Path != "/v1/join" {
				t.Errorf("%s %s is served without a certificate: only the join is", rule.Method, rule.Path)
			}
			continue
		case len(rule.Roles) == 0 || !rule.Refuses:
			t.Errorf("%s %s declares no roles or no refusal", rule.Method, rule.Path)
			continue
		}
		path := routePath(rule.Path, ctrl.ID)
		if status, e := call(t, ctrl, nil, rule.Method, path); status != http.StatusUnauthorized || e == nil || e.Code != api.CodeUnauthenticated {
			t.Errorf("%s %s without a certificate: %d %v, want 401 unauthenticated", rule.Method, path, status, e)
		}
		for _, cl := range callers {
			if slices.ContainsFunc(rule.Roles, func(r string) bool { return slices.Contains(cl.roles, r) }) {
				continue
			}
			status, e := call(t, ctrl, cl.cert, rule.Method, path)
			if status != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied {
				t.Errorf("%s %s by the %s (rule: %v): %d %v, want 403 permission_denied", rule.Method, path, cl.name, rule.Roles, status, e)
			}
		}
		for _, k := range keys {
			if slices.ContainsFunc(rule.Roles, func(r string) bool { return slices.Contains(k.roles, r) }) {
				continue
			}
			r := callAPI(t, keyHTTP, ctrl.Server.APIAddr(), rule.Method, path, bearer(k.secret))
			if r.status != http.StatusForbidden || r.err == nil || r.err.Code != api.CodePermissionDenied {
				t.Errorf("%s %s by the %s (rule: %v): %d %v, want 403 permission_denied", rule.Method, path, k.name, rule.Roles, r.status, r.err)
			}
		}
	}
	if after := stateDigest(t, ctrl); after.all != before.all {
		t.Errorf("the refused calls changed the state of ctrl: %v", after.changed(before))
	}
}

// notOperatorOnly are the routes that are not for operators alone, and
// who may call them; every other route is.
var notOperatorOnly = map[string][]string{
	"GET /v1/status":                                 {"operator", "member"},
	"POST /v1/join":                                  nil, // the grant in the body
	"GET /v1/internal/member-level":                  {"ctrl"},
	"POST /v1/internal/raft/voter":                   {"member"},
	"POST /v1/internal/certs/renew":                  {"member"},
	"POST /v1/internal/certs/dataplane":              {"node"},
	"POST /v1/internal/admission":                    {"member"},
	"GET /v1/internal/egress/{name}/revisions/{rev}": {"member"},
	"GET /v1/internal/machine-logs/{instance}":       {"ctrl"},
	"POST /v1/internal/templates/{name}/upload":      {"ctrl"},
	"POST /v1/internal/platforms/{name}/upload":      {"ctrl"},
	"POST /v1/internal/transfers/export":             {"ctrl"},
	"GET /v1/internal/transfers/{name}/progress":     {"ctrl"},
	"GET /v1/internal/progress/{key}":                {"ctrl"},
	"POST /v1/internal/trust":                        {"member"},
	"GET /v1/internal/trust/status":                  {"ctrl"},
	"POST /v1/internal/api-keys/used":                {"ctrl"},
	// API keys (issue 45), within their namespace
	"POST /v1/workspaces":                    {"operator", "sandbox"},
	"GET /v1/workspaces":                     {"operator", "sandbox"},
	"GET /v1/workspaces/{id}":                {"operator", "sandbox"},
	"GET /v1/workspaces/{id}/cleanup-status": {"operator", "sandbox"},
	"GET /v1/workspaces/{id}/logs":           {"operator", "sandbox"},
	"GET /v1/workspaces/{id}/progress":       {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/start":         {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/stop":          {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/pause":         {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/delete":        {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/timeout":       {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/network":       {"operator", "sandbox"},
	"POST /v1/workspaces/{id}/credentials":   {"operator", "sandbox"},
	"POST /v1/volumes":                       {"operator", "sandbox"},
	"GET /v1/volumes":                        {"operator", "sandbox"},
	"GET /v1/volumes/{ref}":                  {"operator", "sandbox"},
	"POST /v1/volumes/{ref}/resize":          {"operator", "sandbox"},
	"POST /v1/volumes/{ref}/delete":          {"operator", "sandbox"},
	"GET /v1/namespaces/{name}":              {"operator", "sandbox"},
	"POST /v1/api-keys":                      {"operator", "namespace-admin"},
	"GET /v1/api-keys":                       {"operator", "namespace-admin"},
	"POST /v1/egress":                        {"operator", "namespace-admin"},
	"GET /v1/egress":                         {"operator", "namespace-admin"},
	"GET /v1/egress/{name}":                  {"operator", "namespace-admin"},
	"POST /v1/egress/{name}/update":          {"operator", "namespace-admin"},
	"POST /v1/egress/{name}/delete":          {"operator", "namespace-admin"},
	"POST /v1/resolvers":                     {"operator", "namespace-admin"},
	"GET /v1/resolvers":                      {"operator", "namespace-admin"},
	"GET /v1/resolvers/{name}":               {"operator", "namespace-admin"},
	"POST /v1/resolvers/{name}/delete":       {"operator", "namespace-admin"},
	"POST /v1/api-keys/{name}/revoke":        {"operator", "namespace-admin"},
}

// routePath fills a route's wildcards: the node's own id, so a drain or
// retire that got through would show in the state.
func routePath(pattern, nodeID string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(pattern, '{')
		if i < 0 {
			b.WriteString(pattern)
			return b.String()
		}
		j := strings.IndexByte(pattern[i:], '}')
		b.WriteString(pattern[:i])
		switch pattern[i+1 : i+j] {
		case "id":
			b.WriteString(nodeID)
		case "rev":
			b.WriteString("1")
		default:
			b.WriteString("x")
		}
		pattern = pattern[i+j+1:]
	}
}

// call makes one call with an empty JSON body, presenting cert (nil:
// none), and returns the status and the error of the answer.
func call(t *testing.T, m *clustertest.Member, cert *tls.Certificate, method, path string) (int, *api.Error) {
	t.Helper()
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	tc := trust.Client{Pool: pool}
	if cert != nil {
		tc.Cert = trust.Static(*cert)
	}
	hc := &http.Client{Transport: tc.HTTPTransport(trust.Want{Kind: trust.KindMember}, 5*time.Second), Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "https://"+m.Addr+path, bytes.NewReader([]byte("{}")))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb.Error
}

// stateDigest is a hash of every record of the member's replica; where it
// differs from another, String names the records that changed.
type replicaDigest struct {
	all     string
	records map[string]string // bucket path and key → hash of the value
}

// changed lists the records added, removed or changed since before.
func (d replicaDigest) changed(before replicaDigest) []string {
	var out []string
	for k, v := range d.records {
		if before.records[k] != v {
			out = append(out, k)
		}
	}
	for k := range before.records {
		if _, ok := d.records[k]; !ok {
			out = append(out, k+" (removed)")
		}
	}
	slices.Sort(out)
	return out
}

func stateDigest(t *testing.T, m *clustertest.Member) replicaDigest {
	t.Helper()
	h := sha256.New()
	d := replicaDigest{records: map[string]string{}}
	err := m.Server.FSM().View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			h.Write(name)
			return digestBucket(h, b, string(name), d.records)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	d.all = hex.EncodeToString(h.Sum(nil))
	return d
}

func digestBucket(h interface{ Write([]byte) (int, error) }, b *bolt.Bucket, path string, records map[string]string) error {
	return b.ForEach(func(k, v []byte) error {
		h.Write(k)
		if v == nil {
			return digestBucket(h, b.Bucket(k), path+"/"+string(k), records)
		}
		h.Write(v)
		sum := sha256.Sum256(v)
		records[fmt.Sprintf("%s/%q", path, k)] = hex.EncodeToString(sum[:8])
		return nil
	})
}
