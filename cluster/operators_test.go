package cluster_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/fsm"
	"github.com/kibotos/kibotos/trust"
)

// issueOperator issues a personal operator credential through member via
// (with a ctrl host's operator certificate), the key made here as the CLI
// does, and returns it as a client certificate.
func issueOperator(t testing.TB, c *clustertest.Cluster, via *clustertest.Member, name, ttl string) (tls.Certificate, api.OperatorIssueResponse) {
	t.Helper()
	key, err := trust.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	var out api.OperatorIssueResponse
	req := api.OperatorIssueRequest{Name: name, PublicKey: trust.PublicKeyPEM(&key.PublicKey), TTL: ttl}
	if _, err := c.Client(via).Do(context.Background(), "POST", "/v1/operators", req, &out); err != nil {
		t.Fatalf("operator issue %s: %v", name, err)
	}
	keyPEM, _ := trust.EncodeKey(key)
	cert, err := tls.X509KeyPair([]byte(out.Cert), keyPEM)
	if err != nil {
		t.Fatalf("operator %s's certificate: %v", name, err)
	}
	return cert, out
}

// leftoverAdmin is the operator certificate a build before issue 44 gave
// a node-only member at its join: signed with the cluster CA, for the
// node's admission.
func leftoverAdmin(t *testing.T, ctrl, worker *clustertest.Member) tls.Certificate {
	t.Helper()
	ca, err := trust.LoadCA(ctrl.Dir.CACert(), ctrl.Dir.CAKey())
	if err != nil {
		t.Fatal(err)
	}
	mc := memberCert(t, worker)
	leaf, _ := x509.ParseCertificate(mc.Certificate[0])
	id, err := trust.FromCert(leaf)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueKeyPair(trust.Identity{ClusterID: id.ClusterID, Kind: trust.KindAdmin, NodeID: id.NodeID, Admitted: id.Admitted}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Issue 44: whoever controls a node-only host controls nothing else. With
// the host's own certificates (its member certificate, and the operator
// certificate an older build left it) the attack of the finding (a grant
// with role ctrl, which would hand out the CA key) is refused, as are
// reading an Egress, draining a node and the internal reads, on ctrl and
// on the node-only member itself, and ctrl's state is unchanged.
func TestNodeOnlyHostHasNoOperatorPower(t *testing.T) {
	t.Parallel()
	// No periodic full reports: ctrl would record them while the state is
	// compared (TestEveryRouteRefusesCallersItsRuleDoesNotName).
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, SyncInterval: time.Hour})
	ctrl, worker := c.Members[0], c.Members[1]
	c.WaitAllReady()
	if worker.Dir.HasAdminCertificate() {
		t.Fatalf("node-only %s joined with an operator certificate (%s)", worker.ID, worker.Dir.AdminCert())
	}
	if _, err := c.Client(ctrl).Do(context.Background(), "POST", "/v1/egress", api.EgressCreateRequest{Name: "corp", SOCKS5: "proxy.example:1080", Username: "kibo", Password: egressPassword}, nil); err != nil {
		t.Fatal(err)
	}
	certs := map[string]tls.Certificate{"member": memberCert(t, worker), "leftover operator": leftoverAdmin(t, ctrl, worker)}
	calls := []struct{ method, path string }{
		{"POST", "/v1/enrollment/grants"},
		{"GET", "/v1/egress/corp"},
		{"POST", "/v1/nodes/" + ctrl.ID + "/drain"},
		{"POST", "/v1/operators"},
		{"GET", "/v1/internal/member-level"},
		{"GET", "/v1/internal/egress/corp/revisions/1"},
		{"GET", "/v1/internal/progress/x"},
		{"GET", "/v1/internal/machine-logs/x"},
	}
	grant := api.GrantRequest{NodeID: "evil", Roles: []string{api.RoleCtrl}}
	before := stateDigest(t, ctrl)
	for name, cert := range certs {
		for _, cl := range calls {
			for _, m := range []*clustertest.Member{ctrl, worker} {
				var body any = struct{}{}
				if cl.path == "/v1/enrollment/grants" {
					body = grant
				}
				status, e := rawCall(t, ctrl, cert, m.Addr, cl.method, cl.path, body, nil)
				if name == "member" && m == worker && status == http.StatusMisdirectedRequest {
					continue // the node-only member sends it to ctrl, which refuses it (above)
				}
				if status != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied {
					t.Errorf("%s %s on %s with %s's %s certificate: %d %v, want 403", cl.method, cl.path, m.ID, worker.ID, name, status, e)
				}
			}
		}
	}
	if _, e := rawCall(t, ctrl, certs["leftover operator"], ctrl.Addr, "GET", "/v1/nodes", nil, nil); e == nil ||
		e.Message != "operator certificate of admin@node-2 is refused: node node-2 was admitted as node, without the ctrl or operator role, so its host holds no operator credential; use a personal one (kibo operator issue NAME)" {
		t.Errorf("the refusal of a leftover operator certificate: %v", e)
	}
	if after := stateDigest(t, ctrl); after.all != before.all {
		t.Errorf("refused calls of node-only %s changed ctrl's state: %v", worker.ID, after.changed(before))
	}
	var grants []api.Grant
	if _, err := c.Client(ctrl).Do(context.Background(), "GET", "/v1/enrollment/grants", nil, &grants); err != nil {
		t.Fatal(err)
	}
	for _, g := range grants {
		if g.NodeID == "evil" {
			t.Fatalf("a grant for evil exists: %+v", g)
		}
	}
}

