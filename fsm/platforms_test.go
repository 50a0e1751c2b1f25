package fsm

import (
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func platformID(c byte) string { return "sha256-" + strings.Repeat(string(c), 64) }

func platformArgs(c byte, kernel string) PlatformPublishArgs {
	return PlatformPublishArgs{PlatformImage: api.PlatformImage{PlatformID: platformID(c), KernelSeries: api.KernelSeriesOf(kernel), KernelVersion: kernel,
		AgentSHA256: strings.Repeat("5", 64), Digest: testDigest(c), SizeBytes: 40 << 20}, NodeID: "node-a"}
}

func (h *harness) platforms() map[string]api.CatalogPlatform {
	h.t.Helper()
	var l *api.CatalogPlatformList
	if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListCatalogPlatforms(tx); return }); err != nil {
		h.t.Fatal(err)
	}
	out := map[string]api.CatalogPlatform{}
	for _, p := range l.Platforms {
		out[p.PlatformID] = p
	}
	return out
}

func (h *harness) taskPlatforms(ws string) []string {
	h.t.Helper()
	var ps []api.PlatformImage
	if err := h.f.View(func(tx *bolt.Tx) (err error) { ps, err = TaskPlatforms(tx, h.ws(ws)); return }); err != nil {
		h.t.Fatal(err)
	}
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.PlatformID)
	}
	return ids
}

// Published Platforms are not approved; the latest approval of a kernel
// series is its default, one per series; approving again re-elects it.
func TestPlatformPublishApproveDefault(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	p := decode[api.CatalogPlatform](t, h.ok(OpPlatformPublish, platformArgs('a', "6.1.0-28-cloud-amd64")))
	if p.Approved || p.Default || p.KernelSeries != "6.1" || p.PublishedBy != "node-a" || p.Version != 1 {
		t.Fatalf("published %+v", p)
	}
	h.ok(OpPlatformPublish, platformArgs('b', "6.1.0-30-cloud-amd64"))
	h.ok(OpPlatformPublish, platformArgs('c', "6.12.9-cloud-amd64"))
	h.advance(time.Minute)
	p = decode[api.CatalogPlatform](t, h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('a')}))
	if !p.Approved || !p.Default || p.ApprovedAt == nil || !p.ApprovedAt.Equal(h.now) || p.Version != 2 {
		t.Fatalf("approved %+v", p)
	}
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('b')})
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('c')})
	got := h.platforms()
	if !got[platformID('a')].Approved || got[platformID('a')].Default || !got[platformID('b')].Default || !got[platformID('c')].Default {
		t.Fatalf("one default per series (b for 6.1, c for 6.12): %+v", got)
	}
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('a')})
	if got := h.platforms(); !got[platformID('a')].Default || got[platformID('b')].Default {
		t.Fatalf("approving a again makes it the 6.1 default: %+v", got)
	}
	h.fail(api.CodeNotFound, OpPlatformApprove, ObjectArgs{Name: platformID('d')})
	h.fail(api.CodeInvalidArgument, OpPlatformApprove, ObjectArgs{Name: "../x"})
	h.fail(api.CodeVersionMismatch, OpPlatformApprove, ObjectArgs{Name: platformID('c')}, withVersion(1))
	// Published again (the same content): the approval stays.
	again := platformArgs('a', "6.1.0-28-cloud-amd64")
	again.Digest = testDigest('f')
	if p := decode[api.CatalogPlatform](t, h.ok(OpPlatformPublish, again)); !p.Default || p.Digest != testDigest('f') {
		t.Fatalf("published again %+v", p)
	}
}

func TestPlatformPublishRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	for name, mutate := range map[string]func(*PlatformPublishArgs){
		"id":      func(a *PlatformPublishArgs) { a.PlatformID = "sha256-../x" },
		"series":  func(a *PlatformPublishArgs) { a.KernelSeries = "6.2" },
		"kernel":  func(a *PlatformPublishArgs) { a.KernelVersion, a.KernelSeries = "6.1/../x", "6.1" },
		"agent":   func(a *PlatformPublishArgs) { a.AgentSHA256 = "x" },
		"release": func(a *PlatformPublishArgs) { a.AgentRelease = "1.0 beta" },
		"digest":  func(a *PlatformPublishArgs) { a.Digest = "sha256:zz" },
		"size":    func(a *PlatformPublishArgs) { a.SizeBytes = 0 },
		"node":    func(a *PlatformPublishArgs) { a.NodeID = "a/b" },
	} {
		a := platformArgs('a', "6.1.0-28-cloud-amd64")
		mutate(&a)
		if err := h.fail(api.CodeInvalidArgument, OpPlatformPublish, a); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if len(h.platforms()) != 0 {
		t.Fatal("a refused publish left an entry")
	}
	if OpLevel(OpPlatformPublish) != LevelArtifacts || OpLevel(OpPlatformWithdraw) != LevelArtifacts {
		t.Fatal("the Platform catalog ops are not at LevelArtifacts")
	}
}

