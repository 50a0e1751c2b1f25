package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// ---------------------------------------------------------------------------
// cluster.bootstrap

func TestBootstrap(t *testing.T) {
	good := BootstrapArgs{ClusterID: "cluster-1", NodeID: ctrlID, Roles: []string{"ctrl", "node"}, Address: "10.0.0.1:7000"}
	noCluster := func(t *testing.T, h *harness, _ Result) {
		h.f.View(func(tx *bolt.Tx) error {
			if id := ClusterID(tx); id != "" {
				t.Errorf("cluster id %q after a refused bootstrap", id)
			}
			return nil
		})
	}
	runCases(t, []opCase{
		{name: "ok", entry: ent(OpBootstrap, good), check: func(t *testing.T, h *harness, r Result) {
			if got := decode[map[string]string](t, r)["cluster_id"]; got != "cluster-1" {
				t.Errorf("result cluster_id %q", got)
			}
			h.f.View(func(tx *bolt.Tx) error {
				if id := ClusterID(tx); id != "cluster-1" {
					t.Errorf("ClusterID %q", id)
				}
				if v := tx.Bucket(bucketMeta).Get(keySchemaVersion); !bytes.Equal(v, []byte{0, 0, 0, 0, 0, 0, 0, SchemaVersion}) {
					t.Errorf("schema version %x", v)
				}
				return nil
			})
			n := h.node(ctrlID)
			if n.Admission != api.Admitted || n.RegistrationVersion != 1 || n.Address != good.Address ||
				!reflect.DeepEqual(n.Roles, good.Roles) || !n.AdmittedAt.Equal(h.now) || n.Status != api.NodeNotReady {
				t.Errorf("bootstrap node %+v", n)
			}
			if d := h.overcommitDefault(); d != (api.OvercommitDefault{CPU: 1000, Memory: 1000, Version: 1}) {
				t.Errorf("overcommit default %+v", d)
			}
		}},
		{name: "twice", setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "cluster-2", NodeID: "ctrl-2", Roles: []string{"ctrl"}}),
			code:  api.CodeFailedPrecondition},
		{name: "twice same args", setup: func(h *harness) { h.bootstrap() }, entry: ent(OpBootstrap, good), code: api.CodeFailedPrecondition},
		{name: "twice after an empty cluster id", setup: func(h *harness) {
			h.ok(OpBootstrap, BootstrapArgs{NodeID: ctrlID, Roles: []string{"ctrl"}})
		}, entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c2", NodeID: "ctrl-2", Roles: []string{"ctrl"}}), code: api.CodeFailedPrecondition},
		{name: "bad node id", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: "-ctrl", Roles: []string{"ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "empty node id", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", Roles: []string{"ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "no roles", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "unknown role", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID, Roles: []string{"admin"}}),
			code: api.CodeInvalidArgument, check: noCluster},
		{name: "repeated role", entry: ent(OpBootstrap, BootstrapArgs{ClusterID: "c", NodeID: ctrlID, Roles: []string{"ctrl", "ctrl"}}),
			code: api.CodeInvalidArgument, check: noCluster},
	})
}

// ---------------------------------------------------------------------------
// enrollment.grant

func TestEnrollmentGrant(t *testing.T) {
	grantFor := func(id string) func(h *harness) Entry {
		return ent(OpEnrollmentGrant, GrantArgs{NodeID: id, Roles: []string{"node"}, SecretHash: "h", TTL: time.Hour})
	}
	var cases []opCase
	for _, id := range []string{"", "-a", ".a", "a b", "a/b", "ä", strings.Repeat("x", 64)} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad node id %q", id), setup: func(h *harness) { h.bootstrap() },
			entry: grantFor(id), code: api.CodeInvalidArgument})
	}
	for _, roles := range [][]string{nil, {}, {"admin"}, {"node", "node"}, {"ctrl", "Node"}} {
		cases = append(cases, opCase{name: fmt.Sprintf("bad roles %q", roles), setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: roles, SecretHash: "h", TTL: time.Hour}),
			code:  api.CodeInvalidArgument})
	}
	for _, ttl := range []time.Duration{0, -time.Second} {
		cases = append(cases, opCase{name: fmt.Sprintf("ttl %v", ttl), setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"node"}, SecretHash: "h", TTL: ttl}),
			code:  api.CodeInvalidArgument})
	}
	cases = append(cases,
		opCase{name: "longest node id", setup: func(h *harness) { h.bootstrap() }, entry: grantFor("a" + strings.Repeat("._-9", 15) + "zz")},
		opCase{name: "bootstrap node already admitted", setup: func(h *harness) { h.bootstrap() }, entry: grantFor(ctrlID), code: api.CodeFailedPrecondition},
		opCase{name: "joined node already admitted", setup: func(h *harness) { h.bootstrap(); h.join("node-a") }, entry: grantFor("node-a"), code: api.CodeFailedPrecondition},
		opCase{name: "retired node", setup: retiredNode, entry: grantFor("node-a"), code: api.CodeFailedPrecondition},
		opCase{name: "pending grant", setup: func(h *harness) { h.bootstrap() },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"ctrl", "node"}, SecretHash: "h", TTL: 90 * time.Minute}),
			check: func(t *testing.T, h *harness, r Result) {
				if strings.Contains(string(r.Value), "secret") {
					t.Errorf("result leaks the secret hash: %s", r.Value)
				}
				g := decode[api.Grant](t, r)
				want := api.Grant{NodeID: "node-a", Roles: []string{"ctrl", "node"}, IssuedAt: h.now, ExpiresAt: h.now.Add(90 * time.Minute), State: api.GrantPending}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("result %+v, want %+v", g, want)
				}
				if got := h.grants()["node-a"]; !reflect.DeepEqual(got, want) {
					t.Errorf("listed %+v, want %+v", got, want)
				}
				if err := h.nodeErr("node-a"); api.CodeOf(err) != api.CodeNotFound {
					t.Errorf("a grant registered the node: %v", err)
				}
				h.advance(90 * time.Minute)
				if s := h.grants()["node-a"].State; s != api.GrantExpired {
					t.Errorf("grant at its expiry listed %s", s)
				}
			}},
		opCase{name: "new grant replaces the pending one", setup: func(h *harness) { h.bootstrap(); h.grant("node-a") },
			entry: ent(OpEnrollmentGrant, GrantArgs{NodeID: "node-a", Roles: []string{"ctrl"}, SecretHash: "new-hash", TTL: time.Hour}),
			check: func(t *testing.T, h *harness, _ Result) {
				h.fail(api.CodeUnauthenticated, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
				h.ok(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: "new-hash"})
				if r := h.node("node-a").Roles; !reflect.DeepEqual(r, []string{"ctrl"}) {
					t.Errorf("roles %v", r)
				}
			}},
		opCase{name: "revoked node may be granted again", setup: func(h *harness) {
			h.bootstrap()
			h.join("node-a")
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
		}, entry: grantFor("node-a"), check: func(t *testing.T, h *harness, _ Result) {
			if s := h.grants()["node-a"].State; s != api.GrantPending {
				t.Errorf("grant %s", s)
			}
		}},
	)
	runCases(t, cases)
}

