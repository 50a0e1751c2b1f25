package e2e

// Issue 16's first slice on two hosts: a template built on node-a only is
// published to the artifact store (a directory both reach), and a
// Workspace of it starts on node-b, which fetches the image by digest
// first. One VM boot.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/vmm/template"
)

func TestTemplateFetchedFromArtifactStore(t *testing.T) {
	l, a, b, root := mhTwoHosts(t)
	built := mhBuildArtifacts(t, root, l.bin)
	shared, store := filepath.Join(root, "shared"), filepath.Join(root, "store")
	for _, d := range []string{shared, store} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	config := func(h *host) string {
		p := mhWriteConfig(t, h, shared)
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "\n[artifacts]\nurl = %q\n", "file://"+store)
		return p
	}

	if r := a.kibotos("init", "--data-dir", a.dataDir, "--advertise", a.addr(), "--node-id", a.nodeID, "--roles", a.roles); r.code != 0 {
		t.Fatal(r)
	}
	mhInstallArtifacts(t, built, a)
	mhStartServe(a, config(a))
	(&cluster{lab: l}).waitFollowsLeader(t, a)
	grant := mhMust(t, a, cliTimeout, "enrollment", "grant", b.nodeID, "--roles", b.roles)
	if r := b.kibotos("join", "--data-dir", b.dataDir, "--advertise", b.addr(), "--grant", strings.TrimSpace(grant.stdout), a.addr()); r.code != 0 {
		t.Fatal(r)
	}
	// node-b gets the Platform, not the templates.
	mhInstallArtifacts(t, built, b)
	if err := os.RemoveAll(template.Dir(datadir.Dir(b.dataDir).StorageRoot())); err != nil {
		t.Fatal(err)
	}
	mhStartServe(b, config(b))
	for _, h := range l.hosts {
		mhWaitNode(t, a, h.nodeID, 30*time.Second, "ready for Workspaces", mhReadyForWorkspaces)
	}
	admin := a
	mhMust(t, admin, cliTimeout, "storage-pool", "set-capacity", "shared", "100GiB")
	name := template.DefaultName

	mhExpectExit(t, admin, api.ExitFailedPrecondition, "a start on node-b before the template is published",
		"workspace", "create", "--template", name, "--node", "node-b", "--cpu", "1", "--memory", "256MiB")
	t0 := time.Now()
	pub := mhMust(t, admin, 5*time.Minute, "template", "publish", name)
	if !strings.Contains(pub.stdout, "template "+name+" published from node node-a: sha256:") {
		t.Fatalf("publish: %s", pub)
	}
	t.Logf("published in %s: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(pub.stdout))

	t1 := time.Now()
	var ws api.Workspace
	if err := decodeResult(mhMust(t, admin, 5*time.Minute, "workspace", "create", "--template", name, "--node", "node-b", "--cpu", "1", "--memory", "256MiB", "--json"), &ws); err != nil {
		t.Fatal(err)
	}
	ws = mhWaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceAvailable, 5*time.Minute)
	t.Logf("workspace on node-b AVAILABLE %s after the create (fetch and boot)", time.Since(t1).Round(time.Millisecond))
	if out := mhMust(t, admin, 60*time.Second, "workspace", "exec", ws.WorkspaceID, "--", "echo", "fetched-and-booted").stdout; !strings.Contains(out, "fetched-and-booted") {
		t.Fatalf("exec: %q", out)
	}
	log, _ := os.ReadFile(filepath.Join(l.dir, "logs", "node-b-serve-1.log"))
	for _, line := range []string{"template fetch started", "template fetched"} {
		if !strings.Contains(string(log), line) {
			t.Errorf("node-b's log lacks %q", line)
		}
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "template fetched") {
			t.Logf("node-b: %s", line)
		}
	}
	waitFor(t, 30*time.Second, "node-b listed as holding "+name, func() (bool, string) {
		r := admin.kibo("template", "list", "--consistent")
		return strings.Contains(r.stdout, "node-a,node-b"), r.stdout
	})
	mhExpectExit(t, admin, api.ExitFailedPrecondition, "delete of a template a Workspace uses", "template", "delete", name)
}