// A member admitted with roles node,operator gets its host's operator
// certificate at the join, renews it, and can drain a node with it.
func TestOperatorNodeHoldsOperatorCertificate(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Logs: logs})
	opNode := c.AddMember("node-op", []string{api.RoleNode, api.RoleOperator}, clustertest.Options{})
	c.WaitAllReady()
	if len(logs.lines("enrollment grant with the operator role", "grant_node_id=node-op")) == 0 {
		t.Errorf("the grant with the operator role left no line of its own")
	}
	if !opNode.Dir.HasAdminCertificate() {
		t.Fatalf("%s joined without an operator certificate", opNode.ID)
	}
	if err := opNode.Server.RenewCertificates(context.Background()); err != nil {
		t.Fatalf("renew %s: %v", opNode.ID, err)
	}
	if status, e := rawCall(t, opNode, adminCert(t, opNode), opNode.Addr, "POST", "/v1/nodes/"+c.Members[0].ID+"/drain", api.NodeWriteRequest{}, nil); status != http.StatusMisdirectedRequest {
		t.Fatalf("drain through %s: %d %v, want 421 to ctrl", opNode.ID, status, e)
	}
	if _, _, err := drain(t, c, opNode, c.Members[0].ID, "", nil); err != nil {
		t.Fatalf("drain with %s's operator certificate: %v", opNode.ID, err)
	}
}

