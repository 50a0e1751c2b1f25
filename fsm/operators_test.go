package fsm

import (
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

const fp1 = "1111111111111111111111111111111111111111111111111111111111111111"
const fp2 = "2222222222222222222222222222222222222222222222222222222222222222"

func (h *harness) operator(name string) *api.Operator {
	h.t.Helper()
	var rec *api.Operator
	if err := h.f.View(func(tx *bolt.Tx) (err error) { rec, err = GetOperator(tx, name); return err }); err != nil {
		h.t.Fatalf("operator %s: %v", name, err)
	}
	return rec
}

func TestOperatorIssueAndRevoke(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	got := decode[api.Operator](t, h.ok(OpOperatorIssue, OperatorIssueArgs{Name: "alice", KeyFingerprint: fp1, TTL: 24 * time.Hour}, withActor("admin@ctrl-1")))
	if got.State != api.OperatorActive || got.IssuedBy != "admin@ctrl-1" || !got.IssuedAt.Equal(h.now) || !got.ExpiresAt.Equal(h.now.Add(24*time.Hour)) {
		t.Fatalf("issued %+v", got)
	}
	first := h.now
	h.advance(time.Minute)
	h.ok(OpOperatorIssue, OperatorIssueArgs{Name: "alice", KeyFingerprint: fp2, TTL: 2 * time.Hour}, withActor("operator:bob"))
	if rec := h.operator("alice"); rec.IssuedAt.Equal(first) || rec.KeyFingerprint != fp2 || rec.IssuedBy != "operator:bob" {
		t.Fatalf("issued again: %+v, want a new record replacing the first", rec)
	}
	h.advance(time.Minute)
	revoked := decode[api.Operator](t, h.ok(OpOperatorRevoke, OperatorArgs{Name: "alice"}))
	if revoked.State != api.OperatorRevoked || revoked.RevokedAt == nil || !revoked.RevokedAt.Equal(h.now) {
		t.Fatalf("revoked %+v", revoked)
	}
	// Revoking again changes nothing; an unknown name is not found.
	h.expectUnchanged(h.entry(OpOperatorRevoke, OperatorArgs{Name: "alice"}))
	h.fail(api.CodeNotFound, OpOperatorRevoke, OperatorArgs{Name: "carol"})
	var list []api.Operator
	h.f.View(func(tx *bolt.Tx) (err error) { list, err = ListOperators(tx, h.now.Add(48*time.Hour)); return err })
	if len(list) != 1 || list[0].State != api.OperatorRevoked {
		t.Fatalf("list %+v", list)
	}
}

func TestOperatorIssueRefuses(t *testing.T) {
	h := newHarness(t)
	h.bootstrap()
	for _, a := range []OperatorIssueArgs{
		{Name: "-a", KeyFingerprint: fp1, TTL: time.Hour},
		{Name: strings.Repeat("x", 64), KeyFingerprint: fp1, TTL: time.Hour},
		{Name: "alice", KeyFingerprint: "zz", TTL: time.Hour},
		{Name: "alice", KeyFingerprint: fp1, TTL: time.Hour - time.Second},
		{Name: "alice", KeyFingerprint: fp1, TTL: OperatorMaxTTL + time.Second},
		{Name: "alice", KeyFingerprint: fp1, TTL: 90 * 24 * time.Hour},
	} {
		h.fail(api.CodeInvalidArgument, OpOperatorIssue, a)
	}
	h.ok(OpOperatorIssue, OperatorIssueArgs{Name: "alice", KeyFingerprint: fp1, TTL: OperatorMaxTTL})
}

func TestOperatorRole(t *testing.T) {
	for _, ok := range [][]string{{"node", "operator"}, {"ctrl", "operator"}, {"ctrl", "node", "operator"}} {
		if err := ValidRoles(ok); err != nil {
			t.Errorf("ValidRoles(%v) = %v", ok, err)
		}
	}
	for _, bad := range [][]string{{"operator"}, {"node", "operator", "operator"}, {"admin"}} {
		if err := ValidRoles(bad); err == nil {
			t.Errorf("ValidRoles(%v) accepted", bad)
		}
	}
	if OpLevel(OpOperatorIssue) != LevelOperators || OpLevel(OpOperatorRevoke) != LevelOperators || LevelOperators > FeatureLevel {
		t.Fatalf("operator ops at levels %d, %d; build at %d", OpLevel(OpOperatorIssue), OpLevel(OpOperatorRevoke), FeatureLevel)
	}
}
