package cluster_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/trust"
)

func publicKeyPEM(t *testing.T) string {
	t.Helper()
	k, err := trust.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	return trust.PublicKeyPEM(&k.PublicKey)
}

// The advertise host goes into the member certificate ctrl signs: a join
// that names a wildcard, a name with control characters or anything but
// an IP address or a DNS name is refused by ctrl itself (a client need not
// run our CLI), before the grant is used, and the grant still works.
func TestJoinRefusesAHostileAdvertiseAddress(t *testing.T) {
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	tok := c.Grant("node-x", []string{api.RoleNode})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, adv := range []string{"*.example.com:7000", "evil\x1b[2J.example:7000", "a\r\nb:7000", "0.0.0.0:7000", "host:0"} {
		before := m.Server.Raft().LastIndex()
		body, _ := json.Marshal(api.JoinRequest{Token: tok, Advertise: adv, MemberKey: publicKeyPEM(t), AdminKey: publicKeyPEM(t)})
		resp, err := hc.Post("https://"+m.Addr+"/v1/join", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(out), "advertise address") || strings.ContainsAny(string(out), "\x1b\r") {
			t.Errorf("join advertising %q: %d %s; want 400 naming the advertise address, escaped", adv, resp.StatusCode, out)
		}
		if after := m.Server.Raft().LastIndex(); after != before {
			t.Errorf("join advertising %q appended %d Raft entries", adv, after-before)
		}
	}
	// The CLI's library refuses it before asking.
	if _, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: datadir.Dir(t.TempDir() + "/w"), Advertise: "*.example.com:7000", Grant: tok, Member: m.Addr}); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Errorf("cluster.Join with a wildcard: %v; want invalid_argument", err)
	}
	if _, err := cluster.Join(context.Background(), cluster.JoinOptions{DataDir: datadir.Dir(t.TempDir() + "/x"), Advertise: clustertest.FreeAddr(t), Grant: tok, Member: m.Addr}); err != nil {
		t.Fatalf("the grant after the refusals: %v", err)
	}
}

// A host may not take another member's advertise host: its certificate
// would then answer for that member's address.
func TestJoinRefusesAnotherMembersHost(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	join := func(tok, adv string) (int, string) {
		body, _ := json.Marshal(api.JoinRequest{Token: tok, Advertise: adv, MemberKey: publicKeyPEM(t), AdminKey: publicKeyPEM(t)})
		resp, err := hc.Post("https://"+m.Addr+"/v1/join", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	if status, out := join(c.Grant("worker-a", []string{api.RoleNode}), "192.0.2.10:7000"); status != http.StatusOK {
		t.Fatalf("join of worker-a at 192.0.2.10:7000: %d %s", status, out)
	}
	tok := c.Grant("worker-b", []string{api.RoleNode})
	before := m.Server.Raft().LastIndex()
	status, out := join(tok, "[::ffff:192.0.2.10]:7001")
	if status != http.StatusConflict || !strings.Contains(out, "host ::ffff:192.0.2.10 is the advertise host of node worker-a already") {
		t.Fatalf("join of worker-b at worker-a's host: %d %s; want 409 naming worker-a", status, out)
	}
	if after := m.Server.Raft().LastIndex(); after != before {
		t.Fatalf("the refused join appended %d Raft entries", after-before)
	}
}
