package fsm

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// Transfers: an export writes a Workspace's layer, Volumes and shape into
// the artifact store: a STOPPED one's as they are, an AVAILABLE one's
// while its node pauses the guest. The export op records the Transfer
// (EXPORTING) and marks the Workspace, which then neither starts, stops
// (but for --force), pauses nor is deleted until the exporting node's
// answer (the result op) makes the
// Transfer READY or FAILED. ctrl drives the node and removes archives; the
// FSM only records. An import is a Workspace create with an Import: its
// first start unpacks the archive (workspaces.go).
//
// The Transfer ops are of LevelArtifacts.

// TransferExportArgs starts an export.
type TransferExportArgs struct {
	WorkspaceID string `json:"workspace_id"`
	Namespace   string `json:"namespace"`
	TTLSeconds  int64  `json:"ttl_seconds,omitempty"`
}

// TransferResultArgs is the exporting node's answer, relayed by ctrl.
type TransferResultArgs struct {
	TransferID string `json:"transfer_id"`
	NodeID     string `json:"node_id"`
	Outcome    string `json:"outcome"` // ok, failed
	Digest     string `json:"digest,omitempty"`
	SizeBytes  int64  `json:"size_bytes,omitempty"`
	TemplateID string `json:"template_id,omitempty"`
	Error      string `json:"error,omitempty"`
}

// transferRecord is a Transfer as stored, with what ctrl's export task
// needs.
type transferRecord struct {
	api.Transfer
	LayerPool string           `json:"layer_pool"`
	Volumes   []api.TaskVolume `json:"task_volumes,omitempty"`
	// Env is the Workspace's environment as of the export, for the
	// manifest and an import in this cluster; kept out of api.Transfer,
	// which reads show (workspaceenv.go).
	Env []string `json:"env,omitempty"`
}

// TransferIDFor derives the id of the Transfer an export with this
// command id makes.
func TransferIDFor(commandID string) string { return "tr-" + hashID("transfer\x00"+commandID) }

func applyTransferExport(ac *applyCtx) (any, error) {
	var a TransferExportArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if ac.e.CommandID == "" {
		return nil, api.Errorf(api.CodeInvalidArgument, "transfer export needs a command id (the Transfer id is derived from it)")
	}
	if err := api.ValidTransferNamespace(a.Namespace); err != nil {
		return nil, err
	}
	ttl := api.DefaultTransferTTL
	if a.TTLSeconds != 0 {
		ttl = time.Duration(a.TTLSeconds) * time.Second
	}
	if ttl < time.Minute || ttl > api.MaxTransferTTL {
		return nil, api.Errorf(api.CodeInvalidArgument, "transfer ttl %s is out of range: give 1m to %s", ttl, api.MaxTransferTTL)
	}
	id := TransferIDFor(ac.e.CommandID)
	if old, err := getRecord[transferRecord](ac.tx, bucketTransfers, []byte(id)); err != nil {
		return nil, err
	} else if old != nil {
		return nil, api.Errorf(api.CodeAlreadyExists, "transfer %s already exists: use a new --command-id", id)
	}
	w, err := mustWorkspace(ac.tx, a.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, w.Version, "workspace "+w.WorkspaceID); err != nil {
		return nil, err
	}
	node := ""
	switch {
	case w.Exporting != "":
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is being exported already (transfer %s): wait for it (kibo transfer get %s)", w.WorkspaceID, w.Exporting, w.Exporting)
	case w.State == api.WorkspaceAvailable && w.Pending == nil && w.InstanceID != "":
		// Its node pauses the guest while it copies the disks.
		node = w.NodeID
	case w.State != api.WorkspaceStopped:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s is %s: export needs it STOPPED, or AVAILABLE with no command in flight; wait for it or stop it (kibo workspace stop %s)", w.WorkspaceID, w.State, w.WorkspaceID)
	case w.Layer == nil:
		return nil, api.Errorf(api.CodeFailedPrecondition, "workspace %s has never run: it has no layer to export; create a new Workspace from its template instead", w.WorkspaceID)
	case w.Layer.Lost:
		return nil, lostLayerError(w)
	default:
		node = w.Layer.NodeID
	}
	if countAtMost(ac.tx, bucketTransfers, api.MaxTransfers) >= api.MaxTransfers {
		return nil, api.Errorf(api.CodeResourceExhausted, "transfer of workspace %s: the cluster keeps at most %d Transfers: delete old ones first (kibo transfer delete ID)", w.WorkspaceID, api.MaxTransfers)
	}
	vols, err := TaskVolumes(ac.tx, w)
	if err != nil {
		return nil, err
	}
	env, err := TaskEnv(ac.tx, w.WorkspaceID)
	if err != nil {
		return nil, err
	}
	now := *at(ac.e)
	rec := &transferRecord{LayerPool: w.Layer.PoolID, Volumes: vols, Env: env, Transfer: api.Transfer{TransferID: id, Version: 1, State: api.TransferExporting,
		Namespace: a.Namespace, WorkspaceID: w.WorkspaceID, NodeID: node, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
		Shape: api.TransferShape{Template: w.Template, CPU: w.CPU, MemoryBytes: w.MemoryBytes, Labels: w.Labels}}}
	for _, v := range vols {
		rec.Shape.Volumes = append(rec.Shape.Volumes, api.TransferVolume{Path: v.Path, SizeBytes: v.SizeBytes})
	}
	old := cloneWorkspace(w)
	w.Exporting = id
	if err := putWorkspace(ac, old, w); err != nil {
		return nil, err
	}
	return &rec.Transfer, putJSON(ac.tx, bucketTransfers, []byte(id), rec)
}

