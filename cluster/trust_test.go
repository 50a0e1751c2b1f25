package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

// rawCall makes one API call to addr presenting cert, with extra headers,
// and returns the HTTP status and the error code of the answer.
func rawCall(t testing.TB, m *clustertest.Member, cert tls.Certificate, addr, method, path string, body any, hdr map[string]string) (int, *api.Error) {
	t.Helper()
	pool, err := m.Dir.CAPool()
	if err != nil {
		t.Fatal(err)
	}
	tc := trust.Client{Pool: pool, Cert: trust.Static(cert)}
	hc := &http.Client{Transport: tc.HTTPTransport(trust.Want{Kind: trust.KindMember}, 5*time.Second), Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = strings.NewReader(string(raw))
	}
	req, _ := http.NewRequest(method, "https://"+addr+path, rd)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, &api.Error{Code: "transport", Message: err.Error()}
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb.Error
}

func memberCert(t testing.TB, m *clustertest.Member) tls.Certificate {
	t.Helper()
	c, err := m.Dir.MemberCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func adminCert(t testing.TB, m *clustertest.Member) tls.Certificate {
	t.Helper()
	c, err := m.Dir.AdminCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctrlMembers(c *clustertest.Cluster) []*clustertest.Member {
	var out []*clustertest.Member
	for _, m := range c.Members {
		if m.Server.Raft() != nil {
			out = append(out, m)
		}
	}
	return out
}

// Every channel takes only the certificates of its role: a node-only
// member cannot forge an operator with the actor headers, speak Raft or
// open a session for another node; an operator's headers are ignored; a
// node-only member cannot pose as ctrl to a client.
func TestEachChannelTakesOnlyItsRole(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	ctrl, worker := c.Members[0], c.Members[1]
	c.WaitAllReady()

	t.Run("forged actor headers from a node-only member", func(t *testing.T) {
		forged := map[string]string{
			"X-Kibotos-Actor": "admin@" + ctrl.ID, "X-Kibotos-Actor-Kind": "admin", "X-Kibotos-Actor-Node": ctrl.ID,
			"X-Kibotos-Actor-Admitted": "0",
		}
		status, e := rawCall(t, ctrl, memberCert(t, worker), ctrl.Addr, "POST", "/v1/nodes/"+ctrl.ID+"/drain", api.NodeWriteRequest{}, forged)
		if status != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied {
			t.Fatalf("drain with forged headers from %s's member certificate: status %d %v, want 403 permission_denied", worker.ID, status, e)
		}
		n, err := c.Node(ctrl, ctrl.ID)
		if err != nil || n.DrainRequested {
			t.Fatalf("node %s after the forged drain: drain_requested=%v err=%v", ctrl.ID, n.DrainRequested, err)
		}
	})

	t.Run("actor headers from an operator are ignored", func(t *testing.T) {
		// Claiming to be the ctrl member does not make an operator
		// certificate a member: the internal call stays refused.
		hdr := map[string]string{"X-Kibotos-Actor": ctrl.ID, "X-Kibotos-Actor-Kind": "member", "X-Kibotos-Actor-Node": ctrl.ID, "X-Kibotos-Actor-Roles": "ctrl,node"}
		status, e := rawCall(t, ctrl, adminCert(t, ctrl), ctrl.Addr, "POST", "/v1/internal/raft/voter", api.AddVoterRequest{NodeID: ctrl.ID, Address: ctrl.Addr}, hdr)
		if status != http.StatusForbidden || e == nil || !strings.Contains(e.Message, "is not a member") {
			t.Fatalf("internal call with member headers from an operator certificate: %d %v", status, e)
		}
	})

	t.Run("internal calls take only member certificates and bounded input", func(t *testing.T) {
		for _, path := range []string{"/v1/internal/certs/renew", "/v1/internal/certs/dataplane", "/v1/internal/admission"} {
			if status, e := rawCall(t, ctrl, adminCert(t, ctrl), ctrl.Addr, "POST", path, struct{}{}, nil); status != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied {
				t.Errorf("operator certificate on %s: %d %v, want 403 permission_denied", path, status, e)
			}
		}
		key, _ := trust.NewKey()
		pub := trust.PublicKeyPEM(&key.PublicKey)
		for _, host := range []string{"bad host", "\xff", strings.Repeat("a", 64) + ".example"} {
			status, e := rawCall(t, ctrl, memberCert(t, worker), ctrl.Addr, "POST", "/v1/internal/certs/dataplane", api.DataPlaneCertRequest{PublicKey: pub, Hosts: []string{host}}, nil)
			if status != http.StatusBadRequest || e == nil || !strings.Contains(e.Message, "neither an IP address nor a DNS name") {
				t.Errorf("data-plane certificate for host %q: %d %v, want 400 naming the host", host, status, e)
			}
		}
	})

	t.Run("a node-only member cannot speak Raft", func(t *testing.T) {
		for name, cert := range map[string]tls.Certificate{"member of " + worker.ID: memberCert(t, worker), "operator": adminCert(t, ctrl)} {
			if err := raftHandshake(t, ctrl, cert); err == nil {
				t.Fatalf("a Raft connection with the %s certificate stayed open", name)
			}
		}
		// The ctrl member's own certificate is what Raft takes.
		if err := raftHandshake(t, ctrl, memberCert(t, ctrl)); err != nil {
			t.Fatalf("Raft connection with the ctrl member's certificate: %v", err)
		}
	})

	// workerSession is a control-session connection to ctrl with the
	// worker's member certificate, closed when the test ends.
	workerSession := func(t *testing.T) net.Conn {
		pool, _ := worker.Dir.CAPool()
		tc := trust.Client{Pool: pool, Cert: trust.Static(memberCert(t, worker))}
		conn, err := tc.Dial(context.Background(), datadir.ProtoSession, trust.Want{Role: trust.RoleCtrl}, ctrl.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	t.Run("a session for another node", func(t *testing.T) {
		conn := workerSession(t)
		json.NewEncoder(conn).Encode(api.SessionMsg{Type: api.MsgHello, NodeID: ctrl.ID, Incarnation: 99})
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var m api.SessionMsg
		if err := json.NewDecoder(conn).Decode(&m); err != nil {
			t.Fatalf("no answer to a hello for another node: %v", err)
		}
		if m.Type != api.MsgRefused || !strings.Contains(m.Message, "certificate of node "+worker.ID+" cannot open a control session for node") {
			t.Fatalf("hello as %s with %s's certificate: %+v", ctrl.ID, worker.ID, m)
		}
	})

	t.Run("a session message over the bound", func(t *testing.T) {
		conn := workerSession(t)
		// A hello that would be welcome but for its size.
		go func() {
			conn.Write([]byte(`{"type":"hello","node_id":"` + worker.ID + `","message":"`))
			chunk := bytes.Repeat([]byte("x"), 1<<20)
			for i := 0; i <= api.MaxSessionMessage>>20; i++ {
				if _, err := conn.Write(chunk); err != nil {
					return
				}
			}
			conn.Write([]byte("\"}\n"))
		}()
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		var m api.SessionMsg
		err := json.NewDecoder(conn).Decode(&m)
		if ne, ok := err.(net.Error); err == nil || ok && ne.Timeout() {
			t.Fatalf("a hello over %d bytes: %+v, %v; want the connection closed", api.MaxSessionMessage, m, err)
		}
	})

	t.Run("a node-only member cannot pose as ctrl", func(t *testing.T) {
		pool, _ := ctrl.Dir.CAPool()
		tc := trust.Client{Pool: pool, Cert: trust.Static(memberCert(t, ctrl))}
		_, err := tc.Dial(context.Background(), datadir.ProtoSession, trust.Want{Kind: trust.KindMember, Role: trust.RoleCtrl}, worker.Addr, 5*time.Second)
		if err == nil || !strings.Contains(err.Error(), "is not a ctrl member") {
			t.Fatalf("session dial to node-only %s: %v, want a refusal that it is not ctrl", worker.ID, err)
		}
		_, err = tc.Dial(context.Background(), datadir.ProtoHTTP, trust.Want{Kind: trust.KindMember, NodeID: ctrl.ID}, worker.Addr, 5*time.Second)
		if err == nil || !strings.Contains(err.Error(), "belongs to node "+worker.ID) {
			t.Fatalf("dial expecting %s at %s's address: %v", ctrl.ID, worker.ID, err)
		}
	})

	t.Run("a data-plane certificate cannot call the API", func(t *testing.T) {
		key, _ := trust.NewKey()
		out, err := worker.Server.DataPlaneCertificate(context.Background(), &key.PublicKey, []string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, _ := trust.EncodeKey(key)
		dp, err := tls.X509KeyPair([]byte(out.Cert), keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(dp.Certificate[0])
		if id, err := trust.FromCert(leaf); err != nil || id.Kind != trust.KindDataPlane || id.NodeID != worker.ID || leaf.NotAfter.Sub(leaf.NotBefore) > 25*time.Hour {
			t.Fatalf("data-plane certificate: %+v %v, lifetime %v", id, err, leaf.NotAfter.Sub(leaf.NotBefore))
		}
		status, e := rawCall(t, ctrl, dp, ctrl.Addr, "GET", "/v1/status", nil, nil)
		if status == http.StatusOK {
			t.Fatalf("a data-plane certificate called the API: %d %v", status, e)
		}
	})

	t.Run("a join through a node-only member goes to ctrl", func(t *testing.T) {
		token := c.Grant("node-j", []string{api.RoleNode})
		id, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: datadir.Dir(t.TempDir() + "/j"), Advertise: clustertest.FreeAddr(t), Grant: token, Member: worker.Addr})
		if err != nil || id.NodeID != "node-j" {
			t.Fatalf("join through node-only %s: %+v %v", worker.ID, id, err)
		}
	})

	t.Run("operator calls through a node-only member go to ctrl", func(t *testing.T) {
		// A CLI on the worker's host with an operator credential talks to
		// the worker's member, which names ctrl; the call then reaches
		// ctrl with that credential.
		var n api.Node
		if _, err := c.Client(worker).Expect(worker.ID).Do(context.Background(), "GET", "/v1/nodes/"+ctrl.ID, nil, &n); err != nil || n.NodeID != ctrl.ID {
			t.Fatalf("node get through node-only %s: %+v %v", worker.ID, n, err)
		}
	})
}

// raftHandshake opens a Raft connection to m with cert and reports whether
// the member kept it open (a refused one is closed at once).
func raftHandshake(t *testing.T, m *clustertest.Member, cert tls.Certificate) error {
	t.Helper()
	pool, _ := m.Dir.CAPool()
	tc := trust.Client{Pool: pool, Cert: trust.Static(cert)}
	conn, err := tc.Dial(context.Background(), datadir.ProtoRaft, trust.Want{Role: trust.RoleCtrl}, m.Addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	_, err = conn.Read(make([]byte, 1))
	if ne, ok := err.(interface{ Timeout() bool }); ok && ne.Timeout() {
		return nil // still open: Raft waits for the dialler to speak
	}
	if err == nil {
		return nil
	}
	return err
}

// Retiring or revoking a node makes every ctrl member refuse its
// certificates (member and operator) within seconds, with a message that
// names the node and its state; a node admitted again under the same id
// cannot use the certificates of its earlier admission.
func TestRevocationIsEnforcedOnEveryMember(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, NodeOnly: 1})
	c.WaitLeader()
	// The worker was admitted as operator too: its host holds an
	// operator certificate, which retiring the node must refuse.
	worker := c.AddMember("node-5", []string{api.RoleNode, api.RoleOperator}, clustertest.Options{})
	other := c.Members[3]
	c.WaitAllReady()
	oldAdmin, oldMember := adminCert(t, worker), memberCert(t, worker)
	ctrls := ctrlMembers(c)
	// What each member answers itself: ctrl members everything, a
	// node-only member its status (it asks ctrl about the caller).
	type check struct {
		m      *clustertest.Member
		path   string
		before int // the answer before the retirement
	}
	var checks []check
	for _, m := range ctrls {
		checks = append(checks, check{m, "/v1/nodes", http.StatusOK})
	}
	// A node-only member: its status and metrics (clustertest's members
	// have no registry: "no metrics yet"), and the redirect to ctrl of what
	// it does not answer itself.
	checks = append(checks, check{other, "/v1/status", http.StatusOK}, check{other, "/metrics", http.StatusServiceUnavailable},
		check{other, "/v1/nodes", http.StatusMisdirectedRequest})
	for _, ck := range checks {
		if status, e := rawCall(t, ck.m, oldAdmin, ck.m.Addr, "GET", ck.path, nil, nil); status != ck.before {
			t.Fatalf("before retirement %s answered %s's operator certificate on %s with %d %v; want %d", ck.m.ID, worker.ID, ck.path, status, e, ck.before)
		}
	}

	if _, _, err := drain(t, c, ctrls[0], worker.ID, "", nil); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 20*time.Second, func() (bool, string) {
		n, err := c.Node(ctrls[0], worker.ID)
		return err == nil && n.Status == api.NodeDrained, "not drained"
	})
	start := time.Now()
	if _, err := c.Client(ctrls[0]).Do(context.Background(), "POST", "/v1/nodes/"+worker.ID+"/retire", api.NodeWriteRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	want := "node " + worker.ID + " is RETIRED: its certificates are no longer accepted; a new host joins with a new node id"
	for _, ck := range checks {
		clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
			status, e := rawCall(t, ck.m, oldAdmin, ck.m.Addr, "GET", ck.path, nil, nil)
			return status == http.StatusUnauthorized && e != nil && e.Message == want, "still accepted by " + ck.m.ID
		})
	}
	t.Logf("retire → refusal on all %d ctrl members and node-only %s: %v", len(ctrls), other.ID, time.Since(start))
	for _, m := range ctrls {
		if status, _ := rawCall(t, m, oldMember, m.Addr, "POST", "/v1/internal/certs/renew", api.RenewRequest{}, nil); status != http.StatusUnauthorized {
			t.Fatalf("%s let retired %s renew its certificates: %d", m.ID, worker.ID, status)
		}
	}
}

// A node revoked and admitted again under the same id gets certificates of
// the new admission; those of the earlier one stay refused.
func TestReadmittedNodeOldCertificatesRefused(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Logs: logs})
	// An operator node: its host holds an operator certificate.
	worker := c.AddMember("node-2", []string{api.RoleNode, api.RoleOperator}, clustertest.Options{Logs: logs})
	c.WaitAllReady()
	ctrl := c.Members[0]
	oldAdmin := adminCert(t, worker)
	start := time.Now()
	if _, err := c.Client(ctrl).Do(context.Background(), "POST", "/v1/enrollment/grants/"+worker.ID+"/revoke", api.NodeWriteRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
		_, e := rawCall(t, ctrl, oldAdmin, ctrl.Addr, "GET", "/v1/nodes", nil, nil)
		return e != nil && strings.Contains(e.Message, "node "+worker.ID+" is REVOKED: its certificates are no longer accepted"), "still accepted"
	})
	t.Logf("revoke → refusal: %v", time.Since(start))
	// The session it held before the revocation is closed too, not just
	// refused at its next reconnect.
	clustertest.WaitFor(t, 5*time.Second, func() (bool, string) {
		return len(logs.lines("connection of a node that is no longer admitted closed", "peer=node-2")) > 0, "session of node-2 still open"
	})
	// The revoked node's agent is refused too and stops; a grant for the
	// same id admits a new host, whose certificates work while the old
	// ones are refused as an earlier admission.
	worker.Stop()
	token := c.Grant(worker.ID, []string{api.RoleNode, api.RoleOperator})
	dir := datadir.Dir(t.TempDir() + "/again")
	if _, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: dir, Advertise: clustertest.FreeAddr(t), Grant: token, Member: ctrl.Addr}); err != nil {
		t.Fatal(err)
	}
	fresh, err := dir.AdminCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if status, e := rawCall(t, ctrl, fresh, ctrl.Addr, "GET", "/v1/nodes", nil, nil); status != http.StatusOK {
		t.Fatalf("certificate of the new admission refused: %d %v", status, e)
	}
	_, e := rawCall(t, ctrl, oldAdmin, ctrl.Addr, "GET", "/v1/nodes", nil, nil)
	if e == nil || !strings.Contains(e.Message, "is from an earlier admission of node "+worker.ID) {
		t.Fatalf("old certificate after re-admission: %v", e)
	}
}

