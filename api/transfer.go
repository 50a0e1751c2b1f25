package api

import (
	"fmt"
	"regexp"
	"time"
)

// Transfers: a stopped Workspace's retained writable layer, Volumes and
// shape written as one archive into the artifact store, under
// kibotos-transfer/v1/<namespace>/<transfer>.tar (with a manifest beside
// it, <transfer>.json), from which `transfer import` makes a new Workspace
// in this or another cluster that reaches the store. An export is how a
// node is emptied without losing a Workspace (node-operations seed,
// drain).

// Transfer states.
const (
	TransferExporting = "EXPORTING"
	TransferReady     = "READY"
	TransferFailed    = "FAILED"
)

// TransferKeyPrefix is where archives live in the store, by namespace.
const TransferKeyPrefix = "kibotos-transfer/v1/"

// DefaultTransferNamespace is the namespace when none is given.
const DefaultTransferNamespace = "default"

// DefaultTransferTTL is how long a Transfer is kept before ctrl removes
// it and its archive; MaxTransferTTL bounds --ttl.
const (
	DefaultTransferTTL = 7 * 24 * time.Hour
	MaxTransferTTL     = 90 * 24 * time.Hour
)

// MaxTransfers bounds the Transfers a cluster keeps.
const MaxTransfers = 4096

// TransferFormat is the archive's format version (transfer.json).
const TransferFormat = 1

// TransferFormatEnv is the format of a manifest with Env: a build that
// does not know Env refuses it (it reads only TransferFormat) instead of
// importing the Workspace without its environment. A manifest without
// Env stays TransferFormat, which every build reads.
const TransferFormatEnv = 2

// MaxTransferManifest bounds what is read of a manifest: room for a
// Workspace's environment (MaxWorkspaceEnvBytes, up to six times that
// escaped in JSON) beside its shape.
const MaxTransferManifest = 1 << 20

// TransferFormatFor is the format of a manifest with env.
func TransferFormatFor(env []string) int {
	if len(env) > 0 {
		return TransferFormatEnv
	}
	return TransferFormat
}

// ReadsTransferFormat says whether this build imports a manifest of
// format f.
func ReadsTransferFormat(f int) bool { return f == TransferFormat || f == TransferFormatEnv }

var (
	transferIDPattern = regexp.MustCompile(`^tr-[a-z2-7]{26}$`)
	namespacePattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
)

var workspaceIDPattern = regexp.MustCompile(`^ws-[a-z2-7]{26}$`)

// IsWorkspaceID says whether s is a Workspace id (ws- and 26 base32
// letters), before it names a file.
func IsWorkspaceID(s string) bool { return workspaceIDPattern.MatchString(s) }

// ValidTransferID checks a Transfer id (tr- and 26 base32 letters).
func ValidTransferID(id string) error {
	if !transferIDPattern.MatchString(id) {
		return Errorf(CodeInvalidArgument, "transfer %.80q is not a Transfer id (tr- and 26 letters and digits): see kibo transfer list", id)
	}
	return nil
}

// ValidTransferNamespace checks a namespace of the store's transfer area.
func ValidTransferNamespace(ns string) error {
	if !namespacePattern.MatchString(ns) {
		return Errorf(CodeInvalidArgument, "transfer namespace %.80q is not valid: use 1-63 lower-case letters, digits and '-'", ns)
	}
	return nil
}

// TransferArchiveKey and TransferManifestKey are a Transfer's objects.
func TransferArchiveKey(ns, id string) string  { return TransferKeyPrefix + ns + "/" + id + ".tar" }
func TransferManifestKey(ns, id string) string { return TransferKeyPrefix + ns + "/" + id + ".json" }

// TransferVolume is one Volume of an exported Workspace.
type TransferVolume struct {
	Path      string `json:"path"`
	SizeBytes uint64 `json:"size_bytes"`
}

// TransferShape is what an import needs to make the Workspace again: its
// template (by name and build) and resources, and its Volumes.
type TransferShape struct {
	Template string `json:"template"`
	// TemplateID is the build the layer was written over; the importing
	// node must boot the same build (published templates keep their
	// publisher's id on every node).
	TemplateID  string            `json:"template_id,omitempty"`
	CPU         Milli             `json:"cpu"`
	MemoryBytes uint64            `json:"memory_bytes"`
	Labels      map[string]string `json:"labels,omitempty"`
	Volumes     []TransferVolume  `json:"volumes,omitempty"`
}

// Check bounds a shape read from the store or a node.
func (s *TransferShape) Check(what string) error {
	if err := ValidTemplateName(s.Template); err != nil {
		return Errorf(CodeInvalidArgument, "%s: %s", what, err.(*Error).Message)
	}
	if s.TemplateID != "" && !ValidTemplateID(s.TemplateID) {
		return Errorf(CodeInvalidArgument, "%s: template build %.80q is not sha256- and 64 hex digits", what, s.TemplateID)
	}
	if s.CPU <= 0 || s.MemoryBytes == 0 || len(s.Labels) > 64 || len(s.Volumes) > 16 {
		return Errorf(CodeInvalidArgument, "%s: cpu, memory, labels or volumes out of range", what)
	}
	for i, v := range s.Volumes {
		if err := ValidMountPath(v.Path); err != nil {
			return Errorf(CodeInvalidArgument, "%s: volume %d: %v", what, i, err)
		}
		if err := ValidVolumeSize(fmt.Sprintf("%s: volume %d", what, i), v.SizeBytes); err != nil {
			return err
		}
	}
	return nil
}

