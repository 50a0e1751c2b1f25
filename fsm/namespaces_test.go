package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func keyHash(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// tenants: two namespaces acme and beta on one node, with a sandbox key
// in each and a namespace-admin key in acme.
func tenants(h *harness) {
	h.t.Helper()
	oneNode(h)
	for _, ns := range []string{"acme", "beta"} {
		h.ok(OpNamespaceCreate, NamespaceArgs{Name: ns})
		h.ok(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: ns, Name: "app", Role: api.KeyRoleSandbox, KeyID: strings.Repeat(ns[:1], api.KeyIDLen), SecretHash: keyHash(ns)})
	}
	h.ok(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: "acme", Name: "admin", Role: api.KeyRoleNamespaceAdmin, KeyID: strings.Repeat("z", api.KeyIDLen), SecretHash: keyHash("admin")})
}

func asKey(ns, name string) entryOpt { return withActor(KeyActor(ns, name)) }

// Two tenants each have a Volume named data; a key of one can neither
// see nor touch the other's Workspaces and Volumes, and every refusal
// leaves the state as it was (h.fail checks).
func TestKeysAreHeldToTheirNamespace(t *testing.T) {
	h := newHarness(t)
	tenants(h)
	h.advance(time.Second)
	acmeVol := decode[api.Volume](t, h.ok(OpVolumeCreate, VolumeCreateArgs{Name: "data", SizeBytes: gib}, withCommand("v-acme"), asKey("acme", "app")))
	betaVol := decode[api.Volume](t, h.ok(OpVolumeCreate, VolumeCreateArgs{Namespace: "beta", Name: "data", SizeBytes: gib}, withCommand("v-beta")))
	if acmeVol.Namespace != "acme" || betaVol.Namespace != "beta" || acmeVol.VolumeID == betaVol.VolumeID {
		t.Fatalf("volumes: %+v %+v", acmeVol, betaVol)
	}
	h.fail(api.CodeAlreadyExists, OpVolumeCreate, VolumeCreateArgs{Name: "data", SizeBytes: gib}, withCommand("v-acme2"), asKey("acme", "app"))
	h.volAnswer(acmeVol.VolumeID, OutcomeOK, "", false)
	h.volAnswer(betaVol.VolumeID, OutcomeOK, "", false)

	a := WorkspaceCreateArgs{Template: "kibotos-coding", CPU: 1000, MemoryBytes: gib}
	h.advance(time.Second)
	wa := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, a, withCommand("w-acme"), asKey("acme", "app")))
	if wa.Namespace != "acme" {
		t.Fatalf("a key's Workspace went to %q, want acme", wa.Namespace)
	}
	h.answer(wa.WorkspaceID, OutcomeOK, "")
	b := a
	b.Namespace = "beta"
	wb := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, b, withCommand("w-beta")))
	h.answer(wb.WorkspaceID, OutcomeOK, "")

	// beta's key on acme's objects: not found, whatever the op.
	for _, op := range []string{OpWorkspaceStop, OpWorkspacePause, OpWorkspaceDelete, OpWorkspaceStart} {
		h.fail(api.CodeNotFound, op, WorkspaceArgs{WorkspaceID: wa.WorkspaceID}, asKey("beta", "app"))
	}
	h.fail(api.CodeNotFound, OpVolumeDelete, VolumeArgs{Volume: acmeVol.VolumeID}, asKey("beta", "app"))
	h.fail(api.CodeNotFound, OpVolumeResize, VolumeResizeArgs{Volume: acmeVol.VolumeID, SizeBytes: 2 * gib}, asKey("beta", "app"))
	// By name, beta's key finds beta's own data, never acme's.
	if r := h.ok(OpVolumeDelete, VolumeArgs{Volume: "data"}, asKey("beta", "app")); decode[api.Volume](t, r).VolumeID != betaVol.VolumeID {
		t.Fatalf("beta's key deleted %s, want its own %s", r.Value, betaVol.VolumeID)
	}
	// A key may not name another namespace, attach another's Volume,
	// fork another's Workspace, nor use cluster-wide network objects.
	b.Namespace = "acme"
	h.fail(api.CodePermissionDenied, OpWorkspaceCreate, b, withCommand("w-x1"), asKey("beta", "app"))
	att := a
	att.Volumes = []api.VolumeAttach{{Volume: acmeVol.VolumeID, Path: "/data"}}
	h.fail(api.CodeNotFound, OpWorkspaceCreate, att, withCommand("w-x2"), asKey("beta", "app"))
	// Network objects are found in the Workspace's namespace only.
	h.ok(OpEgressCreate, EgressCreateArgs{Name: ObjectName("beta", "corp"), SOCKS5: "10.0.0.1:1080"})
	withEgress := a
	withEgress.Network = &api.NetworkPolicy{Egress: "corp"}
	h.fail(api.CodeNotFound, OpWorkspaceCreate, withEgress, withCommand("w-x3"), asKey("acme", "app"))
	withEgress.Network.Egress = ObjectName("beta", "corp")
	h.fail(api.CodeNotFound, OpWorkspaceCreate, withEgress, withCommand("w-x4"), asKey("acme", "app"))
	h.fail(api.CodeNotFound, OpEgressDelete, ObjectArgs{Name: ObjectName("beta", "corp")}, asKey("acme", "admin"))
	h.fail(api.CodePermissionDenied, OpEgressDelete, ObjectArgs{Name: ObjectName("beta", "corp")}, asKey("beta", "app"))
	withEgress.Network.Egress = "corp"
	h.ok(OpWorkspaceCreate, withEgress, withCommand("w-x5"), asKey("beta", "app"))
	// Ops outside the role: a sandbox key manages no keys, no namespace.
	h.fail(api.CodePermissionDenied, OpAPIKeyCreate, APIKeyCreateArgs{Namespace: "acme", Name: "more", Role: api.KeyRoleSandbox, KeyID: strings.Repeat("m", api.KeyIDLen), SecretHash: keyHash("m")}, asKey("acme", "app"))
	h.fail(api.CodePermissionDenied, OpNamespaceCreate, NamespaceArgs{Name: "gamma"}, asKey("acme", "admin"))
	h.fail(api.CodePermissionDenied, OpNodeDrain, NodeArgs{NodeID: "node-a"}, asKey("acme", "admin"))
	// The admin key manages keys of its namespace only.
	h.fail(api.CodeNotFound, OpAPIKeyRevoke, APIKeyArgs{Namespace: "beta", Name: "app"}, asKey("acme", "admin"))
	h.ok(OpAPIKeyRevoke, APIKeyArgs{Namespace: "acme", Name: "app"}, asKey("acme", "admin"))
	// A revoked key's entries are refused from then on.
	h.fail(api.CodeUnauthenticated, OpWorkspaceStop, WorkspaceArgs{WorkspaceID: wa.WorkspaceID}, asKey("acme", "app"))
	// The owner's key, and operators, go on.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: wb.WorkspaceID}, asKey("beta", "app"))
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: wa.WorkspaceID})
}

