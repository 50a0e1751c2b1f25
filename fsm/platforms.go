package fsm

import (
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// The Platform catalog: Platforms a node built and published to the
// artifact store, by id. An operator approves a Platform; the most recently
// approved one of each kernel series is that series' default (upgrade
// seed: "one default per kernel series", which cannot be withdrawn). A
// start carries the defaults (TaskPlatforms) and the node runs the first
// it can drive; the start's answer records the Platform on the Workspace,
// so a Platform a running Workspace uses cannot be withdrawn either.
//
// The catalog ops are of LevelArtifacts, with the template catalog.

// PlatformPublishArgs records a Platform the node NodeID put into the
// artifact store.
type PlatformPublishArgs struct {
	api.PlatformImage
	NodeID string `json:"node_id"`
}

// platformRecord is a catalog entry as stored.
type platformRecord struct {
	api.PlatformImage
	PublishedBy string     `json:"published_by"`
	PublishedAt time.Time  `json:"published_at"`
	ApprovedAt  *time.Time `json:"approved_at,omitempty"`
	// ApprovalSeq orders approvals (one more than the highest so far):
	// the highest of a series is its default. 0: not approved.
	ApprovalSeq uint64 `json:"approval_seq,omitempty"`
	Version     uint64 `json:"version"`
}

// CheckPlatformPublish validates a publish as the FSM will.
func CheckPlatformPublish(a PlatformPublishArgs) error {
	if err := ValidNodeID(a.NodeID); err != nil {
		return err
	}
	return a.PlatformImage.Check()
}

func applyPlatformPublish(ac *applyCtx) (any, error) {
	var a PlatformPublishArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckPlatformPublish(a); err != nil {
		return nil, err
	}
	if _, err := mustNode(ac.tx, a.NodeID); err != nil {
		return nil, err
	}
	old, err := getRecord[platformRecord](ac.tx, bucketPlatforms, []byte(a.PlatformID))
	if err != nil {
		return nil, err
	}
	if old != nil {
		// The id is the content's digest: publishing it again (say after
		// the store lost the archive) keeps its approval.
		if err := checkVersion(ac.e, old.Version, "platform "+a.PlatformID); err != nil {
			return nil, err
		}
		if old.PlatformImage == a.PlatformImage {
			return platformView(ac.tx, old)
		}
		old.PlatformImage = a.PlatformImage
		old.Version++
		return platformView(ac.tx, old, putJSON(ac.tx, bucketPlatforms, []byte(a.PlatformID), old))
	}
	if countAtMost(ac.tx, bucketPlatforms, api.MaxCatalogPlatforms) >= api.MaxCatalogPlatforms {
		return nil, api.Errorf(api.CodeResourceExhausted, "platform %s: the catalog keeps at most %d Platforms: withdraw old ones first (kibo platform withdraw ID)", a.PlatformID, api.MaxCatalogPlatforms)
	}
	rec := &platformRecord{PlatformImage: a.PlatformImage, PublishedBy: a.NodeID, PublishedAt: *at(ac.e), Version: 1}
	return platformView(ac.tx, rec, putJSON(ac.tx, bucketPlatforms, []byte(a.PlatformID), rec))
}

// applyPlatformApprove approves a published Platform, which makes it the
// default of its kernel series.
func applyPlatformApprove(ac *applyCtx) (any, error) {
	rec, err := platformFor(ac)
	if err != nil {
		return nil, err
	}
	all, err := platformRecords(ac.tx)
	if err != nil {
		return nil, err
	}
	var top uint64
	for _, p := range all {
		top = max(top, p.ApprovalSeq)
	}
	if rec.ApprovalSeq == top && rec.ApprovalSeq != 0 {
		return platformView(ac.tx, rec) // already the latest approval
	}
	rec.ApprovalSeq = top + 1
	rec.ApprovedAt = at(ac.e)
	rec.Version++
	return platformView(ac.tx, rec, putJSON(ac.tx, bucketPlatforms, []byte(rec.PlatformID), rec))
}

// applyPlatformWithdraw removes a catalog entry that is neither the
// default of its series nor used by a Workspace's Instance. The archive
// stays in the artifact store and the installations on the nodes.
func applyPlatformWithdraw(ac *applyCtx) (any, error) {
	rec, err := platformFor(ac)
	if err != nil {
		return nil, err
	}
	defaults, err := platformDefaults(ac.tx)
	if err != nil {
		return nil, err
	}
	if defaults[rec.KernelSeries] == rec.PlatformID {
		return nil, api.Errorf(api.CodeFailedPrecondition, "platform %s is the default of kernel series %s and cannot be withdrawn: approve another Platform of the series first (kibo platform approve ID)", rec.PlatformID, rec.KernelSeries)
	}
	users, err := platformUsers(ac.tx, rec.PlatformID)
	if err != nil {
		return nil, err
	}
	if err := inUse("platform", rec.PlatformID, users, "stop them first (kibo workspace stop ID); their next start uses a default Platform"); err != nil {
		return nil, err
	}
	view, err := platformView(ac.tx, rec)
	if err != nil {
		return nil, err
	}
	return view, ac.tx.Bucket(bucketPlatforms).Delete([]byte(rec.PlatformID))
}

// platformFor is the entry an approve or withdraw names, at the version
// the entry expects.
func platformFor(ac *applyCtx) (*platformRecord, error) {
	var a ObjectArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := api.ValidPlatformID(a.Name); err != nil {
		return nil, err
	}
	rec, err := mustPlatform(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	return rec, checkVersion(ac.e, rec.Version, "platform "+a.Name)
}

func mustPlatform(tx *bolt.Tx, id string) (*platformRecord, error) {
	rec, err := getRecord[platformRecord](tx, bucketPlatforms, []byte(id))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeNotFound, "platform %s is not in the catalog: see kibo platform list, or publish it with kibo platform publish --from-node NODE", id)
	}
	return rec, nil
}