// TransferManifest is <transfer>.json in the store, written by the
// exporting node once the archive is complete: what another cluster
// reads to import it.
type TransferManifest struct {
	FormatVersion int           `json:"format_version"`
	TransferID    string        `json:"transfer_id"`
	WorkspaceID   string        `json:"workspace_id"`
	Shape         TransferShape `json:"shape"`
	// Env is the Workspace's environment (TransferFormatEnv), which an
	// import gives the new Workspace. It is in the store with the
	// Workspace's disks, never in a Transfer as the API shows it.
	Env []string `json:"env,omitempty"`
	// Digest and SizeBytes are the archive's.
	Digest     string    `json:"digest"`
	SizeBytes  int64     `json:"size_bytes"`
	ExportedAt time.Time `json:"exported_at"`
}

// Transfer is one export.
type Transfer struct {
	TransferID  string        `json:"transfer_id"`
	Version     uint64        `json:"version"`
	State       string        `json:"state"`
	Namespace   string        `json:"namespace"`
	WorkspaceID string        `json:"workspace_id"`
	NodeID      string        `json:"node_id"`
	Shape       TransferShape `json:"shape"`
	// Digest and SizeBytes are the archive's, once READY.
	Digest    string `json:"digest,omitempty"`
	SizeBytes int64  `json:"size_bytes,omitempty"`
	// DoneBytes of TotalBytes are written while EXPORTING, as the node
	// last said (every few seconds).
	DoneBytes  int64     `json:"done_bytes,omitempty"`
	TotalBytes int64     `json:"total_bytes,omitempty"`
	Error      string    `json:"error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// ArchiveKey is the key of the Transfer's archive.
func (t *Transfer) ArchiveKey() string { return TransferArchiveKey(t.Namespace, t.TransferID) }

// TransferList is the Transfers, by id.
type TransferList struct {
	Transfers     []Transfer `json:"transfers"`
	NextPageToken string     `json:"next_page_token,omitempty"`
}

// TransferExportRequest is `transfer export`.
type TransferExportRequest struct {
	WriteMeta
	WorkspaceID string `json:"workspace_id"`
	Namespace   string `json:"namespace,omitempty"`
	// TTLSeconds: 0 is DefaultTransferTTL.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// TransferImportRequest is `transfer import`.
type TransferImportRequest struct {
	WriteMeta
	// Namespace finds a Transfer another cluster exported (its manifest
	// in the store) when this cluster has no record of it.
	Namespace string `json:"namespace,omitempty"`
	NodeID    string `json:"node_id,omitempty"`
}

// WorkspaceImport is the archive a Workspace's first start unpacks
// instead of starting with an empty layer and empty Volumes.
type WorkspaceImport struct {
	TransferID string `json:"transfer_id"`
	Key        string `json:"key"`
	Digest     string `json:"digest"`
	SizeBytes  int64  `json:"size_bytes"`
	TemplateID string `json:"template_id,omitempty"`
}

// Check bounds an import.
func (i *WorkspaceImport) Check() error {
	if err := ValidTransferID(i.TransferID); err != nil {
		return err
	}
	if !ValidImageDigest(i.Digest) || i.SizeBytes <= 0 || len(i.Key) > 512 {
		return Errorf(CodeInvalidArgument, "import of transfer %s: archive digest, size or key out of range", i.TransferID)
	}
	if i.TemplateID != "" && !ValidTemplateID(i.TemplateID) {
		return Errorf(CodeInvalidArgument, "import of transfer %s: template build %.80q is not sha256- and 64 hex digits", i.TransferID, i.TemplateID)
	}
	return nil
}

// TransferExportTask is what ctrl asks the exporting node to do.
type TransferExportTask struct {
	TransferID  string `json:"transfer_id"`
	WorkspaceID string `json:"workspace_id"`
	Namespace   string `json:"namespace"`
	LayerPool   string `json:"layer_pool"`
	// Volumes are the Workspace's, in mount order, with their pools.
	Volumes []TaskVolume  `json:"volumes,omitempty"`
	Shape   TransferShape `json:"shape"`
	// Env is the Workspace's environment, for the manifest. Secret:
	// never logged.
	Env []string `json:"env,omitempty"`
}

// TransferProgress is how far a node's export is.
type TransferProgress struct {
	DoneBytes  int64 `json:"done_bytes"`
	TotalBytes int64 `json:"total_bytes"`
}

// TransferExportResult is the node's answer.
type TransferExportResult struct {
	Digest     string `json:"digest"`
	SizeBytes  int64  `json:"size_bytes"`
	TemplateID string `json:"template_id"`
}
