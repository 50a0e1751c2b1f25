package api

import "time"

// ArtifactsGCRequest is `artifacts gc`: remove the store's objects no
// catalog entry of this cluster references, once they are older than
// OlderThanSeconds (default a day: a publish in flight has put its
// object but not yet recorded it).
type ArtifactsGCRequest struct {
	DryRun           bool   `json:"dry_run,omitempty"`
	OlderThanSeconds *int64 `json:"older_than_seconds,omitempty"`
}

// DefaultGCAge is how old an unreferenced object must be to be removed
// when the request does not say.
const DefaultGCAge = 24 * time.Hour

// ArtifactsGCResult lists the unreferenced objects and what became of
// each; Referenced counts the objects the catalog keeps.
type ArtifactsGCResult struct {
	Objects      []ArtifactsGCObject `json:"objects"`
	Referenced   int                 `json:"referenced"`
	RemovedBytes int64               `json:"removed_bytes"`
	DryRun       bool                `json:"dry_run"`
}

// The actions of ArtifactsGCObject.
const (
	GCRemoved     = "removed"
	GCWouldRemove = "would remove"
	GCKeptYoung   = "kept: too young"
	GCFailed      = "failed"
)

type ArtifactsGCObject struct {
	Digest    string    `json:"digest"`
	SizeBytes int64     `json:"size_bytes"`
	Modified  time.Time `json:"modified"`
	Action    string    `json:"action"`
	Error     string    `json:"error,omitempty"`
}