// Certificates are renewed by the member: a node-only member through ctrl,
// a ctrl member by itself; the renewed ones are served at once. Only the
// ctrl member holds (and renews) an operator certificate.
func TestCertificateRenewal(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, NodeOnly: 1})
	c.WaitAllReady()
	for _, m := range c.Members {
		before := memberCert(t, m)
		oldLeaf, _ := x509.ParseCertificate(before.Certificate[0])
		if life := oldLeaf.NotAfter.Sub(oldLeaf.NotBefore); life > 31*24*time.Hour {
			t.Fatalf("%s's member certificate lives %v; want at most 30 days", m.ID, life)
		}
		if err := m.Server.RenewCertificates(context.Background()); err != nil {
			t.Fatalf("renew %s: %v", m.ID, err)
		}
		after := memberCert(t, m)
		newLeaf, _ := x509.ParseCertificate(after.Certificate[0])
		if newLeaf.SerialNumber.Cmp(oldLeaf.SerialNumber) == 0 || newLeaf.NotAfter.Before(oldLeaf.NotAfter) {
			t.Fatalf("%s: renewal did not issue a new certificate (%v → %v)", m.ID, oldLeaf.NotAfter, newLeaf.NotAfter)
		}
		if m.Server.Raft() == nil {
			if m.Dir.HasAdminCertificate() {
				t.Fatalf("node-only %s holds an operator certificate after its renewal", m.ID)
			}
			continue
		}
		if status, e := rawCall(t, m, adminCert(t, m), c.Members[0].Addr, "GET", "/v1/nodes", nil, nil); status != http.StatusOK {
			t.Fatalf("%s's renewed operator certificate refused: %d %v", m.ID, status, e)
		}
	}
	// The renewed member certificates carry on: sessions reconnect and
	// the CLI of the node-only member still reaches ctrl.
	c.WaitAllReady()
}

// Refused joins from one address are slowed down: after a burst of 20 the
// member answers resource_exhausted instead of looking the grant up.
func TestRefusedJoinsAreRateLimited(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	guess := forgeSecret(t, c.Grant("node-g", []string{api.RoleNode}))
	var codes []api.Code
	for i := 0; i < 60 && (i == 0 || codes[i-1] != api.CodeResourceExhausted); i++ {
		_, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: datadir.Dir(t.TempDir() + "/x"), Advertise: clustertest.FreeAddr(t), Grant: guess, Member: m.Addr})
		codes = append(codes, api.CodeOf(err))
	}
	// Tokens come back at 5 a second, so a slow machine may get a few
	// more tries than the burst before the limit answers.
	for i, code := range codes[:len(codes)-1] {
		if code != api.CodeUnauthenticated {
			t.Fatalf("guessed join %d: %s; want unauthenticated until the limit (%v)", i, code, codes)
		}
	}
	if n := len(codes); codes[n-1] != api.CodeResourceExhausted || n < 21 {
		t.Fatalf("codes of guessed joins: %v; want at least 20 unauthenticated, then resource_exhausted", codes)
	}
}
