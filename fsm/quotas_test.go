package fsm

import (
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
)

func u64(n uint64) *uint64 { return &n }

// Two creates in one batch (racing on two members) for the last room of
// the quota: the first in the log gets it, the second is refused with
// the quota, what is in use and what it asked; nothing goes over.
func TestQuotaDecidedInLogOrder(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "acme"})
	h.ok(OpNamespaceQuota, NamespaceQuotaArgs{Name: "acme", Set: api.NamespaceQuota{MemoryBytes: u64(3 * gib), RunningWorkspaces: u64(5)}})
	a := WorkspaceCreateArgs{Namespace: "acme", Template: "kibotos-coding", CPU: 1000, MemoryBytes: 2 * gib}
	h.advance(time.Second)
	rs := h.apply(h.entry(OpWorkspaceCreate, a, withCommand("c1")), h.entry(OpWorkspaceCreate, a, withCommand("c2")))
	if rs[0].Error != nil || rs[1].Error == nil || api.CodeOf(rs[1].Err()) != api.CodeResourceExhausted {
		t.Fatalf("racing creates: %v / %v, want the first to pass and the second resource_exhausted", rs[0].Error, rs[1].Error)
	}
	if want := "namespace acme: memory quota 3.0GiB, 2.0GiB in use, 2.0GiB asked"; !strings.Contains(rs[1].Error.Message, want) {
		t.Fatalf("refusal %q does not say %q", rs[1].Error.Message, want)
	}
	w := h.answer(WorkspaceIDFor("c1"), OutcomeOK, "")
	small := a
	small.MemoryBytes = gib
	h.create("c3", small) // exactly at the quota
	ns := h.namespace("acme")
	if ns.Usage.RunningWorkspaces != 2 || ns.Usage.MemoryBytes != 3*gib || ns.Usage.CPU != 2000 {
		t.Fatalf("acme usage %+v, want 2 running, 2 vCPU, 3GiB", ns.Usage)
	}
	// A stop frees its share once the node confirms; a start asks again.
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	if u := h.namespace("acme").Usage; u.MemoryBytes != gib || u.RunningWorkspaces != 1 {
		t.Fatalf("usage after the stop %+v, want 1GiB and 1 running", u)
	}
	h.create("c4", a)
	h.fail(api.CodeResourceExhausted, OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	// Lifting the bound lets it through; default never has one.
	h.ok(OpNamespaceQuota, NamespaceQuotaArgs{Name: "acme", Clear: []string{"memory"}})
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.fail(api.CodeFailedPrecondition, OpNamespaceQuota, NamespaceQuotaArgs{Name: api.DefaultNamespace, Set: api.NamespaceQuota{CPU: u64(1000)}})
	h.fail(api.CodeInvalidArgument, OpNamespaceQuota, NamespaceQuotaArgs{Name: "acme", Clear: []string{"disk"}})
}

// Volume bytes count a Volume's size and a resize's target; a Volume's
// delete gives its bytes back once the node removed it.
func TestVolumeQuota(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "acme"})
	h.ok(OpNamespaceQuota, NamespaceQuotaArgs{Name: "acme", Set: api.NamespaceQuota{VolumeBytes: u64(3 * gib)}})
	h.advance(time.Second)
	v := decode[api.Volume](t, h.ok(OpVolumeCreate, VolumeCreateArgs{Namespace: "acme", Name: "a", SizeBytes: 2 * gib}, withCommand("v1")))
	h.volAnswer(v.VolumeID, OutcomeOK, "", false)
	h.fail(api.CodeResourceExhausted, OpVolumeCreate, VolumeCreateArgs{Namespace: "acme", Name: "b", SizeBytes: 2 * gib}, withCommand("v2"))
	h.fail(api.CodeResourceExhausted, OpVolumeResize, VolumeResizeArgs{Namespace: "acme", Volume: "a", SizeBytes: 4 * gib})
	h.ok(OpVolumeResize, VolumeResizeArgs{Namespace: "acme", Volume: "a", SizeBytes: 3 * gib})
	if u := h.namespace("acme").Usage; u.VolumeBytes != 3*gib {
		t.Fatalf("usage with a resize pending %+v, want 3GiB", u)
	}
	h.volAnswer(v.VolumeID, OutcomeOK, "", false)
	h.ok(OpVolumeDelete, VolumeArgs{Namespace: "acme", Volume: "a"})
	h.volAnswer(v.VolumeID, OutcomeOK, "", false)
	if u := h.namespace("acme").Usage; u.VolumeBytes != 0 || u.Volumes != 0 {
		t.Fatalf("usage after the delete %+v, want none", u)
	}
	// A Workspace's new Volumes count at its create.
	a := WorkspaceCreateArgs{Namespace: "acme", Template: "kibotos-coding", CPU: 1000, MemoryBytes: gib,
		NewVolumes: []api.NewVolume{{SizeBytes: 4 * gib, Path: "/data"}}}
	h.fail(api.CodeResourceExhausted, OpWorkspaceCreate, a, withCommand("w1"))
}

