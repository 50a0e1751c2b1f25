package fsm

import (
	"maps"
	"slices"
	"time"

	json "github.com/segmentio/encoding/json"
	bolt "go.etcd.io/bbolt"

	"github.com/kibotos/kibotos/api"
)

// The template catalog: templates a node built and published to the
// artifact store, by name. The entry records what was published (the
// image's digest and size) and who published it when; which nodes hold a
// verified copy is read from their latest reports (TemplateDigests).

// LevelArtifacts is the level of OpTemplatePublish, OpTemplateDelete and of
// Report.TemplateDigests (which the leader leaves out of reports below it).
const LevelArtifacts = 5

// TemplatePublishArgs records a template the node NodeID put into the
// artifact store.
type TemplatePublishArgs struct {
	api.TemplateImage
	NodeID string `json:"node_id"`
}

// maxImageBytes bounds a published image (artifacts.MaxObjectBytes).
const maxImageBytes = 1 << 40

// catalogRecord is a catalog entry as stored.
type catalogRecord struct {
	api.TemplateImage
	PublishedBy string    `json:"published_by"`
	PublishedAt time.Time `json:"published_at"`
	Version     uint64    `json:"version"`
}

// CheckTemplatePublish validates a publish as the FSM will.
func CheckTemplatePublish(a TemplatePublishArgs) error {
	if err := api.ValidTemplateName(a.Name); err != nil {
		return err
	}
	if err := ValidNodeID(a.NodeID); err != nil {
		return err
	}
	switch {
	case !api.ValidTemplateID(a.TemplateID):
		return api.Errorf(api.CodeInvalidArgument, "template %s: build id %.80q is not sha256- and 64 hex digits", a.Name, a.TemplateID)
	case !api.ValidImageDigest(a.Digest):
		return api.Errorf(api.CodeInvalidArgument, "template %s: image digest %.80q is not sha256: and 64 hex digits", a.Name, a.Digest)
	case a.SizeBytes <= 0 || a.SizeBytes > maxImageBytes:
		return api.Errorf(api.CodeInvalidArgument, "template %s: image size %d is out of range (1 byte to 1 TiB)", a.Name, a.SizeBytes)
	case a.ImageFormat != api.ImageFormatExt4:
		return api.Errorf(api.CodeInvalidArgument, "template %s: image format %.20q is not %s", a.Name, a.ImageFormat, api.ImageFormatExt4)
	}
	return nil
}

func applyTemplatePublish(ac *applyCtx) (any, error) {
	var a TemplatePublishArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	if err := CheckTemplatePublish(a); err != nil {
		return nil, err
	}
	if _, err := mustNode(ac.tx, a.NodeID); err != nil {
		return nil, err
	}
	old, err := getRecord[catalogRecord](ac.tx, bucketTemplates, []byte(a.Name))
	if err != nil {
		return nil, err
	}
	rec := catalogRecord{TemplateImage: a.TemplateImage, PublishedBy: a.NodeID, PublishedAt: *at(ac.e), Version: 1}
	if old != nil {
		if err := checkVersion(ac.e, old.Version, "template "+a.Name); err != nil {
			return nil, err
		}
		if old.Digest == a.Digest {
			return catalogView(ac.tx, old)
		}
		rec.Version = old.Version + 1
	} else if countAtMost(ac.tx, bucketTemplates, api.MaxCatalogTemplates) >= api.MaxCatalogTemplates {
		return nil, api.Errorf(api.CodeResourceExhausted, "template %s: the catalog keeps at most %d templates", a.Name, api.MaxCatalogTemplates)
	}
	if err := putJSON(ac.tx, bucketTemplates, []byte(a.Name), rec); err != nil {
		return nil, err
	}
	return catalogView(ac.tx, &rec)
}

// applyTemplateDelete removes a catalog entry no Workspace references (a
// Workspace's next start on a node without the template would need it).
// The image stays in the artifact store and on the nodes that hold it.
func applyTemplateDelete(ac *applyCtx) (any, error) {
	var a ObjectArgs
	if err := decodeArgs(ac.e, &a); err != nil {
		return nil, err
	}
	out, err := GetCatalogTemplate(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := checkVersion(ac.e, out.Version, "template "+a.Name); err != nil {
		return nil, err
	}
	users, err := templateUsers(ac.tx, a.Name)
	if err != nil {
		return nil, err
	}
	if err := inUse("template", a.Name, users, "delete them first (kibo workspace delete ID)"); err != nil {
		return nil, err
	}
	return out, ac.tx.Bucket(bucketTemplates).Delete([]byte(a.Name))
}

// templateUsers are the Workspaces of template name, by id.
func templateUsers(tx *bolt.Tx, name string) ([]string, error) {
	var out []string
	err := tx.Bucket(bucketWorkspaces).ForEach(func(k, v []byte) error {
		var w struct {
			Template string `json:"template"`
		}
		if err := jsonRecord(bucketWorkspaces, k, v, &w); err != nil {
			return err
		}
		if w.Template == name {
			out = append(out, string(k))
		}
		return nil
	})
	return out, err
}

// GetCatalogTemplate is one catalog entry.
func GetCatalogTemplate(tx *bolt.Tx, name string) (*api.CatalogTemplate, error) {
	if err := api.ValidTemplateName(name); err != nil {
		return nil, err
	}
	rec, err := getRecord[catalogRecord](tx, bucketTemplates, []byte(name))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, api.Errorf(api.CodeNotFound, "template %s is not in the catalog: publish it with kibo template publish %s", name, name)
	}
	return catalogView(tx, rec)
}

