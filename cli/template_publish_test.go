package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/cluster/clustertest"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/template"
)

// buildOn builds template name on member m (its storage root) and has the
// node report it.
func buildOn(t *testing.T, m *clustertest.Member, name string) *template.Template {
	t.Helper()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "motd"), []byte(name+" on "+m.ID+"\n"), 0o644)
	tp, err := template.Build(context.Background(), template.Options{StorageRoot: m.Dir.StorageRoot(), Name: name, FromDir: src, SizeMiB: 8})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// catalogEntry reads one entry of `template list --json`.
func (e *cliEnv) catalogEntry(name string) *api.CatalogTemplate {
	e.t.Helper()
	var body struct {
		Result api.CatalogTemplateList `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("template", "list", "--json", "--consistent")), &body); err != nil {
		e.t.Fatal(err)
	}
	for _, t := range body.Result.Templates {
		if t.Name == name {
			return &t
		}
	}
	return nil
}

// template publish asks the node that built a template (over ctrl's
// internal route when it is another member) to put the image into the
// artifact store, and records it; template list shows the entry and the
// nodes holding a verified copy. Ambiguous, unknown and misdirected
// publishes are refused in one line naming the fix, and change nothing.
func TestTemplatePublishAndCatalog(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	store := t.TempDir()
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 2, Artifacts: store})
	n2, n3 := e.c.Members[1], e.c.Members[2]
	solo := buildOn(t, n3, "solo")
	buildOn(t, n2, "kibotos-coding")
	buildOn(t, n3, "kibotos-coding")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n2.Agent.PushReport()
		n3.Agent.PushReport()
		a, err2 := e.c.Node(e.c.Members[0], "node-2")
		b, err3 := e.c.Node(e.c.Members[0], "node-3")
		return err2 == nil && err3 == nil && len(a.Report.Templates) == 1 && len(b.Report.Templates) == 2, "templates not reported yet"
	})
	// With an empty catalog the list shows what the nodes built, and where.
	if out, errs, code := e.run("template", "list"); code != 0 || errs != "" || !regexp.MustCompile(
		`^NAME +SOURCE +DIGEST +SIZE +PUBLISHED +NODES\nkibotos-coding +node +- +- +- +node-2,node-3\nsolo +node +- +- +- +node-3\n$`).MatchString(out) {
		t.Fatalf("empty catalog: exit %d, %q, stderr %q", code, out, errs)
	}
	var listed struct {
		Result api.CatalogTemplateList `json:"result"`
	}
	if err := json.Unmarshal([]byte(e.mustRun("template", "list", "--json")), &listed); err != nil || len(listed.Result.Templates) != 0 ||
		!reflect.DeepEqual(listed.Result.NodeTemplates, []api.NodeTemplate{{Name: "kibotos-coding", Nodes: []string{"node-2", "node-3"}}, {Name: "solo", Nodes: []string{"node-3"}}}) {
		t.Fatalf("template list --json of node builds: %+v %v", listed.Result, err)
	}

	out := e.mustRun("template", "publish", "solo")
	if !strings.Contains(out, "template solo published from node node-3: sha256:") {
		t.Fatalf("publish: %q", out)
	}
	// The object in the store is node-3's image, byte for byte.
	img, err := os.ReadFile(solo.Image())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(img)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if obj, err := os.ReadFile(filepath.Join(store, "objects", "sha256", hex.EncodeToString(sum[:]))); err != nil || !bytes.Equal(obj, img) {
		t.Fatalf("object in the store: %v", err)
	}
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		c := e.catalogEntry("solo")
		return c != nil && len(c.Nodes) == 1 && c.Nodes[0] == "node-3", "node-3 not listed as holding solo"
	})
	c := e.catalogEntry("solo")
	if c.Digest != digest || c.SizeBytes != int64(len(img)) || c.TemplateID != solo.ID || c.PublishedBy != "node-3" || c.ImageFormat != "ext4" || c.Version != 1 {
		t.Fatalf("catalog entry %+v, want digest %s", c, digest)
	}
	list := e.mustRun("template", "list")
	if !strings.Contains(list, "solo") || !strings.Contains(list, digest[:19]) || !strings.Contains(list, "by node-3") || !strings.Contains(list, "node-3\n") {
		t.Fatalf("list: %q", list)
	}
	// solo is in the catalog now; kibotos-coding is still the nodes' own.
	if q := e.mustRun("template", "list", "-q"); q != "solo\nkibotos-coding\n" {
		t.Fatalf("list -q: %q", q)
	}

	e.expectExit(api.ExitFailedPrecondition, "template kibotos-coding is built on nodes node-2, node-3: say whose build to publish with --from-node NODE", "template", "publish", "kibotos-coding")
	e.expectExit(api.ExitNotFound, "template nope is not built on any node", "template", "publish", "nope")
	e.expectExit(api.ExitFailedPrecondition, "node node-2 does not report template solo", "template", "publish", "solo", "--from-node", "node-2")
	e.expectExit(api.ExitInvalidArgument, "is not a valid name", "template", "publish", "../x")
	if q := e.mustRun("template", "list", "-q"); q != "solo\nkibotos-coding\n" {
		t.Fatalf("refused publishes changed the catalog: %q", q)
	}
	if out := e.mustRun("template", "publish", "kibotos-coding", "--from-node", "node-2"); !strings.Contains(out, "published from node node-2") {
		t.Fatalf("publish --from-node: %q", out)
	}
	// A catalog entry a Workspace uses stays; the refusal names it.
	id := strings.TrimSpace(e.mustRun("workspace", "create", "--template", "solo", "--cpu", "1", "--memory", "256MiB", "-q", "--no-wait"))
	e.expectExit(api.ExitFailedPrecondition, "template solo is used by workspaces "+id+": delete them first", "template", "delete", "solo")
	e.expectExit(api.ExitNotFound, "template nope is not in the catalog", "template", "delete", "nope")
	if out := e.mustRun("template", "delete", "kibotos-coding"); !strings.Contains(out, "template kibotos-coding deleted from the catalog") {
		t.Fatalf("delete: %q", out)
	}
	// Out of the catalog, still built on its nodes.
	if q := e.mustRun("template", "list", "-q"); q != "solo\nkibotos-coding\n" {
		t.Fatalf("catalog after the delete: %q", q)
	}
	if out := e.mustRun("template", "list"); !regexp.MustCompile(`\nkibotos-coding +node +- +- +- +node-2,node-3\n`).MatchString(out) {
		t.Fatalf("list after the delete: %q", out)
	}
	// Local builds are still listed with --local.
	if out := e.mustRun("template", "list", "--local", "--storage-root", n3.Dir.StorageRoot()); !strings.Contains(out, "solo") || !strings.Contains(out, "kibotos-coding") {
		t.Fatalf("list --local: %q", out)
	}
}

// A node without an artifact store refuses to publish and says how to
// configure one.
func TestTemplatePublishWithoutStore(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1})
	buildOn(t, e.c.Members[0], "solo")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		e.c.Members[0].Agent.PushReport()
		n, err := e.c.Node(e.c.Members[0], "node-1")
		return err == nil && len(n.Report.Templates) == 1, "template not reported yet"
	})
	e.expectExit(api.ExitFailedPrecondition, "this node has no artifact store: set [artifacts] url", "template", "publish", "solo")
}

// During a rolling upgrade (a voter below level 5) a publish is refused
// before anything is uploaded.
func TestTemplatePublishNeedsLevel(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	store := t.TempDir()
	e := newCLIEnv(t, clustertest.Options{Ctrl: 2, Artifacts: store, FeatureLevels: map[string]int{"node-2": 4}})
	buildOn(t, e.c.Members[0], "solo")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		e.c.Members[0].Agent.PushReport()
		n, err := e.c.Node(e.c.Members[0], "node-1")
		return err == nil && len(n.Report.Templates) == 1, "template not reported yet"
	})
	e.expectExit(api.ExitFailedPrecondition, "template publish needs every ctrl voter at feature level 5", "template", "publish", "solo")
	if entries, _ := os.ReadDir(store); len(entries) != 0 {
		t.Fatalf("a refused publish wrote %v into the store", entries)
	}
}

// A published template is placed on the node that holds it, and when
// that node cannot take it, on one that lacks it, whose start task
// carries the catalog entry to fetch the image by.
func TestPublishedTemplatePlacedAndCarried(t *testing.T) {
	testenv.LookPath(t, "mkfs.ext4", "e2fsprogs")
	var mu sync.Mutex
	tasks := map[string]api.WorkspaceTask{} // by node
	e := newCLIEnv(t, clustertest.Options{Ctrl: 1, NodeOnly: 1, Artifacts: t.TempDir(), HoldTask: func(node string, task api.WorkspaceTask) bool {
		mu.Lock()
		defer mu.Unlock()
		tasks[node] = task
		return true
	}})
	n1 := e.c.Members[0]
	buildOn(t, n1, "solo")
	clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
		n1.Agent.PushReport()
		n, err := e.c.Node(n1, "node-1")
		return err == nil && len(n.Report.Templates) == 1, "template not reported yet"
	})
	e.expectExit(api.ExitFailedPrecondition, "node node-2 cannot take this Workspace: the template is not built there", "workspace", "create", "--template", "solo", "--node", "node-2", "--no-wait")
	e.mustRun("template", "publish", "solo")
	pub := e.catalogEntry("solo")
	taskOn := func(node string) api.WorkspaceTask {
		var task api.WorkspaceTask
		clustertest.WaitFor(t, 15*time.Second, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			task = tasks[node]
			return task.Template == "solo", "no start task on " + node
		})
		return task
	}
	e.mustRun("workspace", "create", "--template", "solo", "--no-wait")
	if task := taskOn("node-1"); task.Published == nil || task.Published.Digest != pub.Digest {
		t.Fatalf("start task on the holder: %+v", task.Published)
	}
	e.mustRun("node", "drain", "node-1")
	e.mustRun("workspace", "create", "--template", "solo", "--no-wait")
	task := taskOn("node-2")
	if p := task.Published; p == nil || p.Digest != pub.Digest || p.SizeBytes != pub.SizeBytes || p.TemplateID != pub.TemplateID {
		t.Fatalf("start task on node-2, which lacks solo: %+v, want the catalog entry %+v", p, pub.TemplateImage)
	}
}
