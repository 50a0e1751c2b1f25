package e2e

// Issue 16 on two hosts: a template and a Platform built on node-a only
// are published to the artifact store (a directory both reach), the
// Platform approved, and a Workspace starts on node-b, which fetches both
// by digest first; a damaged object in the store is detected, and
// fetched again once publishing repaired it. One VM boot.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/testenv"
	"github.com/kibotos/kibotos/vmm/platform"
	"github.com/kibotos/kibotos/vmm/template"
)

func TestTemplateFetchedFromArtifactStore(t *testing.T) {
	l, a, b, root := mhTwoHosts(t)
	built := mhBuildArtifacts(t, root, l.Bin)
	shared, store := filepath.Join(root, "shared"), filepath.Join(root, "store")
	for _, d := range []string{shared, store} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// node-b gets neither the Platform nor the templates: both come
	// from the artifact store.
	mhArtifactsPair(t, l, a, b, built, shared, fmt.Sprintf("url = %q\n", "file://"+store), func() {
		for _, dir := range []string{template.Dir(datadir.Dir(b.DataDir).StorageRoot()), platform.InstallationsDir(datadir.Dir(b.DataDir).StorageRoot())} {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}
	})
	admin := a
	name := template.DefaultName

	clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "a start on node-b before the template is published",
		"workspace", "create", "--template", name, "--node", "node-b", "--cpu", "1", "--memory", "256MiB")
	t0 := time.Now()
	pub := clusterlab.Must(t, admin, 5*time.Minute, "template", "publish", name)
	if !strings.Contains(pub.Stdout, "template "+name+" published from node node-a: sha256:") {
		t.Fatalf("publish: %s", pub)
	}
	t.Logf("published in %s: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(pub.Stdout))

	// A flipped byte in the store: node-b's fetch detects it and the
	// start fails naming the object; publishing again repairs the
	// object and the next start fetches it afresh.
	var catalog api.CatalogTemplateList
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "template", "list", "--json"), &catalog); err != nil || len(catalog.Templates) != 1 {
		t.Fatalf("template list --json: %v %+v", err, catalog)
	}
	pubd := catalog.Templates[0]
	obj := filepath.Join(store, "objects", "sha256", strings.TrimPrefix(pubd.Digest, "sha256:"))
	flipByte(t, obj, 1<<20)
	var ws api.Workspace
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, 5*time.Minute, "workspace", "create", "--template", name, "--node", "node-b", "--cpu", "1", "--memory", "256MiB", "--new-volume", "64MiB:/data", "--no-wait", "--json"), &ws); err != nil {
		t.Fatal(err)
	}
	ws = clusterlab.WaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceFailed, 5*time.Minute)
	if ws.Failure == nil || !strings.Contains(ws.Failure.Message, "does not match its digest") || !strings.Contains(ws.Failure.Message, pubd.Digest) {
		t.Fatalf("start from a damaged object: %+v", ws.Failure)
	}
	clusterlab.Must(t, admin, 5*time.Minute, "template", "publish", name)

	// Platforms: none is approved, so node-b, which has none of its own,
	// cannot start; node-a's, published and approved, it fetches.
	if out := clusterlab.Must(t, admin, clusterlab.CLITimeout, "platform", "list").Stdout; strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("platform list before a publish:\n%s", out)
	}
	clusterlab.ExpectExit(t, admin, api.ExitInvalidArgument, "platform publish without --from-node in a cluster of two", "platform", "publish")
	id := strings.TrimSpace(clusterlab.Must(t, admin, 5*time.Minute, "platform", "publish", "--from-node", "node-a").Stdout)
	if err := api.ValidPlatformID(id); err != nil {
		t.Fatalf("platform publish printed %q", id)
	}
	row := func() []string {
		for _, line := range strings.Split(clusterlab.Must(t, admin, clusterlab.CLITimeout, "platform", "list").Stdout, "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[0] == id {
				return f[:4]
			}
		}
		t.Fatalf("platform list lacks %s", id)
		return nil
	}
	if got := strings.Join(row(), " "); !strings.HasSuffix(got, " no no") {
		t.Fatalf("published, not approved: %q", got)
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "platform", "approve", id)
	if got := row(); got[2] != "yes" || got[3] != "yes" || !strings.Contains(got[1], ".") {
		t.Fatalf("approved: %q, want ID, KERNEL SERIES, APPROVED yes, DEFAULT yes", got)
	}
	clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "withdraw of a series' default", "platform", "withdraw", id)

	t1 := time.Now()
	clusterlab.Must(t, admin, 5*time.Minute, "workspace", "start", ws.WorkspaceID, "--node", "node-b")
	ws = clusterlab.WaitWorkspace(t, admin, ws.WorkspaceID, api.WorkspaceAvailable, 5*time.Minute)
	fetchStart := time.Since(t1)
	t.Logf("workspace on node-b AVAILABLE %s after the start (template and Platform fetched, boot)", fetchStart.Round(time.Millisecond))
	if ws.Platform != id {
		t.Errorf("workspace records Platform %q, want %s", ws.Platform, id)
	}
	if out := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", ws.WorkspaceID, "--", "echo", "fetched-and-booted").Stdout; !strings.Contains(out, "fetched-and-booted") {
		t.Fatalf("exec: %q", out)
	}
	log, _ := os.ReadFile(filepath.Join(l.Dir, "logs", "node-b-serve-1.log"))
	for _, line := range []string{"template fetch started", "template fetched", "template fetch failed", "platform fetch started", "platform fetched"} {
		if !strings.Contains(string(log), line) {
			t.Errorf("node-b's log lacks %q", line)
		}
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "template fetched") || strings.Contains(line, "platform fetched") {
			t.Logf("node-b: %s", line)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "node-b listed as holding "+name, func() (bool, string) {
		r := admin.Kibo("template", "list", "--consistent")
		return strings.Contains(r.Stdout, "node-a,node-b"), r.Stdout
	})
	clusterlab.ExpectExit(t, admin, api.ExitFailedPrecondition, "delete of a template a Workspace uses", "template", "delete", name)

	// A Transfer: what the Workspace wrote, in its layer and its Volume,
	// exported from node-b and imported as a new Workspace on node-a.
	sums := func(ws string) string {
		return clusterlab.Must(t, admin, 2*time.Minute, "workspace", "exec", ws, "--", "sh", "-c", "sync; sha256sum /root/written /data/written").Stdout
	}
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "exec", ws.WorkspaceID, "--", "sh", "-c",
		"dd if=/dev/urandom of=/root/written bs=1M count=8 2>/dev/null && dd if=/dev/urandom of=/data/written bs=1M count=8 2>/dev/null")
	want := sums(ws.WorkspaceID)
	// Exported while it runs: node-b pauses the guest while it copies.
	t2 := time.Now()
	var tr api.Transfer
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, 5*time.Minute, "transfer", "export", ws.WorkspaceID, "--json"), &tr); err != nil {
		t.Fatal(err)
	}
	if tr.State != api.TransferReady || tr.NodeID != "node-b" || len(tr.Shape.Volumes) != 1 || tr.Shape.TemplateID != pubd.TemplateID {
		t.Fatalf("export: %+v", tr)
	}
	t.Logf("exported in %s: %s, %d bytes", time.Since(t2).Round(time.Millisecond), tr.TransferID, tr.SizeBytes)
	paused := ""
	logB, _ := os.ReadFile(filepath.Join(l.Dir, "logs", "node-b-serve-1.log"))
	for _, line := range strings.Split(string(logB), "\n") {
		if strings.Contains(line, "instance paused to copy its disks") {
			paused = line
		}
	}
	if paused == "" {
		t.Fatal("node-b's log does not say it paused the guest to copy its disks")
	}
	t.Logf("node-b: %s", paused)
	archive := filepath.Join(store, "named", api.TransferArchiveKey("default", tr.TransferID))
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("archive not in the store: %v", err)
	}
	if out := clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "list", "-q").Stdout; strings.TrimSpace(out) != tr.TransferID {
		t.Fatalf("transfer list -q: %q", out)
	}
	t3 := time.Now()
	imported := strings.TrimSpace(clusterlab.Must(t, admin, 5*time.Minute, "transfer", "import", tr.TransferID, "--node", "node-a", "-q").Stdout)
	t.Logf("imported on node-a, AVAILABLE in %s: %s", time.Since(t3).Round(time.Millisecond), imported)
	if got := sums(imported); got != want {
		t.Fatalf("files after the import:\n%s\nwant\n%s", got, want)
	}
	if out := clusterlab.Must(t, admin, 60*time.Second, "workspace", "exec", ws.WorkspaceID, "--", "echo", "still-running").Stdout; !strings.Contains(out, "still-running") {
		t.Fatalf("the exported Workspace after its export: %q", out)
	}
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "delete", imported)
	// A store that refuses the removal (read-only here): the Transfer
	// stays listed and ctrl's log says so (upgrade seed).
	named := filepath.Join(store, "named")
	if out, err := exec.Command("mount", "--bind", "-o", "ro", named, named).CombinedOutput(); err != nil {
		t.Fatalf("read-only bind mount of the store: %v %s", err, out)
	}
	mounted := true
	unmount := func() {
		if mounted {
			exec.Command("umount", named).Run()
			mounted = false
		}
	}
	t.Cleanup(unmount)
	clusterlab.ExpectExit(t, admin, api.ExitUnavailable, "transfer delete with a read-only store", "transfer", "delete", tr.TransferID)
	unmount()
	if out := clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "list", "-q").Stdout; strings.TrimSpace(out) != tr.TransferID {
		t.Fatalf("transfer list -q after a refused delete: %q", out)
	}
	if log, _ := os.ReadFile(filepath.Join(l.Dir, "logs", "node-a-serve-1.log")); !strings.Contains(string(log), "transfer archive cleanup did not finish") {
		t.Errorf("ctrl's log lacks %q", "transfer archive cleanup did not finish")
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "delete", tr.TransferID)
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatalf("archive after transfer delete: %v", err)
	}
	// Measured beside the first start (bench/artifacts.sh reads these
	// lines): a start on node-b now that it holds both.
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "stop", ws.WorkspaceID)
	t4 := time.Now()
	clusterlab.Must(t, admin, 5*time.Minute, "workspace", "start", ws.WorkspaceID, "--node", "node-b")
	heldStart := time.Since(t4)
	t.Logf("bench: first start on node-b fetching template and Platform %.3f s; start on node-b holding them %.3f s", fetchStart.Seconds(), heldStart.Seconds())
	// A stopped one is exported from its files as they are.
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "stop", ws.WorkspaceID)
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, 5*time.Minute, "transfer", "export", ws.WorkspaceID, "--json"), &tr); err != nil || tr.State != api.TransferReady {
		t.Fatalf("export of the stopped Workspace: %v %+v", err, tr)
	}
	clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "delete", tr.TransferID)
}