// ---------------------------------------------------------------------------
// enrollment.consume

func TestEnrollmentConsume(t *testing.T) {
	consume := func(id, hash string, opts ...entryOpt) func(h *harness) Entry {
		return ent(OpEnrollmentConsume, ConsumeArgs{NodeID: id, SecretHash: hash, Address: "10.0.0.9:7000"}, opts...)
	}
	grantAt := func(h *harness) { h.bootstrap(); h.grant("node-a", "ctrl", "node") }
	runCases(t, []opCase{
		{name: "no grant", setup: func(h *harness) { h.bootstrap() }, entry: consume("node-x", "h"), code: api.CodeUnauthenticated},
		{name: "wrong secret hash", setup: grantAt, entry: consume("node-a", "wrong"), code: api.CodeUnauthenticated},
		{name: "empty secret hash", setup: grantAt, entry: consume("node-a", ""), code: api.CodeUnauthenticated},
		{name: "other node's grant", setup: grantAt, entry: consume("node-b", secretOf("node-a")), code: api.CodeUnauthenticated},
		{name: "used", setup: func(h *harness) {
			grantAt(h)
			h.ok(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
		},
			entry: consume("node-a", secretOf("node-a")), code: api.CodeFailedPrecondition},
		{name: "expired at ExpiresAt", setup: grantAt,
			entry: func(h *harness) Entry {
				return h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")}, withIssuedAt(h.grants()["node-a"].ExpiresAt))
			}, code: api.CodeFailedPrecondition},
		{name: "expired after ExpiresAt", setup: grantAt,
			entry: consume("node-a", secretOf("node-a"), withIssuedAt(t0.Add(48*time.Hour))), code: api.CodeFailedPrecondition},
		{name: "just before ExpiresAt", setup: grantAt,
			entry: func(h *harness) Entry {
				return h.entry(OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")}, withIssuedAt(h.grants()["node-a"].ExpiresAt.Add(-time.Nanosecond)))
			}},
		{name: "revoked", setup: func(h *harness) { grantAt(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: consume("node-a", secretOf("node-a")), code: api.CodeFailedPrecondition},
		{name: "success admits with the grant's roles", setup: grantAt, entry: consume("node-a", secretOf("node-a")),
			check: func(t *testing.T, h *harness, r Result) {
				res := decode[api.Node](t, r)
				n := h.node("node-a")
				if !reflect.DeepEqual(res, *n) {
					t.Errorf("result %+v\nstored %+v", res, *n)
				}
				if n.Admission != api.Admitted || !reflect.DeepEqual(n.Roles, []string{"ctrl", "node"}) || n.Address != "10.0.0.9:7000" ||
					!n.AdmittedAt.Equal(h.now) || n.RegistrationVersion != 1 || n.Status != api.NodeNotReady || n.Session != nil {
					t.Errorf("admitted node %+v", n)
				}
				g := h.grants()["node-a"]
				if g.State != api.GrantUsed || g.UsedAt == nil || !g.UsedAt.Equal(h.now) || g.UsedBy != "10.0.0.9:7000" {
					t.Errorf("grant after use %+v", g)
				}
			}},
		{name: "revoked node rejoins keeping its version history", setup: func(h *harness) {
			h.bootstrap()
			h.join("node-a")
			h.open("node-a", "s1", 3)
			h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) // version 3
			h.grant("node-a", "ctrl")
		}, entry: consume("node-a", secretOf("node-a")), check: func(t *testing.T, h *harness, _ Result) {
			n := h.node("node-a")
			if n.Admission != api.Admitted || n.RegistrationVersion != 4 || !reflect.DeepEqual(n.Roles, []string{"ctrl"}) || n.LastIncarnation != 3 {
				t.Errorf("rejoined node %+v", n)
			}
			if r := sessionOpenResult(t, h.ok(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2})); r.Refusal != RefusalStale {
				t.Errorf("older incarnation after rejoin: %+v", r)
			}
		}},
	})
}

// ---------------------------------------------------------------------------
// enrollment.revoke

func TestEnrollmentRevoke(t *testing.T) {
	revoke := ent(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"})
	runCases(t, []opCase{
		{name: "unknown", setup: func(h *harness) { h.bootstrap() }, entry: revoke, code: api.CodeNotFound},
		{name: "pending grant", setup: func(h *harness) { h.bootstrap(); h.grant("node-a") }, entry: revoke,
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != true || got["node_revoked"] != false {
					t.Errorf("result %v", got)
				}
				if s := h.grants()["node-a"].State; s != api.GrantRevoked {
					t.Errorf("grant state %s", s)
				}
				h.fail(api.CodeFailedPrecondition, OpEnrollmentConsume, ConsumeArgs{NodeID: "node-a", SecretHash: secretOf("node-a")})
			}},
		{name: "admitted node with a live session", setup: readyNode, entry: revoke,
			check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != false || got["node_revoked"] != true {
					t.Errorf("result %v", got)
				}
				n := h.node("node-a")
				if n.Status != api.NodeRevoked || n.Admission != api.Revoked || n.RegistrationVersion != 3 {
					t.Errorf("revoked node %+v", n)
				}
				if s := n.Session; s.Alive || s.EndedAt == nil || !s.EndedAt.Equal(h.now) || s.EndReason != "revoked" {
					t.Errorf("session after revoke %+v", s)
				}
				h.f.View(func(tx *bolt.Tx) error {
					live, _ := LiveSessions(tx)
					if _, ok := live["node-a"]; ok {
						t.Errorf("live sessions %v", live)
					}
					return nil
				})
				h.fail(api.CodeFailedPrecondition, OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1"})
				if res := sessionOpenResult(t, h.expectUnchanged(h.entry(OpSessionOpen, SessionOpenArgs{NodeID: "node-a", SessionID: "s2", Incarnation: 2}))); res.Accepted || res.Refusal != RefusalNotAdmitted {
					t.Errorf("session of a revoked node: %+v", res)
				}
			}},
		{name: "already revoked changes nothing", setup: func(h *harness) { readyNode(h); h.ok(OpEnrollmentRevoke, NodeArgs{NodeID: "node-a"}) },
			entry: revoke, unchanged: true, check: func(t *testing.T, h *harness, r Result) {
				if got := decode[map[string]any](t, r); got["grant_revoked"] != false || got["node_revoked"] != false {
					t.Errorf("result %v", got)
				}
			}},
		{name: "retired node stays retired", setup: retiredNode, entry: revoke, unchanged: true, check: func(t *testing.T, h *harness, _ Result) {
			if s := h.node("node-a").Status; s != api.NodeRetired {
				t.Errorf("status %s", s)
			}
		}},
	})
}
