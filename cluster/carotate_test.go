package cluster_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/credential"
	"github.com/kibotos/kibotos/trust"
)

// caStatus is kibo ca status through the leader.
func caStatus(t *testing.T, c *clustertest.Cluster) api.CAStatus {
	t.Helper()
	var st api.CAStatus
	if _, err := c.Client(c.WaitLeader()).Do(context.Background(), "GET", "/v1/ca/status?consistent=true", nil, &st); err != nil {
		t.Fatalf("ca status: %v", err)
	}
	return st
}

// forgeLike signs, with ca's key as someone holding a copy of it would,
// a client certificate asserting what like asserts, valid from notBefore
// to notAfter.
func forgeLike(t *testing.T, ca *trust.CA, like *x509.Certificate, notBefore, notAfter time.Time) tls.Certificate {
	t.Helper()
	key, err := trust.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: like.Subject.CommonName},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: like.URIs}
	der, err := x509.CreateCertificate(nil, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}

// forgeAdmin is m's operator certificate forged with ca's key, valid for
// an hour.
func forgeAdmin(t *testing.T, m *clustertest.Member, ca *trust.CA) tls.Certificate {
	t.Helper()
	now := time.Now()
	return forgeLike(t, ca, adminCert(t, m).Leaf, now.Add(-trust.Backdate), now.Add(time.Hour))
}

// trustedOnDisk are the fingerprints of m's tls/ca.crt.
func trustedOnDisk(t *testing.T, m *clustertest.Member) []string {
	t.Helper()
	roots, err := m.Dir.CARoots()
	if err != nil {
		t.Fatal(err)
	}
	return roots.Fingerprints()
}

func statusTable(st api.CAStatus) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %q", st.Phase)
	for _, ca := range st.CAs {
		fmt.Fprintf(&b, " | %.12s %s", ca.Fingerprint, ca.State)
	}
	for _, m := range st.Members {
		fmt.Fprintf(&b, " | %s trusts=%s member=%s dp=%s %s", m.NodeID, m.TrustsNew, m.MemberCert, m.DataPlane, m.Error)
	}
	return b.String()
}

