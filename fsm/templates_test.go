package fsm

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func testDigest(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

func publishArgs(name string, c byte) TemplatePublishArgs {
	return TemplatePublishArgs{TemplateImage: api.TemplateImage{Name: name, TemplateID: "sha256-" + strings.Repeat("e", 64), Digest: testDigest(c), SizeBytes: 1 << 30, ImageFormat: api.ImageFormatExt4}, NodeID: "node-a"}
}

func (h *harness) catalog() []api.CatalogTemplate {
	h.t.Helper()
	var l *api.CatalogTemplateList
	if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListCatalogTemplates(tx, 0, ""); return }); err != nil {
		h.t.Fatal(err)
	}
	return l.Templates
}

// A publish records the entry with the entry's time and the publishing
// node; the same digest again changes nothing, a new one replaces it and
// bumps the version; the nodes that report the digest are its holders.
func TestTemplatePublish(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	published := h.now
	v := decode[api.CatalogTemplate](t, h.ok(OpTemplatePublish, publishArgs("kibotos-coding", 'a')))
	if v.Version != 1 || v.PublishedBy != "node-a" || !v.PublishedAt.Equal(published) || v.Digest != testDigest('a') || len(v.Nodes) != 0 {
		t.Fatalf("published %+v", v)
	}
	h.report("node-a", "s1", api.Report{TemplateDigests: []string{testDigest('a')}})
	if got := h.catalog(); len(got) != 1 || len(got[0].Nodes) != 1 || got[0].Nodes[0] != "node-a" {
		t.Fatalf("catalog after the report %+v", got)
	}
	h.advance(time.Minute)
	h.expectUnchanged(h.entry(OpTemplatePublish, publishArgs("kibotos-coding", 'a')))
	v = decode[api.CatalogTemplate](t, h.ok(OpTemplatePublish, publishArgs("kibotos-coding", 'b')))
	if v.Version != 2 || !v.PublishedAt.Equal(h.now) || len(v.Nodes) != 0 {
		t.Fatalf("republished %+v", v)
	}
	h.fail(api.CodeVersionMismatch, OpTemplatePublish, publishArgs("kibotos-coding", 'c'), withVersion(1))
}

func TestTemplatePublishRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	for name, mutate := range map[string]func(*TemplatePublishArgs){
		"name":         func(a *TemplatePublishArgs) { a.Name = "../etc" },
		"digest":       func(a *TemplatePublishArgs) { a.Digest = "sha256:" + strings.Repeat("A", 64) },
		"build id":     func(a *TemplatePublishArgs) { a.TemplateID = "sha256-x" },
		"size":         func(a *TemplatePublishArgs) { a.SizeBytes = 0 },
		"huge":         func(a *TemplatePublishArgs) { a.SizeBytes = 1<<40 + 1 },
		"format":       func(a *TemplatePublishArgs) { a.ImageFormat = "qcow2" },
		"node":         func(a *TemplatePublishArgs) { a.NodeID = "a/b" },
		"no such node": func(a *TemplatePublishArgs) { a.NodeID = "node-z" },
	} {
		a := publishArgs("kibotos-coding", 'a')
		mutate(&a)
		code := api.CodeInvalidArgument
		if name == "no such node" {
			code = api.CodeNotFound
		}
		h.fail(code, OpTemplatePublish, a)
	}
	h.fail(api.CodeInvalidArgument, OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Report: api.Report{TemplateDigests: []string{"sha256:../../x"}}})
}

// A report's warm guests are stored as the node says them, within bounds;
// out of them the report changes nothing.
func TestReportWarm(t *testing.T) {
	h := newHarness(t)
	readyNode(h)
	if LevelWarm > FeatureLevel {
		t.Fatalf("LevelWarm %d above this build's level %d", LevelWarm, FeatureLevel)
	}
	w := api.WarmGuests{Template: "kibotos-coding", Wanted: 2, Ready: 1, CPU: 1000, MemoryBytes: 512 << 20, Starts: 7}
	h.report("node-a", "s1", api.Report{Warm: []api.WarmGuests{w}})
	n := h.node("node-a")
	if n.Report == nil || len(n.Report.Warm) != 1 || n.Report.Warm[0] != w {
		t.Fatalf("stored report %+v", n.Report)
	}
	many := make([]api.WarmGuests, api.MaxWarmTemplates+1)
	for i := range many {
		many[i] = api.WarmGuests{Template: fmt.Sprintf("t%d", i)}
	}
	for name, bad := range map[string][]api.WarmGuests{
		"name":      {{Template: "../x"}},
		"wanted":    {{Template: "a", Wanted: api.MaxWarmGuests + 1}},
		"ready":     {{Template: "a", Ready: -1}},
		"error":     {{Template: "a", Error: strings.Repeat("x", 1025)}},
		"templates": many,
	} {
		if err := h.fail(api.CodeInvalidArgument, OpNodeReport, ReportArgs{NodeID: "node-a", SessionID: "s1", Report: api.Report{Warm: bad}}); !strings.Contains(err.Message, "report of node node-a") {
			t.Errorf("%s: %s", name, err.Message)
		}
	}
	if n := h.node("node-a"); len(n.Report.Warm) != 1 || n.Report.Warm[0] != w {
		t.Errorf("after refused reports: %+v", n.Report.Warm)
	}
}

