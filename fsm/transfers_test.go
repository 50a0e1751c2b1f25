package fsm

import (
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

func (h *harness) transfer(id string) *api.Transfer {
	h.t.Helper()
	var tr *api.Transfer
	if err := h.f.View(func(tx *bolt.Tx) (err error) { tr, err = GetTransfer(tx, id); return }); err != nil {
		h.t.Fatal(err)
	}
	return tr
}

// An export takes a STOPPED Workspace that ran: the Transfer is
// EXPORTING on the layer's node and the Workspace neither starts nor is
// deleted until the node's answer; ok makes it READY with the archive's
// digest, and it goes only once it is not exporting.
func TestTransferExport(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	w := h.running("c1", smallWS)
	exp := TransferExportArgs{WorkspaceID: w.WorkspaceID, Namespace: "default"}
	fresh := h.create("c2", smallWS)
	h.fail(api.CodeFailedPrecondition, OpTransferExport, TransferExportArgs{WorkspaceID: fresh.WorkspaceID, Namespace: "default"}, withCommand("x1"))
	// A running one is exported where it runs; it is not stopped (but
	// by --force) or paused meanwhile.
	live := decode[api.Transfer](t, h.ok(OpTransferExport, exp, withCommand("x0")))
	if live.NodeID != w.NodeID {
		t.Fatalf("running export on %s, want %s", live.NodeID, w.NodeID)
	}
	for _, op := range []string{OpWorkspaceStop, OpWorkspacePause} {
		if err := h.fail(api.CodeFailedPrecondition, op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}); !strings.Contains(err.Message, "is being exported") {
			t.Fatalf("%s while exporting: %v", op, err)
		}
	}
	h.ok(OpTransferResult, TransferResultArgs{TransferID: live.TransferID, NodeID: w.NodeID, Outcome: OutcomeFailed, Error: "boom"})
	if got := h.transfer(live.TransferID); got.State != api.TransferFailed || got.Error != "boom" {
		t.Fatalf("failed export %+v", got)
	}
	h.ok(OpWorkspaceStop, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.answer(w.WorkspaceID, OutcomeOK, "")
	h.fail(api.CodeInvalidArgument, OpTransferExport, TransferExportArgs{WorkspaceID: w.WorkspaceID, Namespace: "Bad NS"}, withCommand("x2"))
	h.fail(api.CodeInvalidArgument, OpTransferExport, TransferExportArgs{WorkspaceID: w.WorkspaceID, Namespace: "default", TTLSeconds: 1}, withCommand("x3"))

	tr := decode[api.Transfer](t, h.ok(OpTransferExport, exp, withCommand("x4")))
	if tr.TransferID != TransferIDFor("x4") || tr.State != api.TransferExporting || tr.NodeID != "node-a" || tr.Shape.Template != smallWS.Template || tr.ExpiresAt.Sub(tr.CreatedAt) != api.DefaultTransferTTL {
		t.Fatalf("export %+v", tr)
	}
	if got := h.ws(w.WorkspaceID).Exporting; got != tr.TransferID {
		t.Fatalf("workspace exporting %q", got)
	}
	for _, op := range []string{OpWorkspaceStart, OpWorkspaceDelete} {
		if err := h.fail(api.CodeFailedPrecondition, op, WorkspaceArgs{WorkspaceID: w.WorkspaceID}); !strings.Contains(err.Message, "is being exported (transfer "+tr.TransferID+")") {
			t.Fatalf("%s while exporting: %v", op, err)
		}
	}
	h.fail(api.CodeFailedPrecondition, OpTransferExport, exp, withCommand("x5"))
	h.fail(api.CodeFailedPrecondition, OpTransferDelete, ObjectArgs{Name: tr.TransferID})
	// An answer from another node changes nothing; a bad digest is refused.
	h.ok(OpTransferResult, TransferResultArgs{TransferID: tr.TransferID, NodeID: "node-z", Outcome: OutcomeOK, Digest: testDigest('a'), SizeBytes: 10})
	h.fail(api.CodeInvalidArgument, OpTransferResult, TransferResultArgs{TransferID: tr.TransferID, NodeID: "node-a", Outcome: OutcomeOK, Digest: "sha256:x", SizeBytes: 10})
	if got := h.transfer(tr.TransferID); got.State != api.TransferExporting {
		t.Fatalf("after foreign and bad answers: %+v", got)
	}
	h.ok(OpTransferProgress, TransferProgressArgs{TransferID: tr.TransferID, NodeID: "node-a", TransferProgress: api.TransferProgress{DoneBytes: 5, TotalBytes: 10}})
	if got := h.transfer(tr.TransferID); got.DoneBytes != 5 || got.TotalBytes != 10 {
		t.Fatalf("progress %+v", got)
	}
	h.fail(api.CodeInvalidArgument, OpTransferProgress, TransferProgressArgs{TransferID: tr.TransferID, NodeID: "node-a", TransferProgress: api.TransferProgress{DoneBytes: 11, TotalBytes: 10}})
	tmplID := "sha256-" + strings.Repeat("e", 64)
	h.ok(OpTransferResult, TransferResultArgs{TransferID: tr.TransferID, NodeID: "node-a", Outcome: OutcomeOK, Digest: testDigest('a'), SizeBytes: 10, TemplateID: tmplID})
	got := h.transfer(tr.TransferID)
	if got.State != api.TransferReady || got.Digest != testDigest('a') || got.SizeBytes != 10 || got.Shape.TemplateID != tmplID || h.ws(w.WorkspaceID).Exporting != "" {
		t.Fatalf("ready %+v", got)
	}
	h.ok(OpWorkspaceStart, WorkspaceArgs{WorkspaceID: w.WorkspaceID})
	h.ok(OpTransferDelete, ObjectArgs{Name: tr.TransferID})
	h.fail(api.CodeNotFound, OpTransferDelete, ObjectArgs{Name: tr.TransferID})
}

// An import is a create with the archive: the start task carries it
// until a start succeeds.
func TestWorkspaceImportCreate(t *testing.T) {
	h := newHarness(t)
	oneNode(h)
	a := smallWS
	a.Import = &api.WorkspaceImport{TransferID: TransferIDFor("x"), Key: api.TransferArchiveKey("default", TransferIDFor("x")), Digest: testDigest('a'), SizeBytes: 10}
	w := h.create("c1", a)
	if w.Import == nil || w.Import.Digest != testDigest('a') {
		t.Fatalf("created %+v", w)
	}
	if got := h.answer(w.WorkspaceID, OutcomeOK, ""); got.Import != nil {
		t.Fatalf("import kept after the start: %+v", got.Import)
	}
	bad := smallWS
	bad.Import = &api.WorkspaceImport{TransferID: "tr-x", Digest: testDigest('a'), SizeBytes: 10}
	h.fail(api.CodeInvalidArgument, OpWorkspaceCreate, bad, withCommand("c2"))
}