// A CA rotation on 3 ctrl members and a node-only one: every member
// trusts both CAs, ctrl then signs with the new one and every member's
// certificates are reissued under it without a restart; the finish
// waits for every member (or --force), and after it a certificate the
// old key signs is refused by every member while one of the new key is
// accepted.
func TestCARotation(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 3, NodeOnly: 1})
	ctx := context.Background()
	first := c.Members[0]
	oldCA, err := trust.LoadCA(first.Dir.CACert(), first.Dir.CAKey())
	if err != nil {
		t.Fatal(err)
	}
	oldFP := trust.Fingerprint(oldCA.Cert)
	oldCredKey := first.Server.CredentialPublicKeys()[0]
	waitCredentialKeys(t, c, "before the rotation", oldCredKey)
	servers := map[string]*cluster.Server{}
	for _, m := range c.Members {
		servers[m.ID] = m.Server
	}

	st := caStatus(t, c)
	t.Logf("before: %s", statusTable(st))
	if st.Phase != "" || len(st.CAs) != 1 || st.CAs[0].Fingerprint != oldFP || st.CAs[0].State != api.CAActive || len(st.Members) != 4 {
		t.Fatalf("status before a rotation: %s", statusTable(st))
	}
	// Finishing what was never begun is refused.
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/finish", api.CAFinishRequest{WriteMeta: api.WriteMeta{CommandID: "finish-0"}}, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("finish without a rotation: %v, want failed_precondition", err)
	}

	// A person's credential, issued under the old CA: nobody renews it.
	issueOperator(t, c, c.WaitLeader(), "alice", "")
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/rotate", api.WriteMeta{CommandID: "rotate-1"}, nil); err != nil {
		t.Fatalf("ca rotate: %v", err)
	}
	// The same command again is the same rotation; another is refused.
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/rotate", api.WriteMeta{CommandID: "rotate-1"}, nil); err != nil {
		t.Fatalf("ca rotate retried: %v", err)
	}
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/rotate", api.WriteMeta{CommandID: "rotate-2"}, nil); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("a second rotation under way: %v, want failed_precondition", err)
	}
	st = caStatus(t, c)
	t.Logf("begun: %s", statusTable(st))
	if len(st.CAs) != 2 || st.CAs[0].Fingerprint != oldFP {
		t.Fatalf("status after begin: %s", statusTable(st))
	}
	newFP := st.CAs[1].Fingerprint
	// From the begin every ctrl member derives the new CA's credential key
	// too, and every node (its session began before the rotation) hands
	// its data plane both, the old one (which signs until the finish)
	// first.
	nextKeyPEM, err := os.ReadFile(first.Dir.CANextKey())
	if err != nil {
		t.Fatal(err)
	}
	nextSigner, err := credential.KeyFromCA(nextKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	newCredKey := []byte(nextSigner.Public().(ed25519.PublicKey))
	waitCredentialKeys(t, c, "during the rotation", oldCredKey, newCredKey)

	// Every member trusts both, so the leader moves to signing, and every
	// member's certificates come from the new CA.
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		st = caStatus(t, c)
		if st.Phase != "signing" {
			return false, statusTable(st)
		}
		for _, m := range st.Members {
			if m.TrustsNew != api.TrustYes || m.MemberCert != api.CertNew {
				return false, statusTable(st)
			}
		}
		return true, ""
	})
	t.Logf("signing: %s", statusTable(st))
	if st.CAs[0].State != api.CAOld || st.CAs[1].State != api.CAActive {
		t.Fatalf("CA states in phase signing: %s", statusTable(st))
	}
	if !slices.Equal(st.Personal, []string{"operator:alice"}) {
		t.Fatalf("personal credentials to issue again: %v, want operator:alice", st.Personal)
	}
	issueOperator(t, c, c.WaitLeader(), "alice", "") // again, now under the new CA
	if st = caStatus(t, c); len(st.Personal) != 0 {
		t.Fatalf("personal credentials to issue again after alice's reissue: %v, want none", st.Personal)
	}
	for _, m := range c.Members {
		if m.Server != servers[m.ID] {
			t.Fatalf("member %s was restarted", m.ID)
		}
		if got := trustedOnDisk(t, m); len(got) != 2 || got[0] != oldFP || got[1] != newFP {
			t.Fatalf("tls/ca.crt of %s during the rotation: %v", m.ID, got)
		}
		cert := memberCert(t, m)
		if issuer := trust.IssuerOf(cert.Leaf, []*x509.Certificate{oldCA.Cert}); issuer != "" {
			t.Fatalf("member.crt of %s is still from the old CA", m.ID)
		}
	}
	// Writes keep working: a grant goes through the leader.
	c.Grant("node-9", nil)

	// With a member down, the finish waits for it, unless forced.
	worker := c.Members[3]
	worker.Stop()
	_, err = c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/finish", api.CAFinishRequest{WriteMeta: api.WriteMeta{CommandID: "finish-1"}}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), worker.ID) {
		t.Fatalf("finish with %s down: %v, want failed_precondition naming it", worker.ID, err)
	}
	t.Logf("with %s down: %s", worker.ID, statusTable(caStatus(t, c)))
	if _, err := c.Client(c.WaitLeader()).Do(ctx, "POST", "/v1/ca/finish", api.CAFinishRequest{WriteMeta: api.WriteMeta{CommandID: "finish-2"}, Force: true}, nil); err != nil {
		t.Fatalf("finish --force: %v", err)
	}
	worker.Restart(clustertest.Options{})
	// Every member trusts only the new CA, and the nodes are READY again
	// (their control sessions reconnected with new certificates).
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		for _, m := range c.Members {
			if got := trustedOnDisk(t, m); len(got) != 1 || got[0] != newFP {
				return false, fmt.Sprintf("tls/ca.crt of %s: %v", m.ID, got)
			}
		}
		return true, ""
	})
	c.WaitAllReady()
	st = caStatus(t, c)
	t.Logf("finished: %s", statusTable(st))
	if st.Phase != "" || len(st.CAs) != 1 || st.CAs[0].Fingerprint != newFP {
		t.Fatalf("status after the finish: %s", statusTable(st))
	}
	newCA, err := trust.LoadCA(first.Dir.CACert(), first.Dir.CAKey())
	if err != nil || trust.Fingerprint(newCA.Cert) != newFP {
		t.Fatalf("ca.crt and ca.key of %s after the finish: %v", first.ID, err)
	}
	// The data-plane credential key derives from the new CA key, the same
	// on every ctrl member, and every node's data plane accepts only it.
	waitCredentialKeys(t, c, "after the finish", newCredKey)

	// A ctrl member that crashed between the finish's renames (ca.key
	// already the new key, ca.crt still both) starts and repairs ca.crt
	// from the state.
	crashed := c.Members[1]
	crashed.Kill()
	if err := os.WriteFile(crashed.Dir.CACert(), append(append([]byte{}, oldCA.CertPEM...), newCA.CertPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	crashed.Restart(clustertest.Options{})
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		got := trustedOnDisk(t, crashed)
		return len(got) == 1 && got[0] == newFP, fmt.Sprintf("tls/ca.crt of %s after its restart: %v", crashed.ID, got)
	})
	c.WaitAllReady()

	// A certificate the old key signs (valid in every other way) is
	// refused by every member; one of the new key is accepted.
	leaked, fresh := forgeAdmin(t, first, oldCA), forgeAdmin(t, first, newCA)
	for _, m := range c.Members {
		// Refused at the handshake: the chain ends in no CA the member
		// trusts, so no handler sees the request.
		if status, e := rawCall(t, m, leaked, m.Addr, "GET", "/v1/nodes", nil, nil); status != 0 || !strings.Contains(e.Message, "unknown certificate authority") {
			t.Fatalf("member %s with a certificate of the old CA key: %d %v, want the handshake refused (unknown certificate authority)", m.ID, status, e)
		}
		if status, e := rawCall(t, m, fresh, m.Addr, "GET", "/v1/nodes", nil, nil); status != http.StatusOK && status != http.StatusMisdirectedRequest {
			t.Fatalf("member %s refused a certificate of the new CA: %d %v", m.ID, status, e)
		}
	}
}