// platformUsers are the Workspaces whose Instance runs (or whose snapshot
// was saved on) Platform id, by id. A stopped Workspace starts again on a
// default, so it does not hold one.
func platformUsers(tx *bolt.Tx, id string) ([]string, error) {
	var out []string
	err := tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		var w struct {
			State    string `json:"state"`
			Platform string `json:"platform"`
		}
		if err := jsonRecord(bucketWorkspaces, k, v, &w); err != nil {
			return err
		}
		if w.Platform == id && w.State != api.WorkspaceStopped && w.State != api.WorkspaceCreating {
			out = append(out, string(k))
		}
		return nil
	})
	return out, err
}

// platformRecords is the whole catalog, by id (it is bounded).
func platformRecords(tx *bolt.Tx) ([]*platformRecord, error) {
	var out []*platformRecord
	err := tx.Bucket(bucketPlatforms).ForEach(func(k, v []byte) error {
		var rec platformRecord
		if err := jsonRecord(bucketPlatforms, k, v, &rec); err != nil {
			return err
		}
		out = append(out, &rec)
		return nil
	})
	return out, err
}

// platformDefaults maps each kernel series with an approved Platform to
// its default.
func platformDefaults(tx *bolt.Tx) (map[string]string, error) {
	all, err := platformRecords(tx)
	if err != nil {
		return nil, err
	}
	out, seq := map[string]string{}, map[string]uint64{}
	for _, p := range all {
		if p.ApprovalSeq > seq[p.KernelSeries] {
			out[p.KernelSeries], seq[p.KernelSeries] = p.PlatformID, p.ApprovalSeq
		}
	}
	return out, nil
}

func platformView(tx *bolt.Tx, rec *platformRecord, errs ...error) (*api.CatalogPlatform, error) {
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	defaults, err := platformDefaults(tx)
	if err != nil {
		return nil, err
	}
	v := rec.view(defaults)
	return &v, nil
}

func (r *platformRecord) view(defaults map[string]string) api.CatalogPlatform {
	return api.CatalogPlatform{PlatformImage: r.PlatformImage, PublishedBy: r.PublishedBy, PublishedAt: r.PublishedAt,
		Approved: r.ApprovalSeq > 0, ApprovedAt: r.ApprovedAt, Default: defaults[r.KernelSeries] == r.PlatformID, Version: r.Version}
}

// ListCatalogPlatforms is the Platform catalog, by id.
func ListCatalogPlatforms(tx *bolt.Tx) (*api.CatalogPlatformList, error) {
	all, err := platformRecords(tx)
	if err != nil {
		return nil, err
	}
	defaults, err := platformDefaults(tx)
	if err != nil {
		return nil, err
	}
	out := &api.CatalogPlatformList{Platforms: make([]api.CatalogPlatform, 0, len(all))}
	for _, p := range all {
		out.Platforms = append(out.Platforms, p.view(defaults))
	}
	return out, nil
}

// GetCatalogPlatform is one catalog entry.
func GetCatalogPlatform(tx *bolt.Tx, id string) (*api.CatalogPlatform, error) {
	if err := api.ValidPlatformID(id); err != nil {
		return nil, err
	}
	rec, err := mustPlatform(tx, id)
	if err != nil {
		return nil, err
	}
	return platformView(tx, rec)
}

// TaskPlatforms are the Platforms a start of Workspace w may run on, in
// the order the node tries them: the default of the series w last ran,
// then the other defaults, most recently approved first. Empty when no
// Platform is approved: nodes then start on their own builds.
func TaskPlatforms(tx *bolt.Tx, w *api.Workspace) ([]api.PlatformImage, error) {
	all, err := platformRecords(tx)
	if err != nil {
		return nil, err
	}
	defaults, err := platformDefaults(tx)
	if err != nil {
		return nil, err
	}
	lastSeries := ""
	var defs []*platformRecord
	for _, p := range all {
		if p.PlatformID == w.Platform {
			lastSeries = p.KernelSeries
		}
		if defaults[p.KernelSeries] == p.PlatformID {
			defs = append(defs, p)
		}
	}
	sort.Slice(defs, func(i, j int) bool {
		if a, b := defs[i].KernelSeries == lastSeries, defs[j].KernelSeries == lastSeries; a != b {
			return a
		}
		return defs[i].ApprovalSeq > defs[j].ApprovalSeq
	})
	out := make([]api.PlatformImage, len(defs))
	for i, p := range defs {
		out[i] = p.PlatformImage
	}
	return out, nil
}

// CatalogDigests maps every artifact-store object the catalog references
// to what references it ("template NAME", "platform ID"): what a collector
// of the store must keep.
func CatalogDigests(tx *bolt.Tx) (map[string]string, error) {
	out := map[string]string{}
	err := tx.Bucket(bucketTemplates).ForEach(func(k, v []byte) error {
		var rec catalogRecord
		if err := jsonRecord(bucketTemplates, k, v, &rec); err != nil {
			return err
		}
		out[rec.Digest] = "template " + rec.Name
		return nil
	})
	if err != nil {
		return nil, err
	}
	all, err := platformRecords(tx)
	if err != nil {
		return nil, err
	}
	for _, p := range all {
		out[p.Digest] = "platform " + p.PlatformID
	}
	return out, nil
}