// A namespace's lifetime defaults: a Workspace created without a timeout
// gets the default (or the maximum), none may exceed the maximum, and
// with a maximum none lives without an end.
func TestNamespaceLifetimeDefaults(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.ok(OpNamespaceCreate, NamespaceArgs{Name: "acme"})
	h.ok(OpNamespaceDefaults, NamespaceDefaultsArgs{Name: "acme", Defaults: api.NamespaceDefaults{TimeoutSeconds: 3600, OnTimeout: api.TimeoutPause, MaxTimeoutSeconds: 86400}})
	a := WorkspaceCreateArgs{Namespace: "acme", Template: "kibotos-coding", CPU: 1000, MemoryBytes: gib}
	w := h.create("d1", a)
	if w.TimeoutSeconds != 3600 || w.OnTimeout != api.TimeoutPause || w.EndsAt == nil || !w.EndsAt.Equal(h.now.Add(time.Hour)) {
		t.Fatalf("a Workspace created without a timeout in acme: timeout %d %s ends %v, want 1h pause", w.TimeoutSeconds, w.OnTimeout, w.EndsAt)
	}
	long := a
	long.TimeoutSeconds = 2 * 86400
	if e := h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, long, withCommand("d2")); !strings.Contains(e.Message, "over its maximum 24h0m0s") {
		t.Fatalf("refusal %q", e.Message)
	}
	h.fail(api.CodeInvalidArgument, OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID})
	h.fail(api.CodeInvalidArgument, OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 2 * 86400})
	h.ok(OpWorkspaceSetTimeout, WorkspaceSetTimeoutArgs{WorkspaceID: w.WorkspaceID, TimeoutSeconds: 86400})
	// Without a default, the maximum is the timeout.
	h.ok(OpNamespaceDefaults, NamespaceDefaultsArgs{Name: "acme", Defaults: api.NamespaceDefaults{MaxTimeoutSeconds: 600}})
	if w := h.create("d3", a); w.TimeoutSeconds != 600 || w.OnTimeout != api.TimeoutDelete {
		t.Fatalf("created under a maximum only: %d %s, want 600 delete", w.TimeoutSeconds, w.OnTimeout)
	}
	// Default elsewhere is untouched.
	if w := h.create("d4", smallWS); w.EndsAt != nil {
		t.Fatalf("a default-namespace Workspace got an end %v", w.EndsAt)
	}
	h.fail(api.CodeInvalidArgument, OpNamespaceDefaults, NamespaceDefaultsArgs{Name: "acme", Defaults: api.NamespaceDefaults{TimeoutSeconds: 7200, MaxTimeoutSeconds: 3600}})
	h.fail(api.CodeFailedPrecondition, OpNamespaceDefaults, NamespaceDefaultsArgs{Name: api.DefaultNamespace, Defaults: api.NamespaceDefaults{TimeoutSeconds: 60}})
}