// mhArtifactsPair makes node-a the first voter and joins node-b, the
// lines artifacts in the [artifacts] section of both; between node-b's
// join and its start, prepareB sets what node-b holds (built holds the
// Platform and templates). Both are then ready for Workspaces and the
// shared pool has its capacity.
func mhArtifactsPair(t *testing.T, l *clusterlab.Lab, a, b *clusterlab.Host, built, shared, artifacts string, prepareB func()) {
	t.Helper()
	config := func(h *clusterlab.Host) string {
		p := clusterlab.WriteConfig(t, h, shared)
		f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "\n[artifacts]\n%s", artifacts); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if r := a.Kibotos("init", "--data-dir", a.DataDir, "--advertise", a.Addr(), "--node-id", a.NodeID, "--roles", a.Roles); r.Code != 0 {
		t.Fatal(r)
	}
	clusterlab.InstallArtifacts(t, built, a)
	clusterlab.StartServeConfig(a, config(a))
	(&clusterlab.Cluster{Lab: l}).WaitFollowsLeader(t, a)
	grant := clusterlab.Must(t, a, clusterlab.CLITimeout, "enrollment", "grant", b.NodeID, "--roles", b.Roles)
	if r := b.Kibotos("join", "--data-dir", b.DataDir, "--advertise", b.Addr(), "--grant", strings.TrimSpace(grant.Stdout), a.Addr()); r.Code != 0 {
		t.Fatal(r)
	}
	prepareB()
	clusterlab.StartServeConfig(b, config(b))
	for _, h := range l.Hosts {
		clusterlab.WaitNodeReport(t, a, h.NodeID, 30*time.Second, "ready for Workspaces", clusterlab.ReadyForWorkspaces)
	}
	clusterlab.Must(t, a, clusterlab.CLITimeout, "storage-pool", "set-capacity", "shared", "100GiB")
}

// flipByte inverts the byte at off of the file at path.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
