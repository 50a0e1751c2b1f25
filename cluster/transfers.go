package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
	"github.com/kibotos/kibotos/artifacts"
	"github.com/kibotos/kibotos/ctrl/placement"
	"github.com/kibotos/kibotos/fsm"
)

// Transfers on ctrl: `transfer export` records the Transfer; the leader's
// transfer driver asks the exporting node to write the archive (an
// internal route, as for template uploads) and records its answer; it
// removes the archives of failed Transfers, and expired Transfers with
// theirs. `transfer delete` removes the archive, then the record: when the
// store refuses, the Transfer stays listed and the log says
// "transfer archive cleanup did not finish" (upgrade seed). `transfer
// import` is a Workspace create whose first start unpacks the archive.

func (s *Server) store() artifacts.Store { return s.cfg.Artifacts }

func (s *Server) needStore(what string) (artifacts.Store, error) {
	st := s.store()
	if st == nil {
		return nil, api.Errorf(api.CodeFailedPrecondition, "%s: this member has no artifact store: set [artifacts] url in the configuration of every member and restart them", what)
	}
	return st, nil
}

// transferRoutes are the operator's calls about Transfers.
func (s *Server) transferRoutes() []route {
	return []route{
		{"GET", "/v1/transfers", operators, atReader, s.handleTransferList},
		{"GET", "/v1/transfers/{name}", operators, atReader, s.handleTransferGet},
		{"POST", "/v1/transfers", operators, atLeader, decoded(s.handleTransferExport)},
		{"POST", "/v1/transfers/{name}/delete", operators, atLeader, decoded(s.handleTransferDelete)},
		{"POST", "/v1/transfers/{name}/import", operators, atLeader, decoded(s.handleTransferImport)},
	}
}

// handleTransferExport is POST /v1/transfers.
func (s *Server) handleTransferExport(r *http.Request, req api.TransferExportRequest) response {
	if req.Namespace == "" {
		req.Namespace = api.DefaultTransferNamespace
	}
	if err := api.ValidTransferNamespace(req.Namespace); err != nil {
		return fail(err)
	}
	if _, err := s.needStore("transfer export of workspace " + req.WorkspaceID); err != nil {
		return fail(err)
	}
	if err := s.levelsReach("transfer export", fsm.LevelArtifacts); err != nil {
		return fail(err)
	}
	res := s.write(r, fsm.OpTransferExport, req.WriteMeta, fsm.TransferExportArgs{WorkspaceID: req.WorkspaceID, Namespace: req.Namespace, TTLSeconds: req.TTLSeconds})
	s.kickTransfers()
	return res
}

func (s *Server) handleTransferList(r *http.Request) response {
	size, token, err := pageParams(r)
	if err != nil {
		return fail(err)
	}
	return s.view(func(tx *bolt.Tx) (any, error) { return fsm.ListTransfers(tx, size, token) })
}

// handleTransferGet answers at once, or as a blocking read (blockingGet).
func (s *Server) handleTransferGet(r *http.Request) response {
	id := r.PathValue("name")
	return s.blockingGet(r,
		func(tx *bolt.Tx) (uint64, error) {
			tr, err := fsm.GetTransfer(tx, id)
			if err != nil {
				return 0, err
			}
			return tr.Version, nil
		},
		func(tx *bolt.Tx) (any, error) { return fsm.GetTransfer(tx, id) })
}

// handleTransferDelete is POST /v1/transfers/{name}/delete: the archive
// goes first, so a Transfer is never unlisted while its archive stays.
func (s *Server) handleTransferDelete(r *http.Request, req api.WriteMeta) response {
	id := r.PathValue("name")
	var tr *api.Transfer
	err := s.fsm.View(func(tx *bolt.Tx) (err error) { tr, err = fsm.GetTransfer(tx, id); return })
	if err == nil && tr.State == api.TransferExporting {
		err = api.Errorf(api.CodeFailedPrecondition, "transfer %s is still EXPORTING on node %s: delete it once it is READY or FAILED", tr.TransferID, tr.NodeID)
	}
	if err == nil {
		err = s.removeArchive(r.Context(), tr)
	}
	if err != nil {
		return fail(err)
	}
	return s.write(r, fsm.OpTransferDelete, req, fsm.ObjectArgs{Name: id})
}