// A key's expiry is the entry's time, not a member's clock.
func TestKeyExpiresAtItsEntryTime(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "acme"})
	h.ok(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: "acme", Name: "short", Role: api.KeyRoleSandbox, KeyID: strings.Repeat("s", api.KeyIDLen), SecretHash: keyHash("s"), TTL: time.Hour})
	h.advance(59 * time.Minute)
	h.ok(OpVolumeCreate, VolumeCreateArgs{Name: "v1", SizeBytes: gib}, withCommand("v1"), asKey("acme", "short"))
	h.advance(time.Minute)
	h.fail(api.CodeUnauthenticated, OpVolumeCreate, VolumeCreateArgs{Name: "v2", SizeBytes: gib}, withCommand("v2"), asKey("acme", "short"))
	// A name whose key expired may be created again, with a new id.
	h.ok(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: "acme", Name: "short", Role: api.KeyRoleSandbox, KeyID: strings.Repeat("t", api.KeyIDLen), SecretHash: keyHash("t")})
	var old *KeyCredential
	h.f.View(func(tx *bolt.Tx) (err error) {
		old, err = FindAPIKey(tx, strings.Repeat("s", api.KeyIDLen), h.now)
		return
	})
	if old != nil {
		t.Fatalf("the replaced key's id still finds %+v", old.Key)
	}
}

// A namespace is deleted only empty; its keys go with it; default stays.
func TestNamespaceDelete(t *testing.T) {
	h := newHarness(t)
	tenants(h)
	h.advance(time.Second)
	v := decode[api.Volume](t, h.ok(OpVolumeCreate, VolumeCreateArgs{Namespace: "acme", Name: "data", SizeBytes: gib}, withCommand("v1")))
	h.volAnswer(v.VolumeID, OutcomeOK, "", false)
	var ns api.Namespace
	h.f.View(func(tx *bolt.Tx) (err error) { ns, err = GetNamespace(tx, "acme"); return })
	if ns.Usage != (api.NamespaceUsage{Volumes: 1, APIKeys: 2, NamespaceResources: api.NamespaceResources{VolumeBytes: gib}}) {
		t.Fatalf("acme usage %+v, want 1 Volume and 2 keys", ns.Usage)
	}
	h.fail(api.CodeFailedPrecondition, OpNamespaceDelete, NamespaceArgs{Name: "acme"})
	h.fail(api.CodeFailedPrecondition, OpNamespaceDelete, NamespaceArgs{Name: api.DefaultNamespace})
	h.ok(OpVolumeDelete, VolumeArgs{Namespace: "acme", Volume: "data"})
	h.volAnswer(v.VolumeID, OutcomeOK, "", false)
	h.ok(OpNamespaceDelete, NamespaceArgs{Name: "acme"})
	h.fail(api.CodeNotFound, OpVolumeCreate, VolumeCreateArgs{Namespace: "acme", Name: "data", SizeBytes: gib}, withCommand("v2"))
	var keys []api.APIKey
	h.f.View(func(tx *bolt.Tx) (err error) { keys, err = ListAPIKeys(tx, "", h.now); return })
	if len(keys) != 1 || keys[0].Namespace != "beta" {
		t.Fatalf("keys after acme's delete: %+v, want beta's only", keys)
	}
	h.fail(api.CodeAlreadyExists, OpNamespaceCreate, NamespaceArgs{Name: "beta"})
	h.fail(api.CodeInvalidArgument, OpNamespaceCreate, NamespaceArgs{Name: "Bad_Name"})
}