// TaskTemplate is the catalog entry of the template a start names, nil
// when it was never published.
func TaskTemplate(tx *bolt.Tx, name string) (*api.TemplateImage, error) {
	rec, err := getRecord[catalogRecord](tx, bucketTemplates, []byte(name))
	if err != nil || rec == nil {
		return nil, err
	}
	return &rec.TemplateImage, nil
}

// ListCatalogTemplates is a page of the catalog, by name.
func ListCatalogTemplates(tx *bolt.Tx, pageSize int, pageToken string) (*api.CatalogTemplateList, error) {
	out := &api.CatalogTemplateList{Templates: []api.CatalogTemplate{}}
	holders, built, err := reportedTemplates(tx)
	if err != nil {
		return nil, err
	}
	err = pageOf(tx, bucketTemplates, pageSize, pageToken, func(k, v []byte) error {
		var rec catalogRecord
		if err := jsonRecord(bucketTemplates, k, v, &rec); err != nil {
			return err
		}
		out.Templates = append(out.Templates, rec.view(holders[rec.Digest]))
		return nil
	}, &out.NextPageToken)
	if err != nil || out.NextPageToken != "" {
		return out, err
	}
	// A newcomer's first look (kibotos dev builds its templates on the
	// node and publishes none) must find what placement can use.
	b := tx.Bucket(bucketTemplates)
	for _, name := range slices.Sorted(maps.Keys(built)) {
		if b.Get([]byte(name)) == nil {
			out.NodeTemplates = append(out.NodeTemplates, api.NodeTemplate{Name: name, Nodes: built[name]})
		}
	}
	return out, nil
}

func catalogView(tx *bolt.Tx, rec *catalogRecord) (*api.CatalogTemplate, error) {
	holders, err := digestHolders(tx)
	if err != nil {
		return nil, err
	}
	v := rec.view(holders[rec.Digest])
	return &v, nil
}

func (r *catalogRecord) view(nodes []string) api.CatalogTemplate {
	if nodes == nil {
		nodes = []string{}
	}
	return api.CatalogTemplate{TemplateImage: r.TemplateImage, PublishedBy: r.PublishedBy, PublishedAt: r.PublishedAt, Version: r.Version, Nodes: nodes}
}

// digestHolders maps each image digest nodes report holding to those
// nodes, in node id order; retired nodes hold nothing.
func digestHolders(tx *bolt.Tx) (map[string][]string, error) {
	holders, _, err := reportedTemplates(tx)
	return holders, err
}

// reportedTemplates reads the nodes' reports once for what they hold:
// each image digest with its holders, and each template name a node
// built or fetched with the nodes that have it, both in node id order;
// retired nodes hold nothing.
func reportedTemplates(tx *bolt.Tx) (digests, names map[string][]string, err error) {
	digests, names = map[string][]string{}, map[string][]string{}
	err = tx.Bucket(bucketNodes).ForEach(func(k, v []byte) error {
		var n api.Node
		if err := json.Unmarshal(v, &n); err != nil {
			return err
		}
		if n.Retired || n.Report == nil {
			return nil
		}
		for _, d := range n.Report.TemplateDigests {
			if !slices.Contains(digests[d], n.NodeID) {
				digests[d] = append(digests[d], n.NodeID)
			}
		}
		// Names are listed to operators: a report's own list is not
		// checked when it is applied, so only valid names count, and at
		// most as many per node as digests.
		for i, name := range n.Report.Templates {
			if i == api.MaxNodeTemplateDigests {
				break
			}
			if api.ValidTemplateName(name) == nil && !slices.Contains(names[name], n.NodeID) {
				names[name] = append(names[name], n.NodeID)
			}
		}
		return nil
	})
	return digests, names, err
}

// checkReportDigests bounds and checks the digests a report lists.
func checkReportDigests(node string, r *api.Report) error {
	if len(r.TemplateDigests) > api.MaxNodeTemplateDigests {
		return api.Errorf(api.CodeInvalidArgument, "report of node %s lists %d template digests: at most %d", node, len(r.TemplateDigests), api.MaxNodeTemplateDigests)
	}
	for _, d := range r.TemplateDigests {
		if !api.ValidImageDigest(d) {
			return api.Errorf(api.CodeInvalidArgument, "report of node %s: template digest %.80q is not sha256: and 64 hex digits", node, d)
		}
	}
	return api.CheckWarm(node, r.Warm)
}