// removeArchive deletes a Transfer's archive and manifest from the store.
func (s *Server) removeArchive(ctx context.Context, tr *api.Transfer) error {
	st, err := s.needStore("transfer " + tr.TransferID)
	if err == nil {
		err = errors.Join(st.DeleteNamed(ctx, tr.ArchiveKey()), st.DeleteNamed(ctx, api.TransferManifestKey(tr.Namespace, tr.TransferID)))
	}
	if err != nil {
		s.log.Warn("transfer archive cleanup did not finish", "transfer_id", tr.TransferID, "key", tr.ArchiveKey(), "err", err)
		return api.Errorf(api.CodeUnavailable, "transfer %s: its archive %s could not be removed from the artifact store (%v): the Transfer stays listed; retry once ctrl can write to the store", tr.TransferID, tr.ArchiveKey(), err)
	}
	return nil
}

// handleTransferImport is POST /v1/transfers/{name}/import: a Workspace
// create from the Transfer's shape whose first start unpacks its archive.
// A Transfer this cluster has no record of is read from its manifest in
// the store (exported by another cluster), in the namespace given.
func (s *Server) handleTransferImport(r *http.Request, req api.TransferImportRequest) response {
	id := r.PathValue("name")
	if err := api.ValidTransferID(id); err != nil {
		return fail(err)
	}
	if req.NodeID != "" {
		if err := fsm.ValidNodeID(req.NodeID); err != nil {
			return fail(err)
		}
	}
	if err := s.levelsReach("transfer import", fsm.LevelArtifacts); err != nil {
		return fail(err)
	}
	m, err := s.importSource(r.Context(), id, req.Namespace)
	if err == nil {
		err = s.fsm.View(func(tx *bolt.Tx) error { return templateAvailable(tx, id, m.Shape) })
	}
	if err != nil {
		return fail(err)
	}
	ns := req.Namespace
	if ns == "" {
		ns = api.DefaultTransferNamespace
	}
	if len(m.Env) > 0 {
		// An older voter would drop it: the Workspace would run without.
		if err := s.levelsReach("transfer import of a Workspace with environment variables", fsm.LevelWorkspaceEnv); err != nil {
			return fail(err)
		}
	}
	args := fsm.WorkspaceCreateArgs{Template: m.Shape.Template, CPU: m.Shape.CPU, MemoryBytes: m.Shape.MemoryBytes, Labels: m.Shape.Labels, NodeID: req.NodeID,
		Import: &api.WorkspaceImport{TransferID: id, Key: m.key, Digest: m.Digest, SizeBytes: m.SizeBytes, TemplateID: m.Shape.TemplateID}, Env: m.Env}
	for _, v := range m.Shape.Volumes {
		args.NewVolumes = append(args.NewVolumes, api.NewVolume{SizeBytes: v.SizeBytes, Path: v.Path})
	}
	return s.write(r, fsm.OpWorkspaceCreate, req.WriteMeta, args)
}

// importManifest is a Transfer's manifest and the key of its archive.
type importManifest struct {
	api.TransferManifest
	key string
}

