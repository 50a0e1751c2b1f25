package cluster

import (
	"context"
	"crypto/x509"
	"net/http"

	"github.com/kibotos/kibotos/api"
)

// Local is what a member serves of its own beside the replicated state:
// its metrics and, on a member that runs a node, the node runtime's side
// of the internal routes ctrl calls (nodeSideRoutes). The member's
// composition builds it once the node runtime is up (the runtime dials
// this server, so it cannot be given to Open) and hands it over with
// ServeLocal. A nil field answers as a member without it does: no
// metrics yet, no Instances, nothing to publish or export.
type Local struct {
	Metrics     http.Handler      // GET /metrics
	MachineLogs MachineLogReader  // GET /v1/internal/machine-logs/{instance}
	Templates   TemplatePublisher // POST /v1/internal/templates/{name}/upload
	Platforms   PlatformPublisher // POST /v1/internal/platforms/{name}/upload
	Transfers   TransferExporter  // POST /v1/internal/transfers/export, its progress
	Progress    ProgressFunc      // GET /v1/internal/progress/{key}
	// DataPlaneCert is the data plane's current certificate (leaf), for
	// a CA rotation's status; nil on a member without a data plane.
	DataPlaneCert func() *x509.Certificate
}

// MachineLogReader reads one Instance's machine logs on this node within
// q.MaxBytes each (q.After: the console since that cursor); an
// *api.Error not_found when the node has none.
type MachineLogReader func(instanceID string, q api.MachineLogQuery) (api.MachineLog, error)

// TemplatePublisher uploads this node's build of a template to the
// artifact store (the node runtime; agent.PublishTemplate).
type TemplatePublisher func(ctx context.Context, name string) (api.TemplateImage, error)

// PlatformPublisher uploads one of this node's Platforms (id "own": the
// one new Instances start on when the catalog approves none) to the
// artifact store (the node runtime; agent.PublishPlatform).
type PlatformPublisher func(ctx context.Context, id string) (api.PlatformImage, error)

// TransferExporter writes Workspaces' archives and says how far one in
// progress is (the node runtime, *agent.Agent).
type TransferExporter interface {
	ExportTransfer(ctx context.Context, t api.TransferExportTask) (api.TransferExportResult, error)
	ExportProgress(id string) (api.TransferProgress, bool)
}

// ProgressFunc is how far the transfer under a key is on this node.
type ProgressFunc func(key string) (api.ByteProgress, bool)

// ServeLocal hands this member's own side to its routes; it replaces
// what an earlier call gave.
func (s *Server) ServeLocal(l Local) { s.local.Store(&l) }

// own is what ServeLocal gave (nothing yet: the zero Local).
func (s *Server) own() Local {
	if l := s.local.Load(); l != nil {
		return *l
	}
	return Local{}
}
