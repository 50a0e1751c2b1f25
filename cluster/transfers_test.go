package cluster_test

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/cluster/clustertest"
)

// An import of a Transfer this cluster has no record of reads the
// manifest another cluster left in the shared store, in the namespace
// given: the new Workspace has the Transfer's shape, new Volumes of its
// sizes and the archive to unpack. An unknown Transfer, a manifest this
// build does not read and a template the cluster lacks are refused,
// naming what is wrong.
func TestImportFromAnotherCluster(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "store")
	c := clustertest.New(t, clustertest.Options{Ctrl: 1, Artifacts: store,
		AdjustReport: func(_ string, r *api.Report) { r.Templates = append(r.Templates, "solo") }})
	m := c.WaitLeader()
	cl := c.Client(m)
	ctx := context.Background()
	s, err := artifacts.NewDir(store, "other-cluster")
	if err != nil {
		t.Fatal(err)
	}
	put := func(ns string, man api.TransferManifest) {
		raw, _ := json.Marshal(man)
		if _, err := s.PutNamed(ctx, api.TransferManifestKey(ns, man.TransferID), strings.NewReader(string(raw))); err != nil {
			t.Fatal(err)
		}
	}
	id := "tr-" + strings.Repeat("k", 26)
	shape := api.TransferShape{Template: "solo", TemplateID: "sha256-" + strings.Repeat("e", 64), CPU: 1000, MemoryBytes: 256 << 20,
		Volumes: []api.TransferVolume{{Path: "/data", SizeBytes: 64 << 20}}}
	put("team-b", api.TransferManifest{FormatVersion: api.TransferFormat, TransferID: id, Shape: shape, Digest: "sha256:" + strings.Repeat("a", 64), SizeBytes: 1 << 20})

	var ws api.Workspace
	if _, err := cl.Do(ctx, "POST", "/v1/transfers/"+id+"/import", api.TransferImportRequest{WriteMeta: api.WriteMeta{CommandID: "import-1"}, Namespace: "team-b"}, &ws); err != nil {
		t.Fatal(err)
	}
	if ws.Import == nil || ws.Import.Key != api.TransferArchiveKey("team-b", id) || ws.Import.TemplateID != shape.TemplateID || ws.Template != "solo" || len(ws.Volumes) != 1 || ws.Volumes[0].Path != "/data" {
		t.Fatalf("imported workspace %+v (import %+v)", ws, ws.Import)
	}

	refused := func(id, ns string, code api.Code, want string) {
		t.Helper()
		_, err := cl.Do(ctx, "POST", "/v1/transfers/"+id+"/import", api.TransferImportRequest{WriteMeta: api.WriteMeta{CommandID: "import-" + id}, Namespace: ns}, nil)
		if api.CodeOf(err) != code || !strings.Contains(err.Error(), want) {
			t.Errorf("import of %s in %s: %v, want %s with %q", id, ns, err, code, want)
		}
	}
	refused(id, "default", api.CodeNotFound, "is neither in this cluster nor in namespace default")
	refused("tr-x", "team-b", api.CodeInvalidArgument, "is not a Transfer id")
	other := "tr-" + strings.Repeat("m", 26)
	lacking := shape
	lacking.Template = "other"
	put("team-b", api.TransferManifest{FormatVersion: api.TransferFormat, TransferID: other, Shape: lacking, Digest: "sha256:" + strings.Repeat("a", 64), SizeBytes: 1 << 20})
	refused(other, "team-b", api.CodeFailedPrecondition, "needs template other (build "+shape.TemplateID+"), which this cluster lacks")
	// The catalog, Transfer, progress and gc routes are operators' only: a member's
	// own certificate is refused on each.
	pid := "sha256-" + strings.Repeat("e", 64)
	for _, r := range [][2]string{{"GET", "/v1/transfers"}, {"POST", "/v1/transfers"}, {"POST", "/v1/transfers/" + id + "/import"},
		{"POST", "/v1/transfers/" + id + "/delete"}, {"GET", "/v1/platforms"}, {"POST", "/v1/platforms/publish"},
		{"POST", "/v1/platforms/" + pid + "/approve"}, {"POST", "/v1/platforms/" + pid + "/withdraw"},
		{"POST", "/v1/artifacts/gc"}, {"GET", "/v1/templates/x/publish-progress"}, {"GET", "/v1/platforms/publish-progress"}} {
		if status, e := rawCall(t, m, memberCert(t, m), m.Addr, r[0], r[1], struct{}{}, nil); status != http.StatusForbidden || e == nil || e.Code != api.CodePermissionDenied {
			t.Errorf("member certificate on %s %s: %d %v, want 403 permission_denied", r[0], r[1], status, e)
		}
	}
	// A manifest with the Workspace's environment (format 2) gives it to
	// the new Workspace, which shows its names.
	withEnv := "tr-" + strings.Repeat("p", 26)
	put("team-b", api.TransferManifest{FormatVersion: api.TransferFormatEnv, TransferID: withEnv, Shape: shape, Env: []string{"TOKEN=s3cret"},
		Digest: "sha256:" + strings.Repeat("a", 64), SizeBytes: 1 << 20})
	if _, err := cl.Do(ctx, "POST", "/v1/transfers/"+withEnv+"/import", api.TransferImportRequest{WriteMeta: api.WriteMeta{CommandID: "import-env"}, Namespace: "team-b"}, &ws); err != nil {
		t.Fatal(err)
	}
	if strings.Join(ws.EnvNames, ",") != "TOKEN" {
		t.Errorf("imported workspace's environment names %q, want TOKEN", ws.EnvNames)
	}
	future := "tr-" + strings.Repeat("n", 26)
	put("team-b", api.TransferManifest{FormatVersion: 9, TransferID: future, Shape: shape})
	refused(future, "team-b", api.CodeFailedPrecondition, "is not one this build reads (format 9)")
}
