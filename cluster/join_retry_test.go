package cluster_test

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/trust"
)

// A join sent again after its answer was lost (ctrl's leader changed while
// the admission was in flight, which commits it or not) is answered with
// the admission it made, once: the grant is not spent on the retry. The
// join's secret is what makes it the same join: anyone else with the grant
// and the host's public keys is refused, and from another address without
// a word to the Raft log.
func TestJoinSentAgainIsAnsweredWithItsAdmission(t *testing.T) {
	t.Parallel()
	c := clustertest.New(t, clustertest.Options{Ctrl: 1})
	m := c.Members[0]
	ctx := context.Background()
	grant := c.Grant("node-x", []string{api.RoleNode})
	keys := func() (memberKey *ecdsa.PrivateKey, member, admin string) {
		mk, err := trust.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		ak, err := trust.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		return mk, trust.PublicKeyPEM(&mk.PublicKey), trust.PublicKeyPEM(&ak.PublicKey)
	}
	key, member, admin := keys()
	advertise := clustertest.FreeAddr(t)
	secret, other := strings.Repeat("ab", 32), strings.Repeat("cd", 32)
	first, err := cluster.PostJoin(ctx, m.Addr, grant, advertise, member, admin, secret)
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	again, err := cluster.PostJoin(ctx, m.Addr, grant, advertise, member, admin, secret)
	if err != nil {
		t.Fatalf("the same join sent again: %v; want its admission", err)
	}
	if again.NodeID != "node-x" || again.ClusterID != first.ClusterID {
		t.Fatalf("answer to the join sent again: node %s of cluster %s; want node-x of %s", again.NodeID, again.ClusterID, first.ClusterID)
	}
	for _, jr := range []struct {
		name string
		pem  string
	}{{"first", first.MemberCert}, {"again", again.MemberCert}} {
		cert, err := trust.ParseCertPEM([]byte(jr.pem))
		if err != nil {
			t.Fatalf("%s answer's member certificate: %v", jr.name, err)
		}
		if !key.PublicKey.Equal(cert.PublicKey) {
			t.Fatalf("%s member certificate is not for the joining host's key", jr.name)
		}
	}
	var nodes api.NodeList
	if _, err := c.Client(m).Do(ctx, "GET", "/v1/nodes", nil, &nodes); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for _, n := range nodes.Nodes {
		if n.NodeID == "node-x" && n.Admission == api.Admitted && n.Address == advertise {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("node-x admitted %d times in %+v; want once", admitted, nodes.Nodes)
	}

	// Anyone else: its own keys, or the host's public keys without its
	// secret, from the same address or another.
	_, member2, admin2 := keys()
	for _, j := range []struct{ name, member, admin, secret string }{
		{"another host's keys and secret", member2, admin2, other},
		{"the host's keys, another secret", member, admin, other},
		{"the host's keys, no secret", member, admin, ""},
	} {
		if _, err := cluster.PostJoin(ctx, m.Addr, grant, advertise, j.member, j.admin, j.secret); api.CodeOf(err) != api.CodeFailedPrecondition {
			t.Fatalf("a join with the used grant from the same address, %s: %v; want failed_precondition (used)", j.name, err)
		}
	}
	before := m.Server.Raft().LastIndex()
	if _, err := cluster.PostJoin(ctx, m.Addr, grant, clustertest.FreeAddr(t), member, admin, secret); api.CodeOf(err) != api.CodeFailedPrecondition {
		t.Fatalf("the used grant from another address: %v; want failed_precondition (used)", err)
	}
	if after := m.Server.Raft().LastIndex(); after != before {
		t.Fatalf("the refused join appended %d Raft entries", after-before)
	}
	if _, err := cluster.PostJoin(ctx, m.Addr, c.Grant("node-y", []string{api.RoleNode}), clustertest.FreeAddr(t), member2, admin2, "short"); api.CodeOf(err) != api.CodeInvalidArgument {
		t.Fatalf("a join secret that is not 64 hex digits: %v; want invalid_argument", err)
	}
}

// Join sends its request again while ctrl answers "unavailable", and only
// then: a member it did not reach, or any other refusal, ends it at once.
func TestJoinRetriesOnlyUnavailable(t *testing.T) {
	t.Parallel()
	ok := api.JoinResponse{NodeID: "node-x"}
	unavailable := api.Errorf(api.CodeUnavailable, "ctrl leadership changed while the write was in flight")
	cases := []struct {
		name    string
		answers []error
		sends   int
		code    api.Code
	}{
		{"an election, then the admission", []error{unavailable, unavailable, nil}, 3, ""},
		{"no member reached", []error{cluster.Unreachable(api.Errorf(api.CodeUnavailable, "join through member x: connection refused")), nil}, 1, api.CodeUnavailable},
		{"a used grant", []error{api.Errorf(api.CodeFailedPrecondition, "enrollment grant for node node-x was already used"), nil}, 1, api.CodeFailedPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sends := 0
			jr, err := cluster.RetryUnavailable(context.Background(), func() (api.JoinResponse, error) {
				err := tc.answers[sends]
				sends++
				if err != nil {
					return api.JoinResponse{}, err
				}
				return ok, nil
			})
			if sends != tc.sends {
				t.Errorf("sent %d times, want %d", sends, tc.sends)
			}
			if tc.code == "" && (err != nil || jr.NodeID != "node-x") {
				t.Errorf("answer %+v, %v; want the admission", jr, err)
			}
			if tc.code != "" && api.CodeOf(err) != tc.code {
				t.Errorf("error %v; want %s", err, tc.code)
			}
		})
	}
	// A cancelled join stops retrying with the last answer.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := cluster.RetryUnavailable(ctx, func() (api.JoinResponse, error) { return api.JoinResponse{}, unavailable })
	if !errors.Is(err, unavailable) {
		t.Errorf("cancelled join: %v; want the last answer", err)
	}
}