func applyTransferResult(ac *applyCtx) (any, error) {
	var a TransferResultArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidTransferID(a.TransferID); err != nil {
		return nil, err
	}
	rec, err := mustTransfer(ac.tx, a.TransferID)
	if err != nil {
		return nil, err
	}
	if rec.State != api.TransferExporting || rec.NodeID != a.NodeID {
		return &rec.Transfer, nil // a late or repeated answer
	}
	switch a.Outcome {
	case OutcomeOK:
		if !api.ValidImageDigest(a.Digest) || a.SizeBytes <= 0 || a.SizeBytes > maxImageBytes || (a.TemplateID != "" && !api.ValidTemplateID(a.TemplateID)) {
			return nil, api.Errorf(api.CodeInvalidArgument, "transfer %s: the node's archive digest, size or template build is out of range", a.TransferID)
		}
		rec.State, rec.Digest, rec.SizeBytes, rec.Shape.TemplateID = api.TransferReady, a.Digest, a.SizeBytes, a.TemplateID
		rec.DoneBytes, rec.TotalBytes = 0, 0
	case OutcomeFailed:
		rec.State, rec.Error = api.TransferFailed, truncate(a.Error, 1024)
		rec.DoneBytes, rec.TotalBytes = 0, 0
	default:
		return nil, api.Errorf(api.CodeInvalidArgument, "transfer %s: outcome %.20q is not ok or failed", a.TransferID, a.Outcome)
	}
	rec.Version++
	rec.UpdatedAt = *at(ac.e)
	if w, err := getWorkspace(ac.tx, rec.WorkspaceID); err != nil {
		return nil, err
	} else if w != nil && w.Exporting == rec.TransferID {
		old := cloneWorkspace(w)
		w.Exporting = ""
		if err := putWorkspace(ac, old, w); err != nil {
			return nil, err
		}
	}
	return &rec.Transfer, putJSON(ac.tx, bucketTransfers, []byte(rec.TransferID), rec)
}

// TransferProgressArgs is how far the exporting node is, relayed by ctrl.
type TransferProgressArgs struct {
	TransferID string `json:"transfer_id"`
	NodeID     string `json:"node_id"`
	api.TransferProgress
}

// applyTransferProgress records how far an export is; a late report (the
// Transfer ended meanwhile) changes nothing.
func applyTransferProgress(ac *applyCtx) (any, error) {
	var a TransferProgressArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidTransferID(a.TransferID); err != nil {
		return nil, err
	}
	if a.DoneBytes < 0 || a.TotalBytes < 0 || a.DoneBytes > a.TotalBytes || a.TotalBytes > maxImageBytes {
		return nil, api.Errorf(api.CodeInvalidArgument, "transfer %s: progress %d of %d bytes is out of range", a.TransferID, a.DoneBytes, a.TotalBytes)
	}
	rec, err := mustTransfer(ac.tx, a.TransferID)
	if err != nil {
		return nil, err
	}
	if rec.State != api.TransferExporting || rec.NodeID != a.NodeID {
		return &rec.Transfer, nil
	}
	rec.DoneBytes, rec.TotalBytes = a.DoneBytes, a.TotalBytes
	rec.Version++
	rec.UpdatedAt = *at(ac.e)
	return &rec.Transfer, putJSON(ac.tx, bucketTransfers, []byte(rec.TransferID), rec)
}