// A person's operator credential works on every member while its record
// is active; revoked it is refused on every member (leader, follower,
// node-only); issued again, the earlier certificate is refused; the
// lifetime is bounded.
func TestOperatorCredentialLifecycle(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 2, NodeOnly: 1})
	leader := c.WaitLeader()
	c.WaitAllReady()
	var follower *clustertest.Member
	for _, m := range c.Members[:2] {
		if m != leader {
			follower = m
		}
	}
	worker := c.Members[2]
	cert, issued := issueOperator(t, c, follower, "alice", "")
	if issued.Operator.State != api.OperatorActive || issued.Operator.IssuedBy != "admin@"+follower.ID {
		t.Fatalf("issued %+v", issued.Operator)
	}
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > fsm.OperatorMaxTTL+trust.Backdate+time.Minute || life < fsm.OperatorMaxTTL-time.Minute {
		t.Fatalf("alice's certificate lives %v; want the maximum %v", life, fsm.OperatorMaxTTL)
	}
	pool, _ := leader.Dir.CAPool()
	client := func(m *clustertest.Member, cert tls.Certificate) *api.Client {
		return api.NewClient(m.Addr, trust.Client{Pool: pool, Cert: trust.Static(cert)})
	}
	for _, m := range c.Members {
		var n api.Node
		if _, err := client(m, cert).Do(context.Background(), "POST", "/v1/nodes/"+worker.ID+"/drain", api.NodeWriteRequest{}, &n); err != nil || !n.DrainRequested {
			t.Fatalf("drain through %s with alice's credential: %+v %v", m.ID, n, err)
		}
	}
	var list []api.Operator
	if _, err := c.Client(leader).Do(context.Background(), "GET", "/v1/operators", nil, &list); err != nil || len(list) != 1 || list[0].Name != "alice" || list[0].State != api.OperatorActive {
		t.Fatalf("operator list: %+v %v", list, err)
	}

	// Issued again: the first certificate stops working.
	second, _ := issueOperator(t, c, leader, "alice", "2h")
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
		_, e := rawCall(t, leader, cert, follower.Addr, "GET", "/v1/nodes", nil, nil)
		return e != nil && strings.Contains(e.Message, "certificate of operator:alice is from an earlier issue"), "first certificate still accepted"
	})
	if status, e := rawCall(t, leader, second, follower.Addr, "GET", "/v1/nodes", nil, nil); status != http.StatusOK {
		t.Fatalf("second certificate: %d %v", status, e)
	}

	// Revoked (by alice herself): refused everywhere.
	if _, err := client(leader, second).Do(context.Background(), "POST", "/v1/operators/alice/revoke", api.WriteMeta{}, nil); err != nil {
		t.Fatal(err)
	}
	for _, ck := range []struct {
		m    *clustertest.Member
		path string
	}{{leader, "/v1/nodes"}, {follower, "/v1/nodes"}, {worker, "/v1/status"}} {
		clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
			status, e := rawCall(t, leader, second, ck.m.Addr, "GET", ck.path, nil, nil)
			return status == http.StatusUnauthorized && e != nil && strings.Contains(e.Message, "operator:alice was revoked at"), "still accepted by " + ck.m.ID
		})
	}
	if _, err := c.Client(leader).Do(context.Background(), "GET", "/v1/operators", nil, &list); err != nil || len(list) != 1 || list[0].State != api.OperatorRevoked || list[0].RevokedAt == nil {
		t.Fatalf("operator list after the revocation: %+v %v", list, err)
	}

	// Lifetimes out of bounds are refused with the bound.
	key, _ := trust.NewKey()
	for ttl, want := range map[string]string{
		"90d":  "operator bob: ttl 90d is out of range: the maximum is 30d",
		"30m":  "operator bob: ttl 30m is out of range",
		"soon": "operator bob: ttl soon is not a duration",
	} {
		_, err := c.Client(leader).Do(context.Background(), "POST", "/v1/operators", api.OperatorIssueRequest{Name: "bob", PublicKey: trust.PublicKeyPEM(&key.PublicKey), TTL: ttl}, nil)
		if api.CodeOf(err) != api.CodeInvalidArgument || !strings.Contains(err.Error(), want) {
			t.Errorf("ttl %s: %v, want invalid_argument %q", ttl, err, want)
		}
	}
}

// While a voter is below level 12, a grant with the operator role and a
// personal operator credential are refused before the log, and nothing
// changes.
func TestOperatorsNeedEveryVoterAtTheirLevel(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 2, FeatureLevels: map[string]int{"node-2": fsm.LevelOperators - 1}})
	leader := c.WaitLeader()
	c.WaitAllReady()
	before := stateDigest(t, leader)
	_, err := c.Client(leader).Do(context.Background(), "POST", "/v1/enrollment/grants", api.GrantRequest{NodeID: "node-op", Roles: []string{api.RoleNode, api.RoleOperator}}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "needs every ctrl voter at feature level 12, and voter node-2") {
		t.Fatalf("grant with the operator role below level 12: %v", err)
	}
	key, _ := trust.NewKey()
	_, err = c.Client(leader).Do(context.Background(), "POST", "/v1/operators", api.OperatorIssueRequest{Name: "alice", PublicKey: trust.PublicKeyPEM(&key.PublicKey)}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "feature level 12") {
		t.Fatalf("operator issue below level 12: %v", err)
	}
	if after := stateDigest(t, leader); after.all != before.all {
		t.Errorf("the refused writes changed the state: %v", after.changed(before))
	}
}