// waitCredentialKeys waits until every ctrl member would welcome a node
// with want and every node holds want, as its last welcome sent them.
func waitCredentialKeys(t *testing.T, c *clustertest.Cluster, when string, want ...[]byte) {
	t.Helper()
	clustertest.WaitFor(t, 30*time.Second, func() (bool, string) {
		for _, m := range ctrlMembers(c) {
			if got := m.Server.CredentialPublicKeys(); !slices.EqualFunc(got, want, bytes.Equal) {
				return false, fmt.Sprintf("credential keys of ctrl member %s %s: %x, want %x", m.ID, when, got, want)
			}
		}
		for _, m := range c.Members {
			if got := m.Agent.CredentialKeys(); !slices.EqualFunc(got, want, bytes.Equal) {
				return false, fmt.Sprintf("credential keys node %s hands its data plane %s: %x, want %x", m.ID, when, got, want)
			}
		}
		return true, ""
	})
}

// Below level 13 a rotation is refused and nothing changes.
func TestCARotationNeedsLevel13(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, FeatureLevels: map[string]int{"node-1": 12}})
	_, err := c.Client(c.WaitLeader()).Do(context.Background(), "POST", "/v1/ca/rotate", api.WriteMeta{CommandID: "rotate-1"}, nil)
	if api.CodeOf(err) != api.CodeFailedPrecondition || !strings.Contains(err.Error(), "feature level 13") {
		t.Fatalf("rotate with a voter at level 12: %v, want failed_precondition naming level 13", err)
	}
	if st := caStatus(t, c); st.Phase != "" || len(st.CAs) != 1 {
		t.Fatalf("status after a refused rotate: %s", statusTable(st))
	}
}