// applyTransferDelete removes a Transfer whose archive ctrl removed (or
// that never had one). One still exporting is refused: its node writes.
func applyTransferDelete(ac *applyCtx) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidTransferID(a.Name); err != nil {
		return nil, err
	}
	rec, err := mustTransfer(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, rec.Version, "transfer "+a.Name); err != nil {
		return nil, err
	}
	if rec.State == api.TransferExporting {
		return nil, api.Errorf(api.CodeFailedPrecondition, "transfer %s is still EXPORTING on node %s: delete it once it is READY or FAILED", rec.TransferID, rec.NodeID)
	}
	return &rec.Transfer, ac.tx.Bucket(bucketTransfers).Delete([]byte(a.Name))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func mustTransfer(tx *bolt.Tx, id string) (*transferRecord, error) {
	rec, err := getRecord[transferRecord](tx, bucketTransfers, []byte(id))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeNotFound, "transfer %s not found: see kibo transfer list", id)
	}
	return rec, nil
}

// GetTransfer is one Transfer.
func GetTransfer(tx *bolt.Tx, id string) (*api.Transfer, error) {
	if err := api.ValidTransferID(id); err != nil {
		return nil, err
	}
	rec, err := mustTransfer(tx, id)
	if err != nil {
		return nil, err
	}
	return &rec.Transfer, nil
}

// TransferEnv is the environment Transfer id recorded of its Workspace,
// which an import in this cluster gives the new one.
func TransferEnv(tx *bolt.Tx, id string) ([]string, error) {
	rec, err := mustTransfer(tx, id)
	if err != nil {
		return nil, err
	}
	return rec.Env, nil
}

// ListTransfers is a page of the Transfers, by id.
func ListTransfers(tx *bolt.Tx, pageSize int, pageToken string) (*api.TransferList, error) {
	out := &api.TransferList{Transfers: []api.Transfer{}}
	err := pageOf(tx, bucketTransfers, pageSize, pageToken, func(k, v []byte) error {
		var rec transferRecord
		if err := jsonRecord(bucketTransfers, k, v, &rec); err != nil {
			return err
		}
		out.Transfers = append(out.Transfers, rec.Transfer)
		return nil
	}, &out.NextPageToken)
	return out, err
}

// TransferWork is what ctrl acts on: exports to drive (with their task)
// and Transfers past their expiry.
type TransferWork struct {
	Exports []api.TransferExportTask
	// ExportNodes are the nodes of Exports, by transfer id.
	ExportNodes map[string]string
	// Failed Transfers' archives are removed (a node may have written
	// one before it failed); Expired ones go with theirs.
	Failed  []api.Transfer
	Expired []api.Transfer
}

// PendingTransferWork reads TransferWork as of now.
func PendingTransferWork(tx *bolt.Tx, now time.Time) (*TransferWork, error) {
	out := &TransferWork{ExportNodes: map[string]string{}}
	err := tx.Bucket(bucketTransfers).ForEach(func(k, v []byte) error {
		var rec transferRecord
		if err := jsonRecord(bucketTransfers, k, v, &rec); err != nil {
			return err
		}
		switch {
		case rec.State == api.TransferExporting:
			out.Exports = append(out.Exports, api.TransferExportTask{TransferID: rec.TransferID, WorkspaceID: rec.WorkspaceID, Namespace: rec.Namespace,
				LayerPool: rec.LayerPool, Volumes: rec.Volumes, Shape: rec.Shape, Env: rec.Env})
			out.ExportNodes[rec.TransferID] = rec.NodeID
		case now.After(rec.ExpiresAt):
			out.Expired = append(out.Expired, rec.Transfer)
		case rec.State == api.TransferFailed:
			out.Failed = append(out.Failed, rec.Transfer)
		}
		return nil
	})
	return out, err
}