// Records of the default namespace are what an older build wrote: no
// namespace field, the Volume name index keyed by the bare name.
func TestDefaultNamespaceRecordsUnchanged(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	r := h.ok(OpVolumeCreate, VolumeCreateArgs{Namespace: api.DefaultNamespace, Name: "data", SizeBytes: gib}, withCommand("v1"))
	if strings.Contains(string(r.Value), "namespace") {
		t.Fatalf("a default Volume's record names its namespace: %s", r.Value)
	}
	h.f.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketVolumeNames).Get([]byte("data")) == nil {
			t.Fatalf("default Volume data is not indexed by its bare name")
		}
		return nil
	})
	if h.vol("data").Namespace != "" {
		t.Fatalf("default Volume stores namespace %q", h.vol("data").Namespace)
	}
}

func (h *harness) namespace(name string) api.Namespace {
	h.t.Helper()
	var ns api.Namespace
	if err := h.f.View(func(tx *bolt.Tx) (err error) { ns, err = GetNamespace(tx, name); return }); err != nil {
		h.t.Fatalf("namespace %s: %v", name, err)
	}
	return ns
}

// A key's last use is the time of the entry that reports it, never
// moved back; unknown ids are skipped.
func TestKeyLastUsed(t *testing.T) {
	h := newHarness(t)
	tenants(h)
	id := strings.Repeat("a", api.KeyIDLen)
	h.advance(time.Minute)
	h.ok(OpAPIKeyUsed, APIKeyUsedArgs{KeyIDs: []string{id, strings.Repeat("q", api.KeyIDLen)}}, withIgnoreUnknown())
	var k *api.APIKey
	h.f.View(func(tx *bolt.Tx) (err error) { k, err = LookupAPIKey(tx, "acme", "app", h.now); return })
	if k.LastUsedAt == nil || !k.LastUsedAt.Equal(h.now) {
		t.Fatalf("last used %v, want %v", k.LastUsedAt, h.now)
	}
	h.expectUnchanged(makeEntry(h.now.Add(-time.Hour), OpAPIKeyUsed, APIKeyUsedArgs{KeyIDs: []string{id}}))
}

// A namespace's list reads its index, pages by id like the full list, and
// shows only its own Workspaces.
func TestNamespaceListPages(t *testing.T) {
	h := newHarness(t)
	tenants(h)
	var ids []string
	for i := range 3 {
		a := smallWS
		a.Namespace = "acme"
		ids = append(ids, h.create(fmt.Sprintf("a%d", i), a).WorkspaceID)
	}
	h.create("other", smallWS)
	slices.Sort(ids)
	acme := "acme"
	var got []string
	token := ""
	for {
		l, err := h.listWS(WorkspaceFilter{All: true, Namespace: &acme}, 2, token)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range l.Workspaces {
			got = append(got, w.WorkspaceID)
		}
		if token = l.NextPageToken; token == "" {
			break
		}
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("acme's pages listed %v, want %v", got, ids)
	}
}

// A fork is in its source's namespace, whoever forks it.
func TestForkStaysInItsNamespace(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.resumer("node-a", canResume)
	h.poolCapacity("nfs", 100*gib)
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "acme"})
	h.ok(OpAPIKeyCreate, APIKeyCreateArgs{Namespace: "acme", Name: "app", Role: api.KeyRoleSandbox, KeyID: strings.Repeat("a", api.KeyIDLen), SecretHash: keyHash("acme")})
	a := smallWS
	a.Namespace = "acme"
	src := h.pausedWS("src", a)
	h.advance(time.Second)
	f := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, fork(src.WorkspaceID), withCommand("f1"), asKey("acme", "app")))
	if f.Namespace != "acme" {
		t.Fatalf("a fork of acme's Workspace went to namespace %q", f.Namespace)
	}
	g := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, WorkspaceCreateArgs{Namespace: "acme", From: src.WorkspaceID}, withCommand("f2")))
	if g.Namespace != "acme" {
		t.Fatalf("an operator's fork of acme's Workspace went to namespace %q", g.Namespace)
	}
	// An operator naming no namespace forks into the source's; naming
	// another, finds no such Workspace there.
	if o := decode[api.Workspace](t, h.ok(OpWorkspaceCreate, fork(src.WorkspaceID), withCommand("f3"))); o.Namespace != "acme" {
		t.Fatalf("an operator's fork without a namespace went to %q", o.Namespace)
	}
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "beta"})
	other := fork(src.WorkspaceID)
	other.Namespace = "beta"
	h.fail(api.CodeNotFound, OpWorkspaceCreate, other, withCommand("f4"))
}