func TestTemplatePublishLevel(t *testing.T) {
	if OpLevel(OpTemplatePublish) != LevelArtifacts || LevelArtifacts > FeatureLevel {
		t.Fatalf("OpTemplatePublish at level %d, build at %d", OpLevel(OpTemplatePublish), FeatureLevel)
	}
}

// A published template starts on a node without it (which fetches it,
// its layer charged the image's size) when no holder can take it, and
// on a holder when one can, even the busier one.
func TestPublishedTemplatePlacement(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	only := func(id string, templates []string, sizes map[string]uint64, cpu api.Milli) {
		h.report(id, sessOf(id), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Allocated: api.Resources{CPU: cpu}, Pools: defaultPoolAvailable, Templates: templates, TemplateBytes: sizes})
	}
	only("node-a", []string{"kibotos-base"}, nil, 0)
	only("node-b", []string{"kibotos-base", "solo"}, map[string]uint64{"solo": 3 * gib}, 2000)
	solo := smallWS
	solo.Template = "solo"
	solo.NodeID = "node-a"
	h.fail(api.CodeFailedPrecondition, OpWorkspaceCreate, solo, withCommand("c0"))

	pub := publishArgs("solo", 'a')
	pub.NodeID, pub.SizeBytes = "node-b", 2<<30
	h.ok(OpTemplatePublish, pub)
	solo.NodeID = ""
	if w := h.create("c1", solo); w.NodeID != "node-b" {
		t.Fatalf("solo placed on %s, want node-b, which holds it, though busier", w.NodeID)
	}
	h.ok(OpNodeDrain, NodeArgs{NodeID: "node-b"})
	w := h.create("c2", solo)
	if w.NodeID != "node-a" || w.Layer == nil || w.Layer.SizeBytes != 2*gib {
		t.Fatalf("solo with its holder drained: node %s, layer %+v; want node-a fetching it, charged the image's 2 GiB", w.NodeID, w.Layer)
	}
}

// A catalog entry goes only when no Workspace references its template:
// the refusal names them; --expected-version applies.
func TestTemplateDelete(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	pub := publishArgs("kibotos-coding", 'a')
	h.ok(OpTemplatePublish, pub)
	w := h.create("c1", smallWS)
	err := h.fail(api.CodeFailedPrecondition, OpTemplateDelete, ObjectArgs{Name: "kibotos-coding"})
	if !strings.Contains(err.Message, "template kibotos-coding is used by workspaces "+w.WorkspaceID+": delete them first") {
		t.Fatalf("delete of a used template: %v", err)
	}
	h.fail(api.CodeNotFound, OpTemplateDelete, ObjectArgs{Name: "nope"})
	h.fail(api.CodeInvalidArgument, OpTemplateDelete, ObjectArgs{Name: "../x"})
	h.ok(OpTemplatePublish, publishArgs("solo", 'b'))
	h.fail(api.CodeVersionMismatch, OpTemplateDelete, ObjectArgs{Name: "solo"}, withVersion(7))
	h.ok(OpTemplateDelete, ObjectArgs{Name: "solo"}, withVersion(1))
	if got := h.catalog(); len(got) != 1 || got[0].Name != "kibotos-coding" {
		t.Fatalf("catalog after the delete: %+v", got)
	}
}

// The list names the templates nodes built and did not publish, with
// their nodes, on its last page; a name a report carries that is not a
// valid template name is not listed.
func TestListNodeTemplates(t *testing.T) {
	h := newHarness(t)
	twoNodes(h)
	h.report("node-b", sessOf("node-b"), api.Report{Capacity: api.Resources{CPU: 4000, MemoryBytes: 8 * gib}, Pools: defaultPoolAvailable,
		Templates: []string{"kibotos-base", "Bad\x1b[31mName", "solo"}})
	var l *api.CatalogTemplateList
	if err := h.f.View(func(tx *bolt.Tx) (err error) { l, err = ListCatalogTemplates(tx, 0, ""); return }); err != nil {
		t.Fatal(err)
	}
	want := []api.NodeTemplate{{Name: "kibotos-base", Nodes: []string{"node-a", "node-b"}}, {Name: "kibotos-coding", Nodes: []string{"node-a"}}, {Name: "solo", Nodes: []string{"node-b"}}}
	if len(l.Templates) != 0 || !reflect.DeepEqual(l.NodeTemplates, want) {
		t.Fatalf("list: catalog %+v, node templates %+v; want %+v", l.Templates, l.NodeTemplates, want)
	}
}