// The default of a series cannot be withdrawn, nor a Platform a running
// Workspace's Instance uses (the refusal names it); a stopped one's can.
func TestPlatformWithdraw(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	h.ok(OpPlatformPublish, platformArgs('a', "6.1.0-28-cloud-amd64"))
	h.ok(OpPlatformPublish, platformArgs('b', "6.1.0-30-cloud-amd64"))
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('a')})
	err := h.fail(api.CodeFailedPrecondition, OpPlatformWithdraw, ObjectArgs{Name: platformID('a')})
	if !strings.Contains(err.Message, "is the default of kernel series 6.1 and cannot be withdrawn") {
		t.Fatalf("withdraw of the default: %v", err)
	}
	w := h.create("c1", smallWS)
	if got := h.taskPlatforms(w.WorkspaceID); len(got) != 1 || got[0] != platformID('a') {
		t.Fatalf("start offers %v, want the 6.1 default", got)
	}
	h.advance(time.Second)
	res := h.resultArgs(w.WorkspaceID, OutcomeOK, "")
	res.Platform = platformID('a')
	h.ok(OpWorkspaceResult, res)
	if got := h.ws(w.WorkspaceID).Platform; got != platformID('a') {
		t.Fatalf("workspace records platform %q", got)
	}
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('b')})
	err = h.fail(api.CodeFailedPrecondition, OpPlatformWithdraw, ObjectArgs{Name: platformID('a')})
	if !strings.Contains(err.Message, "platform "+platformID('a')+" is used by workspaces "+w.WorkspaceID) {
		t.Fatalf("withdraw of a Platform in use: %v", err)
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.ok(OpPlatformWithdraw, ObjectArgs{Name: platformID('a')})
	if got := h.platforms(); len(got) != 1 {
		t.Fatalf("catalog after the withdrawal: %+v", got)
	}
	h.fail(api.CodeNotFound, OpPlatformWithdraw, ObjectArgs{Name: platformID('a')})
	bad := WorkspaceResultArgs{NodeID: "node-a", SessionID: sessOf("node-a"), WorkspaceID: w.WorkspaceID, CommandID: "c9", Outcome: OutcomeOK, Platform: "sha256-../../etc"}
	h.fail(api.CodeInvalidArgument, OpWorkspaceResult, bad)
}

// A start offers the default of the series the Workspace last ran first,
// then the other defaults, most recently approved first; nothing while no
// Platform is approved (the node starts on its own).
func TestTaskPlatformsOrder(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.create("c1", smallWS)
	h.ok(OpPlatformPublish, platformArgs('a', "6.1.0-28-cloud-amd64"))
	if got := h.taskPlatforms(w.WorkspaceID); len(got) != 0 {
		t.Fatalf("unapproved Platforms offered: %v", got)
	}
	h.ok(OpPlatformPublish, platformArgs('c', "6.12.9-cloud-amd64"))
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('a')})
	h.ok(OpPlatformApprove, ObjectArgs{Name: platformID('c')})
	if got := h.taskPlatforms(w.WorkspaceID); strings.Join(got, ",") != platformID('c')+","+platformID('a') {
		t.Fatalf("fresh Workspace offered %v, want the latest approval first", got)
	}
	res := h.resultArgs(w.WorkspaceID, OutcomeOK, "")
	res.Platform = platformID('a')
	h.ok(OpWorkspaceResult, res)
	if got := h.taskPlatforms(w.WorkspaceID); strings.Join(got, ",") != platformID('a')+","+platformID('c') {
		t.Fatalf("Workspace that ran 6.1 offered %v, want its series first", got)
	}
}
