package e2e

// The artifact store's S3 path on two hosts, as an operator with an
// on-premises S3 service signed by a private CA runs it: gofakes3 over
// https on an address of the lab's switch (its own machine, as far as
// the hosts can tell), its certificate signed by a CA the test made and
// names in [artifacts] ca_file, its keys in a credentials file. node-a
// publishes the template into the bucket; node-b, which has none, fetches
// it from there to start a Workspace; that Workspace's export goes into
// the bucket and node-a imports it from there. Two VM boots.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/datadir"
	"github.com/kibotos/kibotos/internal/clusterlab"
	"github.com/kibotos/kibotos/internal/s3test"
	"github.com/kibotos/kibotos/vmm/template"
)

// labS3 is the S3 service's address on the lab's switch.
const labS3 = clusterlab.SubnetPrefix + "202"

func TestArtifactStoreS3AcrossHosts(t *testing.T) {
	t0 := time.Now()
	l, a, b, root := mhTwoHosts(t)
	built := mhBuildArtifacts(t, root, l.Bin)
	shared := filepath.Join(root, "shared")
	if err := os.MkdirAll(shared, 0o700); err != nil {
		t.Fatal(err)
	}

	sw := l.Prefix + "-sw"
	l.IP("-n", sw, "addr", "add", labS3+"/24", "dev", "br0")
	s3 := s3test.StartTLS(t, l.ListenIn(sw, labS3+":0"))
	const prefix = "cluster-a/artifacts"
	if !strings.HasPrefix(s3.Endpoint, "https://"+labS3+":") {
		t.Fatalf("S3 endpoint %s, want https on %s", s3.Endpoint, labS3)
	}
	// node-b has the Platform (TestTemplateFetchedFromArtifactStore
	// fetches one) but no template: it comes from the bucket.
	mhArtifactsPair(t, l, a, b, built, shared, fmt.Sprintf("url = %q\nendpoint = %q\ncredentials_file = %q\nca_file = %q\n",
		s3.URL(prefix), s3.Endpoint, s3.CredentialsFile, s3.CAFile), func() {
		clusterlab.InstallArtifacts(t, built, b)
		if err := os.RemoveAll(template.Dir(datadir.Dir(b.DataDir).StorageRoot())); err != nil {
			t.Fatal(err)
		}
	})
	admin := a
	name := template.DefaultName
	t.Logf("cluster of two up in %s", time.Since(t0).Round(time.Millisecond))

	// The busybox template is a 1 GiB image: a multipart upload of
	// several parts, then the server-side copy to its digest's key. Most
	// of this test's time is gofakes3 storing it in memory.
	tPub := time.Now()
	pub := clusterlab.Must(t, admin, 5*time.Minute, "template", "publish", name)
	if !strings.Contains(pub.Stdout, "template "+name+" published from node node-a: sha256:") {
		t.Fatalf("publish: %s", pub)
	}
	t.Logf("published in %s", time.Since(tPub).Round(time.Millisecond))
	var catalog api.CatalogTemplateList
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, clusterlab.CLITimeout, "template", "list", "--json"), &catalog); err != nil || len(catalog.Templates) != 1 {
		t.Fatalf("template list --json: %v %+v", err, catalog)
	}
	pubd := catalog.Templates[0]
	objKey := prefix + "/objects/sha256/" + strings.TrimPrefix(pubd.Digest, "sha256:")
	if size, err := s3.Object(objKey); err != nil || size != pubd.SizeBytes || size == 0 {
		t.Fatalf("published %s (%d bytes): the bucket has %d bytes at %s (%v); under %s:\n%s", pubd.Digest, pubd.SizeBytes, size, objKey, err, prefix, s3.Keys(prefix))
	}

	t1 := time.Now()
	var ws api.Workspace
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, 3*time.Minute, "workspace", "create", "--template", name, "--node", "node-b", "--cpu", "1", "--memory", "256MiB",
		"--new-volume", "64MiB:/data", "--json"), &ws); err != nil {
		t.Fatal(err)
	}
	if ws.State != api.WorkspaceAvailable || ws.NodeID != "node-b" {
		t.Fatalf("created %s, want AVAILABLE on node-b", clusterlab.WorkspaceString(ws))
	}
	t.Logf("workspace on node-b AVAILABLE %s after the create (template fetched from S3, boot)", time.Since(t1).Round(time.Millisecond))
	logB := b.ServeProc()
	for _, line := range []string{"template fetch started", "template fetched"} {
		if !logB.LogContains(line) {
			t.Errorf("node-b's log lacks %q", line)
		}
	}
	if logB.LogContains("template fetch failed") {
		t.Errorf("node-b's log has a failed template fetch:\n%s", clusterlab.Tail(logB.Log, 30))
	}

	// What the Workspace wrote, in its layer and its Volume, exported
	// (stopped) into the bucket and imported on node-a from there.
	sums := func(ws string) string {
		return clusterlab.Must(t, admin, 2*time.Minute, "workspace", "exec", ws, "--", "sh", "-c", "sync; sha256sum /root/written /data/written").Stdout
	}
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "exec", ws.WorkspaceID, "--", "sh", "-c",
		"dd if=/dev/urandom of=/root/written bs=1M count=8 2>/dev/null && dd if=/dev/urandom of=/data/written bs=1M count=8 2>/dev/null")
	want := sums(ws.WorkspaceID)
	clusterlab.Must(t, admin, 2*time.Minute, "workspace", "stop", ws.WorkspaceID)
	t2 := time.Now()
	var tr api.Transfer
	if err := clusterlab.DecodeResult(clusterlab.Must(t, admin, 5*time.Minute, "transfer", "export", ws.WorkspaceID, "--json"), &tr); err != nil {
		t.Fatal(err)
	}
	if tr.State != api.TransferReady || tr.NodeID != "node-b" || len(tr.Shape.Volumes) != 1 || tr.Shape.TemplateID != pubd.TemplateID {
		t.Fatalf("export: %+v", tr)
	}
	t.Logf("exported in %s: %s, %d bytes", time.Since(t2).Round(time.Millisecond), tr.TransferID, tr.SizeBytes)
	archive := prefix + "/named/" + api.TransferArchiveKey("default", tr.TransferID)
	manifest := prefix + "/named/" + api.TransferManifestKey("default", tr.TransferID)
	if size, err := s3.Object(archive); err != nil || size != tr.SizeBytes {
		t.Fatalf("archive of %s (%d bytes): the bucket has %d bytes at %s (%v); under %s:\n%s", tr.TransferID, tr.SizeBytes, size, archive, err, prefix, s3.Keys(prefix))
	}
	if _, err := s3.Object(manifest); err != nil {
		t.Fatalf("manifest of %s not in the bucket at %s: %v", tr.TransferID, manifest, err)
	}
	t3 := time.Now()
	imported := strings.TrimSpace(clusterlab.Must(t, admin, 5*time.Minute, "transfer", "import", tr.TransferID, "--node", "node-a", "-q").Stdout)
	t.Logf("imported on node-a, AVAILABLE in %s: %s", time.Since(t3).Round(time.Millisecond), imported)
	if got := clusterlab.GetWorkspace(t, admin, imported); got.State != api.WorkspaceAvailable || got.NodeID != "node-a" {
		t.Fatalf("imported %s, want AVAILABLE on node-a", clusterlab.WorkspaceString(got))
	}
	if got := sums(imported); got != want {
		t.Fatalf("files after the import:\n%s\nwant\n%s", got, want)
	}

	clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "delete", tr.TransferID)
	for _, key := range []string{archive, manifest} {
		if _, err := s3.Object(key); err == nil {
			t.Errorf("%s still in the bucket after transfer delete", key)
		}
	}
	if out := clusterlab.Must(t, admin, clusterlab.CLITimeout, "transfer", "list", "-q").Stdout; strings.TrimSpace(out) != "" {
		t.Errorf("transfer list -q after the delete: %q", out)
	}
	// Nothing else was left behind: no staging key of an upload, no
	// named object; the template's object stays published.
	if got, want := s3.Keys(prefix+"/"), fmt.Sprintf("%s (%d bytes)\n", objKey, pubd.SizeBytes); got != want {
		t.Errorf("the bucket under %s holds\n%swant\n%s", prefix, got, want)
	}
	for _, id := range []string{imported, ws.WorkspaceID} {
		clusterlab.Must(t, admin, 2*time.Minute, "workspace", "delete", id)
	}
	t.Logf("whole test %s", time.Since(t0).Round(time.Millisecond))
}