// importSource is what an import of Transfer id unpacks: this cluster's
// READY Transfer, else the manifest another cluster wrote into the store.
func (s *Server) importSource(ctx context.Context, id, ns string) (*importManifest, error) {
	var tr *api.Transfer
	var env []string
	err := s.fsm.View(func(tx *bolt.Tx) (err error) {
		if tr, err = fsm.GetTransfer(tx, id); err == nil {
			env, err = fsm.TransferEnv(tx, id)
		}
		return
	})
	switch {
	case err == nil && tr.State != api.TransferReady:
		return nil, api.Errorf(api.CodeFailedPrecondition, "transfer %s is %s: an import needs it READY (kibo transfer get %s)", id, tr.State, id)
	case err == nil:
		return &importManifest{key: tr.ArchiveKey(), TransferManifest: api.TransferManifest{TransferID: id, WorkspaceID: tr.WorkspaceID, Shape: tr.Shape, Env: env, Digest: tr.Digest, SizeBytes: tr.SizeBytes}}, nil
	case api.CodeOf(err) != api.CodeNotFound:
		return nil, err
	}
	if ns == "" {
		ns = api.DefaultTransferNamespace
	}
	if err := api.ValidTransferNamespace(ns); err != nil {
		return nil, err
	}
	st, err := s.needStore("transfer import of " + id)
	if err != nil {
		return nil, err
	}
	key := api.TransferManifestKey(ns, id)
	rc, err := st.OpenNamed(ctx, key, 0)
	if api.CodeOf(err) == api.CodeNotFound {
		return nil, api.Errorf(api.CodeNotFound, "transfer %s is neither in this cluster nor in namespace %s of the artifact store %s: check the id and --namespace", id, ns, st)
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, api.MaxTransferManifest))
	if err != nil {
		return nil, api.Errorf(api.CodeUnavailable, "transfer %s: read its manifest %s: %v", id, key, err)
	}
	var m api.TransferManifest
	if err := json.Unmarshal(raw, &m); err != nil || !api.ReadsTransferFormat(m.FormatVersion) || m.TransferID != id {
		return nil, api.Errorf(api.CodeFailedPrecondition, "transfer %s: its manifest %s in %s is not one this build reads (format %d): export it again", id, key, st, m.FormatVersion)
	}
	if err := m.Shape.Check("transfer " + id); err != nil {
		return nil, err
	}
	return &importManifest{key: api.TransferArchiveKey(ns, id), TransferManifest: m}, nil
}

// templateAvailable refuses an import into a cluster that has neither
// published nor built the Transfer's template, naming it.
func templateAvailable(tx *bolt.Tx, id string, shape api.TransferShape) error {
	if pub, err := fsm.TaskTemplate(tx, shape.Template); err != nil || pub != nil {
		if pub != nil && shape.TemplateID != "" && pub.TemplateID != shape.TemplateID {
			return api.Errorf(api.CodeFailedPrecondition, "transfer %s was exported over build %s of template %s, and this cluster's catalog has build %s: publish the build it was made with", id, shape.TemplateID, shape.Template, pub.TemplateID)
		}
		return err
	}
	nodes, err := fsm.ListNodes(tx, 0, "")
	if err != nil {
		return err
	}
	for i := range nodes.Nodes {
		if placement.HasTemplate(&nodes.Nodes[i], shape.Template) {
			return nil
		}
	}
	return api.Errorf(api.CodeFailedPrecondition, "transfer %s needs template %s (build %s), which this cluster lacks: build or publish it here first", id, shape.Template, shape.TemplateID)
}

// handleNodeTransferExport is POST /v1/internal/transfers/export on the
// node.
func (s *Server) handleNodeTransferExport(r *http.Request, t api.TransferExportTask) response {
	if err := api.ValidTransferID(t.TransferID); err != nil {
		return fail(err)
	}
	e := s.own().Transfers
	if e == nil {
		return fail(api.Errorf(api.CodeFailedPrecondition, "member %s runs no node runtime: it holds no Workspaces to export", s.id.NodeID))
	}
	res, err := e.ExportTransfer(r.Context(), t)
	if err != nil {
		return fail(err)
	}
	return answer(res)
}

// handleNodeTransferProgress is GET /v1/internal/transfers/{name}/progress
// on the node.
func (s *Server) handleNodeTransferProgress(r *http.Request) response {
	p, err := s.localProgress(r.PathValue("name"))
	if err != nil {
		return fail(err)
	}
	return answer(p)
}

func (s *Server) localProgress(id string) (api.TransferProgress, error) {
	if err := api.ValidTransferID(id); err != nil {
		return api.TransferProgress{}, err
	}
	if e := s.own().Transfers; e != nil {
		if p, ok := e.ExportProgress(id); ok {
			return p, nil
		}
	}
	return api.TransferProgress{}, api.Errorf(api.CodeNotFound, "transfer %s is not being exported on member %s", id, s.id.NodeID)
}
